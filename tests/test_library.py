"""The public API (docs/library.md) with a CNN and heads that distseq did not write: no
torchvision, no TemporalHead. The contracts of tests/memory/test_gradients.py again, through
``distseq.ChunkedModel``: exact gradients against plain autograd, BatchNorm statistics updated
once per chunk, names kept, state carried; and one clear error for each bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import distseq
from distseq.model.frames import IMAGENET_MEAN, IMAGENET_STD
from distseq.model.head import is_stateful
from own_model import LSTMHead, small_cnn
from tcn_head import make_head

REPO = Path(__file__).resolve().parents[1]
TOL = 1e-5
CLASSES = 3


def frames_and_mask(b: int = 2, t: int = 13, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    frames = torch.randint(0, 256, (b, t, 3, size, size), generator=g, dtype=torch.uint8)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1:, 9:] = False  # the second video ends after 9 frames
    return frames, mask


def heads() -> dict[str, nn.Module]:
    return {"tcn": make_head(16, CLASSES, channels=8, layers=3), "lstm": LSTMHead(16, CLASSES, 8)}


def model(head: str, recompute: str, chunk: int = 4, norm: type = nn.BatchNorm2d) -> nn.Module:
    torch.manual_seed(0)
    return distseq.ChunkedModel(
        small_cnn(16, norm), heads()[head], chunk_frames=chunk, recompute=recompute
    )


def grads(m: nn.Module, frames: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    labels = torch.arange(frames.shape[1]).remainder(CLASSES).expand(frames.shape[0], -1)
    logits = m(frames, mask)
    F.cross_entropy(logits[mask], labels[mask]).backward()
    found = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    assert len(found) == len(list(m.parameters())), "a parameter got no gradient"
    return found


def max_rel_error(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    assert got.keys() == ref.keys()
    return max(float((got[n] - ref[n]).abs().max() / ref[n].abs().max()) for n in ref)


def test_every_public_name_resolves_and_is_documented() -> None:
    page = (REPO / "docs" / "library.md").read_text()
    for name in distseq.__all__:
        assert getattr(distseq, name) is not None
        assert f"`{name}" in page or f"distseq.{name}" in page, f"{name} not in docs/library.md"
    with pytest.raises(AttributeError):
        distseq.NoSuchName  # noqa: B018
    # Tab completion reads dir(): the public names load on first use, and are listed before it.
    assert set(distseq.__all__) <= set(dir(distseq)), set(distseq.__all__) - set(dir(distseq))


@pytest.mark.parametrize("head", ["tcn", "lstm"])
def test_the_gradients_are_plain_autograd_s(head: str) -> None:
    # GroupNorm: each frame's features do not depend on its chunk-mates, so the reference is
    # plain autograd over every frame at once, written here without distseq.
    frames, mask = frames_and_mask()
    got = grads(model(head, "torch", norm=lambda c: nn.GroupNorm(4, c)), frames, mask)
    plain = model(head, "none", norm=lambda c: nn.GroupNorm(4, c))
    cnn, temporal = plain.backbone, plain.head  # the same modules, run by hand
    x = (frames[mask].float() / 255 - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(
        IMAGENET_STD
    ).view(1, 3, 1, 1)
    feats = torch.zeros(*mask.shape, 16).masked_scatter(mask[..., None], cnn(x))
    logits = temporal(feats, mask)
    logits = logits[0] if isinstance(logits, tuple) else logits
    labels = torch.arange(13).remainder(CLASSES).expand(2, -1)
    F.cross_entropy(logits[mask], labels[mask]).backward()
    ref = {n: p.grad for n, p in plain.named_parameters() if p.grad is not None}
    assert max_rel_error(got, ref) < TOL


@pytest.mark.parametrize("recompute", ["torch", "fairscale"])
@pytest.mark.parametrize("head", ["tcn", "lstm"])
def test_batchnorm_gradients_and_statistics_as_without_recompute(recompute: str, head: str) -> None:
    frames, mask = frames_and_mask()
    ref_model, chunked = model(head, "none"), model(head, recompute)
    ref, got = grads(ref_model, frames, mask), grads(chunked, frames, mask)
    assert max_rel_error(got, ref) < TOL
    ref_buffers = dict(ref_model.named_buffers())
    for name, buffer in chunked.named_buffers():
        assert torch.equal(buffer, ref_buffers[name]), name
    # 13 frames in chunks of 4: four updates, not eight (recompute updates nothing).
    assert int(chunked.get_buffer("backbone.1.num_batches_tracked")) == 4


def test_the_names_are_the_plain_modules_and_load_both_ways() -> None:
    m = model("lstm", "torch")
    plain = nn.ModuleDict({"backbone": small_cnn(16), "head": LSTMHead(16, CLASSES, 8)})
    assert list(m.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(m.state_dict())
    m.load_state_dict(plain.state_dict())


def test_a_carry_continues_a_video_across_windows_and_stops_the_gradient() -> None:
    m = model("lstm", "torch").eval()  # BatchNorm's running statistics: windows cut no chunk
    frames, _ = frames_and_mask(1, 12)
    mask = torch.ones(1, 12, dtype=torch.bool)
    with torch.no_grad():
        whole = m(frames, mask)
    carry, windows = distseq.Carry(), []
    for start in range(0, 12, 5):
        windows.append(m(frames[:, start : start + 5], mask[:, start : start + 5], carry))
    torch.testing.assert_close(torch.cat(windows, 1).detach(), whole, rtol=1e-5, atol=1e-6)
    # The state came in detached: the last window's loss reaches only its own parameters' use.
    assert all(not t.requires_grad for t in carry.state)  # type: ignore[union-attr]
    windows[-1].sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_a_compiled_stateful_head_is_still_stateful() -> None:
    head = LSTMHead(16, CLASSES, 8)
    assert is_stateful(head) and is_stateful(torch.compile(head))
    assert not is_stateful(torch.compile(make_head(16, CLASSES)))


def test_a_feature_dim_given_for_another_backbone_is_refused() -> None:
    frames, mask = frames_and_mask()
    m = distseq.ChunkedModel(small_cnn(16), make_head(16, 3), feature_dim=32)
    with pytest.raises(distseq.ModelError, match="makes 16 features a frame, but feature_dim=32"):
        m(frames, mask)


def test_float_frames_in_0_1_are_the_uint8_frames_scaled() -> None:
    frames, mask = frames_and_mask()
    m = model("tcn", "torch")
    with torch.no_grad():
        as_uint8 = m(frames, mask)
        torch.manual_seed(0)
        floats = distseq.ChunkedModel(m.backbone, m.head, chunk_frames=4, frames="float")
        torch.testing.assert_close(floats(frames.float() / 255, mask), as_uint8)
        # normalize=None: the CNN gets the frames as they are.
        own = distseq.ChunkedModel(
            m.backbone, m.head, chunk_frames=4, frames="float", normalize=None
        )
        mean = torch.tensor(IMAGENET_MEAN).view(1, 1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD).view(1, 1, 3, 1, 1)
        torch.testing.assert_close(own((frames.float() / 255 - mean) / std, mask), as_uint8)


class _MapBackbone(nn.Module):  # forgot the pool: returns [N, F, h, w]
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class _FlatHead(nn.Module):  # returns [B, T]: forgot the classes
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.fc(x)[..., 0]


class _StatefulNoTuple(_FlatHead):
    def forward(self, x: torch.Tensor, mask: torch.Tensor, state: object = None) -> torch.Tensor:  # type: ignore[override]
        return self.fc(x)


def _tcn() -> nn.Module:
    return model("tcn", "torch")


def _with(
    backbone: nn.Module | None = None, head: nn.Module | None = None, **kw: object
) -> nn.Module:
    return distseq.ChunkedModel(backbone or small_cnn(16), head or make_head(16, 3), **kw)  # type: ignore[arg-type]


def _run(m: nn.Module, f: torch.Tensor, k: torch.Tensor) -> object:
    return m(f, k)


FEATURE_MAP = r"the backbone returned \[16, 8, 8, 8\] for 16 frames"
FLAT = r"the head returned a tensor of shape \[2, 13\] for features of shape \[2, 13, 16\]"
NO_TUPLE = r"must return \(logits, state\); it returned a tensor of shape \[2, 13, 1\]"
BAD = {
    "float to uint8": (
        _tcn,
        lambda m, f, k: m(f.float(), k),
        "float32, but this model takes uint8",
    ),
    "uint8 to float": (lambda: _with(frames="float"), _run, "uint8, but this model takes float"),
    "a feature map": (lambda: _with(_MapBackbone(), make_head(8, 3)), _run, FEATURE_MAP),
    "logits [B, T]": (lambda: _with(head=_FlatHead()), _run, FLAT),
    "no state back": (lambda: _with(head=_StatefulNoTuple()), _run, NO_TUPLE),
    "short mask": (_tcn, lambda m, f, k: m(f, k[:, :5]), r"mask of shape \[2, 5\]"),
    "4-D frames": (_tcn, lambda m, f, k: m(f[0], k), r"frames of shape \[13, 3, 16, 16\]"),
    "carry, no state": (_tcn, lambda m, f, k: m(f, k, distseq.Carry()), "carries no state"),
    "recompute": (lambda: _with(recompute="jax"), None, "recompute='jax': must be one of"),
    "frames": (lambda: _with(frames="uint16"), None, "frames='uint16'"),
    "normalize": (lambda: _with(normalize=(0.5, 0.5)), None, r"None or \(mean, std\)"),
    "channels": (lambda: _with(normalize=((0.5,), (0.5,))), _run, "3 channels .* has 1 means"),
    "no mask": (_tcn, lambda m, f, k: m(f, None), r"mask=None: .*torch\.ones\(B, T, dtype"),
    "numpy frames": (_tcn, lambda m, f, k: m(f.numpy(), k), "type numpy.ndarray: .*from_numpy"),
    "[B, C, T, H, W]": (
        _tcn,
        lambda m, f, k: m(f.transpose(1, 2), k),
        r"shape \[2, 3, 13, 16, 16\] .* laid out \[B, C, T, H, W\]",
    ),
    "float in [0, 255]": (
        lambda: _with(frames="float"),
        lambda m, f, k: m(f.float(), k),
        "float frames up to 255, but this model takes float frames in .0, 1.",
    ),
    "chunk_frames=2.5": (lambda: _with(chunk_frames=2.5), None, "chunk_frames=2.5, .*int"),
    "chunk_frames='8'": (lambda: _with(chunk_frames="8"), None, "chunk_frames='8', .*int"),
    "parallelize mode": (
        _tcn,
        lambda m, f, k: distseq.parallelize(m, "fsdp2"),
        r"^mode='fsdp2': must be one of \['fsdp', 'ddp', 'none'\]$",
    ),
    "bf16 with ddp": (
        _tcn,
        lambda m, f, k: distseq.parallelize(m, "ddp", "bf16"),
        r"^precision='bf16' needs mode='fsdp', not 'ddp'$",
    ),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_input_is_one_line_naming_it(case: str) -> None:
    build, call, error = BAD[case]
    frames, mask = frames_and_mask()
    with pytest.raises(distseq.ModelError, match=error) as raised:
        model = build()
        assert call is not None, "built without an error"
        call(model, frames, mask)
    assert "\n" not in str(raised.value)


def test_a_memory_plan_from_python_fits_its_budget_and_is_kept(tmp_path: Path) -> None:
    m = model("lstm", "torch", chunk=8)
    frames, _ = frames_and_mask(1, 64, 32)
    mask = torch.ones(1, 64, dtype=torch.bool)
    said: list[str] = []
    with pytest.raises(distseq.ConfigError, match="below the parameters and optimizer state"):
        distseq.plan_memory(m, 1000, frames, CLASSES, say=said.append)
    probe = distseq.plan_memory(m, 10**9, frames, CLASSES, say=said.append)
    floor, top = probe.floor_bytes(64), probe.top_bytes(64)
    budget = int((floor + top) / 2)  # room for some chunks kept, not all
    plan = distseq.plan_memory(m, budget, frames, CLASSES, say=said.append)
    assert plan.peak_bytes(64) <= budget
    kept = plan.describe(64)
    assert re.search(r"T=64 chunk=8: [1-7]/8 chunks kept", kept), kept
    plan.apply(m)
    labels = torch.zeros(1, 64, dtype=torch.long)
    step = lambda: F.cross_entropy(m(frames, mask).flatten(0, 1), labels.flatten()).backward()  # noqa: E731
    measured = distseq.peak_memory(step, torch.device("cpu"))
    # The step's peak, above what existed before it (the parameters): within the budget.
    assert measured <= budget - plan.probe.fixed_bytes + plan.probe.fixed_bytes * 0.1, (
        measured,
        budget,
    )
    distseq.save_plan(plan, tmp_path / "plan.json")
    again = distseq.load_plan(tmp_path / "plan.json")
    assert again.holds(64) == plan.holds(64) and again.describe(64) == kept
