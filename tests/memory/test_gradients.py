"""Checkpointed chunks give the gradients of the plain model (the core contract)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from conftest import random_batch, tiny_model
from distseq.config import MemoryConfig, Recompute
from distseq.data.batch import Batch
from distseq.errors import TrainingError
from distseq.memory import chunked
from distseq.memory.chunked import NOTHING, WHOLE, Hold
from distseq.memory.policy import apply_memory_policy
from distseq.memory.stages import stage_starts
from distseq.model.video import VideoModel
from distseq.train.step import check_every_parameter_has_grad

TOL = 1e-5


def step(model: VideoModel, batch: Batch, seed: int = 5) -> tuple[dict[str, torch.Tensor], float]:
    torch.manual_seed(seed)  # same dropout draws in every run being compared
    logits = model(batch.frames, batch.mask)
    loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert len(grads) == len(list(model.parameters())), "a parameter got no gradient"
    return grads, loss.item()


def max_rel_error(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    assert got.keys() == ref.keys()
    return max(
        float((got[n] - ref[n]).abs().max() / ref[n].abs().max().clamp_min(1e-12)) for n in ref
    )


@pytest.mark.parametrize("recompute", ["torch", "fairscale"])
def test_chunked_checkpoint_matches_plain_unchunked(recompute: str) -> None:
    # T=13 with k=4: the last chunk is short; the second sequence is padded after 9 frames.
    batch = random_batch(2, 13, lengths=[13, 9])
    ref, ref_loss = step(tiny_model("none", chunk=1000), batch)
    got, loss = step(tiny_model(recompute, chunk=4), batch)
    assert max_rel_error(got, ref) < TOL
    assert abs(loss - ref_loss) < 1e-6


@pytest.mark.parametrize("recompute", ["torch", "fairscale"])
@pytest.mark.parametrize("keep", [4, 5, 13])
def test_held_chunks_give_the_plain_gradients_and_bn_statistics(recompute: str, keep: int) -> None:
    # T=13, k=4: chunks start at 0, 4, 8, 12. keep=4 holds only the short last chunk (chunk 8
    # would make 5 frames), 5 holds chunks 8 and 12, 13 holds all.
    batch = random_batch(2, 13, size=64, lengths=[13, 9])  # BatchNorm of 1 frame needs 2x2
    ref_model = tiny_model("none", chunk=4, norm="batchnorm")
    ref, ref_loss = step(ref_model, batch)
    memory = MemoryConfig(recompute=Recompute(recompute), chunk_frames=4, keep_frames=keep)
    model = apply_memory_policy(tiny_model("none", chunk=4, norm="batchnorm"), memory)
    recomputed = []
    model.backbone.register_forward_hook(lambda module, args, out: recomputed.append(len(out)))
    got, loss = step(model, batch)
    assert max_rel_error(got, ref) < TOL and abs(loss - ref_loss) < 1e-6
    ref_buffers = dict(ref_model.named_buffers())
    for name, buf in model.named_buffers():
        assert torch.equal(buf, ref_buffers[name]), name
    held = {4: 1, 5: 2, 13: 4}[keep]  # chunks that are not run again in backward
    assert len(recomputed) == 4 + (4 - held)


def test_a_batch_keeps_its_frames_on_the_host_when_asked() -> None:
    batch = random_batch(1, 4)
    moved = batch.to(torch.device("meta"), frames_on_host=True)
    assert moved.frames is batch.frames and moved.mask.is_meta and moved.labels.is_meta
    assert batch.to(torch.device("meta")).frames.is_meta


@pytest.mark.parametrize("recompute", ["torch", "fairscale"])
def test_a_chunk_of_padding_alone_costs_nothing(
    recompute: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # T=24 in chunks of 4, real lengths 10 and 8: chunks 3 to 5 hold no real frame. fairscale's
    # checkpoint raised in backward on such a chunk ("None of the outputs have requires_grad").
    batch = random_batch(2, 24, lengths=[10, 8])
    ref, ref_loss = step(tiny_model("none", chunk=1000), batch)
    model = tiny_model(recompute, chunk=4)
    calls, checkpoints = [], []
    model.backbone.register_forward_hook(lambda module, args, out: calls.append(len(out)))

    def counted(*args: Any, **kwargs: Any) -> Any:
        checkpoints.append(1)
        return checkpoint(*args, **kwargs)

    monkeypatch.setattr(chunked, "checkpoint", counted)
    got, loss = step(model, batch)
    assert max_rel_error(got, ref) < TOL and abs(loss - ref_loss) < 1e-6
    # Frames per backbone call: the 3 chunks with real frames (2 rows x 4, 2 x 4, then row 0
    # alone), each run forward and recomputed once in reverse; none for a chunk of padding.
    assert calls == [8, 8, 2, 2, 8, 8]
    assert len(checkpoints) == (3 if recompute == "torch" else 0)  # torch's, for real chunks only


@pytest.mark.parametrize("recompute", ["torch", "fairscale"])
def test_dropout_is_replayed_in_recompute(recompute: str) -> None:
    # EfficientNet's stochastic depth and the head's dropout both draw random numbers; the
    # recompute must draw the same ones. The reference is the same chunking without checkpoints,
    # because chunking changes the order of random draws.
    kw = dict(backbone="efficientnet_b0", layers=2, dropout=0.3)
    batch = random_batch(2, 10, lengths=[10, 7])
    ref, _ = step(tiny_model("none", chunk=4, **kw), batch)
    got, _ = step(tiny_model(recompute, chunk=4, **kw), batch)
    assert max_rel_error(got, ref) < TOL
    # and dropout really was on: another seed gives other gradients
    other, _ = step(tiny_model(recompute, chunk=4, **kw), batch, seed=6)
    assert max_rel_error(other, ref) > 1e-3


@pytest.mark.parametrize("recompute", ["torch", "fairscale"])
def test_batchnorm_grads_and_running_stats_updated_once(recompute: str) -> None:
    batch = random_batch(2, 12, size=64, lengths=[12, 10])
    ref_model = tiny_model("none", chunk=4, norm="batchnorm")
    model = tiny_model(recompute, chunk=4, norm="batchnorm")
    ref, _ = step(ref_model, batch)
    got, _ = step(model, batch)
    assert max_rel_error(got, ref) < TOL
    ref_buffers = dict(ref_model.named_buffers())
    bns = 0
    for name, buf in model.named_buffers():
        assert torch.equal(buf, ref_buffers[name]), name
        bns += name.endswith("num_batches_tracked")
    assert bns > 0
    tracked = model.get_buffer("backbone.bn1.num_batches_tracked")
    assert int(tracked) == 3  # three chunks, one update each, not six


def test_guard_catches_reentrant_checkpoint_dropping_cnn_grads() -> None:
    # What docs/design.md warns of: reentrant checkpointing with inputs that do not require grad
    # leaves the CNN without gradients and only warns. The first-step guard turns it into an error.
    model = tiny_model("none", chunk=1000)
    batch = random_batch(1, 4)
    with pytest.warns(UserWarning):
        feats = checkpoint(model.features, batch.frames, batch.mask, use_reentrant=True)
    model.temporal(feats, batch.mask).sum().backward()
    with pytest.raises(TrainingError, match="got no gradient"):
        check_every_parameter_has_grad(model)


@pytest.mark.parametrize(
    ("backbone", "norm"),
    [
        ("resnet18", "batchnorm"),
        ("mobilenet_v3_small", "batchnorm"),
        ("efficientnet_b0", "groupnorm"),
    ],
)
def test_held_stages_give_the_plain_gradients_and_bn_statistics(backbone: str, norm: str) -> None:
    # Every hold at once, chunk by chunk: the whole chunk, each split into recomputed early and
    # held late stages, and nothing held. T=20 in chunks of 4: one chunk per hold for ResNet-18's
    # four stage starts and MobileNet's.
    batch = random_batch(2, 20, size=64, lengths=[20, 17])
    ref_model = tiny_model("none", chunk=4, backbone=backbone, norm=norm, dropout=0.3)
    ref, ref_loss = step(ref_model, batch)
    model = tiny_model("torch", chunk=4, backbone=backbone, norm=norm, dropout=0.3)
    starts = stage_starts(model, model.backbone, 64, torch.device("cpu"))
    model.hold_stages(starts)
    holds = [WHOLE, *(Hold(h) for h in range(1, len(starts) + 1)), NOTHING]
    model.plan = lambda frames, whole: [holds[i % len(holds)] for i in range(5)]
    recomputed: list[int] = []
    # A pre-hook: a recompute that stops where the held stages begin never returns.
    model.backbone.register_forward_pre_hook(lambda module, args: recomputed.append(1))
    got, loss = step(model, batch)
    assert max_rel_error(got, ref) < TOL and abs(loss - ref_loss) < 1e-6
    ref_buffers = dict(ref_model.named_buffers())
    for name, buf in model.named_buffers():
        assert torch.equal(buf, ref_buffers[name]), name
    # Every chunk but the whole one runs the backbone again in backward (its early stages).
    assert len(recomputed) == 5 + sum(1 for i in range(5) if holds[i % len(holds)] != WHOLE)


class _Convolutions(TorchDispatchMode):
    """Counts the convolutions that really run: an op the recompute takes from the selective
    checkpoint's cache never reaches a mode outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += func is torch.ops.aten.convolution.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("hold", "recomputed"), [(WHOLE, 0), (Hold(3), 10), (Hold(4), 15), (NOTHING, 20)]
)
def test_a_held_stage_is_not_run_again_in_backward(hold: Hold, recomputed: int) -> None:
    # ResNet-18's 20 convolutions: the stem's 1, then 4 in layer1 and 5 (a downsample) in each
    # of layer2-4. Holding stage 3 (layer3) on recomputes the stem, layer1 and layer2: 10.
    model = tiny_model("torch", chunk=4, norm="batchnorm")
    starts = stage_starts(model, model.backbone, 64, torch.device("cpu"))
    assert starts == ["layer1.0.conv1", "layer2.0.conv1", "layer3.0.conv1", "layer4.0.conv1"]
    model.hold_stages(starts)
    model.plan = lambda frames, whole: [hold]
    batch = random_batch(1, 4, size=64)
    loss = model(batch.frames, batch.mask).sum()
    with _Convolutions() as convolutions:
        loss.backward()
    assert convolutions.count == recomputed
