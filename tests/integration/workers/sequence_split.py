"""One rank of a user's own CNN (BatchNorm) and LSTM head, each sequence split across a group
of ranks through the public API (``distseq.parallelize(..., sequence=S)``), trained by a plain
loop: two SGD steps of the mean cross-entropy of the group's batch.

argv: cases ``MODE:S:NORM`` (e.g. ``ddp:2:batchnorm fsdp:2:groupnorm``), run one after the other
in this one process group. Writes out_<case>_<rank>.pt: the first step's gradients, the
parameters and BatchNorm statistics after the steps. The case ``plan`` (S = 2, FSDP2) plans a
memory budget per slice (``distseq.plan_memory(..., sequence=2)``) and measures a step under it;
``refusals`` (S = 2) gives the split what it must refuse, and what it must then take.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import distseq
from conftest import report
from distseq.data.batch import slices

CHUNK, STEPS, LR, CLASSES = 4, 2, 0.05, 3
# 13 frames in chunks of 4 (4, 4, 4, 1): S=2 takes frames 0-7 and 8-12, S=3 0-3, 4-7 and 8-12.
# The second group's videos end by frame 8: under S=2 its second rank's slice is padding alone.
LENGTHS = [13, 9, 7, 5]
# "dropout": GroupNorm, and dropout in the CNN and before the head, whose draws no single
# process can repeat: the group's ranks must still run one head (the same losses).
NORMS: dict[str, Callable[[int], torch.nn.Module]] = {
    "batchnorm": torch.nn.BatchNorm2d,
    "groupnorm": lambda c: torch.nn.GroupNorm(4, c),
    "dropout": lambda c: torch.nn.Sequential(torch.nn.GroupNorm(4, c), torch.nn.Dropout(0.3)),
}


def build(norm: str, feature_dim: int | None = 16) -> distseq.ChunkedModel:
    from own_model import LSTMHead, small_cnn

    torch.manual_seed(0)
    head = LSTMHead(16, CLASSES, 8)
    if norm == "dropout":
        head.lstm.register_forward_pre_hook(lambda m, args: (F.dropout(args[0], 0.3), *args[1:]))
    return distseq.ChunkedModel(
        small_cnn(16, NORMS[norm]), head, feature_dim=feature_dim, chunk_frames=CHUNK
    )


def global_batch(groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two videos a data-parallel group: frames, labels, mask."""
    b, t = 2 * groups, max(LENGTHS)
    g = torch.Generator().manual_seed(1)
    frames = torch.randint(0, 256, (b, t, 3, 16, 16), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, CLASSES, (b, t), generator=g)
    mask = torch.arange(t) < torch.tensor(LENGTHS[:b])[:, None]
    return frames, labels, mask


def loss_of(model: torch.nn.Module, frames, labels, mask) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return F.cross_entropy(model(frames, mask)[mask], labels[mask])


def main() -> None:
    info = distseq.init_distributed()
    losses: dict[str, object] = {}
    for case in sys.argv[1:]:
        if case in ("plan", "refusals"):
            losses[case] = run_plan(info) if case == "plan" else run_refusals(info)
            continue
        mode, sequence, norm = case.split(":")
        losses[case] = run(mode, int(sequence), norm, info, case.replace(":", "_"))
    report(losses)
    distseq.close_distributed()


def run(mode: str, sequence: int, norm: str, info: distseq.DistInfo, name: str) -> list[float]:
    model = distseq.parallelize(build(norm), mode, "fp32", info, sequence=sequence)
    rank, groups = info.data_rank(sequence)
    frames, labels, mask = (x[2 * rank : 2 * rank + 2] for x in global_batch(groups))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grads, losses = {}, []
    for step in range(STEPS):
        loss = loss_of(model, frames, labels, mask)
        loss.backward()
        if step == 0:
            for n, p in getattr(model, "module", model).named_parameters():
                assert p.grad is not None, n
                grads[n] = (
                    p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                ).clone()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    torch.save({"state": state, "grads": grads}, f"out_{name}_{info.rank}.pt")
    return losses


def run_plan(info: distseq.DistInfo) -> dict[str, float | bool | str]:
    """A 64-frame video split in two under a budget between the floors (every chunk recomputed)
    of its slice and of the whole: the rank's step as measured (what it holds before, and the
    step's own peak), the plan's prediction, whether one process's plan refuses the budget, and
    what the model says to frames of neither the whole video's length nor the slice's."""
    from distseq.errors import ConfigError
    from distseq.memory.measure import measure_step
    from distseq.memory.plan import Plan
    from distseq.memory.probe import resident_bytes

    t = 64
    chunked = build("batchnorm")
    model = distseq.parallelize(chunked, "fsdp", "fp32", info, sequence=2)
    g = torch.Generator().manual_seed(2)
    frames = torch.randint(0, 256, (1, t, 3, 16, 16), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, CLASSES, (1, t), generator=g)
    mask = torch.ones(1, t, dtype=torch.bool)
    roomy = distseq.plan_memory(chunked, 10**12, frames, CLASSES, wrapped=model, sequence=2)
    unsplit = Plan(roomy.probe, 0, roomy.stages)
    budget = int((roomy.floor_bytes(t) + unsplit.floor_bytes(t)) / 2)
    plan = Plan(roomy.probe, budget, roomy.stages, sequence=2)
    plan.check(t)
    try:
        Plan(roomy.probe, budget, roomy.stages).check(t)
        refused = False
    except ConfigError:
        refused = True
    plan.apply(chunked)
    try:
        model(frames[:, :5], mask)  # neither the whole nor this rank's slice
        wrong = ""
    except distseq.ModelError as e:
        wrong = str(e)
    part = frames[:, 32 * info.rank : 32 * info.rank + 32]  # as a data.Part batch holds it
    cost = measure_step(model, part, mask, labels)
    return {
        "total": resident_bytes(model) + part.numel() + cost.peak_bytes,
        "budget": budget,
        "predicted": plan.peak_bytes(t),
        "unsplit_refused": refused,
        "wrong_slice": wrong,
    }


def run_refusals(info: distseq.DistInfo) -> dict[str, object]:
    """What S = 2 refuses, each rank's error line (empty: none), and where a one-process model
    is the reference, the largest difference of each rank's logits from its (no_grad).

    - ``sliced_*``: a mask sliced along with the frames (each rank its half, the frames' slice
      and the mask's, T = 16 in two of 8, and T = 13 in 8 and 5), beside the same video's
      frames sliced with the mask whole (``right_*``), as docs/library.md says, against one
      process.
    - ``after_raise``: ``parallelize(..., sequence=2)`` that raises (mode "none" on 2 ranks),
      then ``parallelize(..., "ddp", sequence=1)`` of the same model: each rank's own video
      then runs whole, as one process runs it.
    - ``padding_slice``: without feature_dim, rank 1's slice is padding alone, though the batch
      has real frames (rank 1 alone calls the model: the error comes before any collective).
    """
    got: dict[str, object] = {}
    g = torch.Generator().manual_seed(3)
    frames = torch.randint(0, 256, (1, 16, 3, 16, 16), generator=g, dtype=torch.uint8)
    mask = torch.ones(1, 16, dtype=torch.bool)
    with torch.no_grad():
        for length in (16, 13):
            whole = build("groupnorm")(frames[:, :length], mask[:, :length])
            # The model itself, not DDP's wrapper: a refused forward leaves DDP mid-step.
            model = distseq.parallelize(build("groupnorm"), "ddp", "fp32", info, sequence=2)
            split = model.module
            assert isinstance(split, distseq.ChunkedModel)
            a, b = slices(length, CHUNK, 2)[info.rank]
            # The frames' slice alone, the mask whole: this is taken, as one process's.
            right = split(frames[:, a:b], mask[:, :length])
            got[f"right_{length}"] = float((right - whole).abs().max())
            try:
                split(frames[:, a:b], mask[:, a:b])
                got[f"sliced_{length}"] = ""
            except distseq.ModelError as e:
                got[f"sliced_{length}"] = str(e)

        model = build("groupnorm")
        try:
            distseq.parallelize(model, "none", "fp32", info, sequence=2)
            got["raised"] = ""
        except distseq.ConfigError as e:
            got["raised"] = str(e)
        ddp = distseq.parallelize(model, "ddp", "fp32", info, sequence=1)
        own = frames[:, 8 * info.rank : 8 * info.rank + 8], mask[:, :8]  # each rank's own video
        got["after_raise"] = float((ddp(*own) - build("groupnorm")(*own)).abs().max())

        model = distseq.parallelize(build("groupnorm", None), "ddp", "fp32", info, sequence=2)
        assert isinstance(model.module, distseq.ChunkedModel)
        if info.rank == 1:
            padded = torch.arange(13)[None] < 7  # 7 real frames; rank 1's slice is [8, 13)
            try:
                model.module(frames[:, :13], padded)
                got["padding_slice"] = ""
            except distseq.ModelError as e:
                got["padding_slice"] = str(e)
    return got


if __name__ == "__main__":
    main()
