"""Backbones, norm policies, local weights, and what the temporal head may and may not see."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torchvision
from torch import nn

from conftest import random_batch, tiny_model
from distseq.config import BackboneConfig, HeadConfig, Norm, Temporal, load_config
from distseq.errors import ConfigError
from distseq.model.backbone import build_backbone
from distseq.model.head import HEADS, Carry, build_head


@pytest.mark.parametrize(
    "name", ["resnet18", "resnet50", "convnext_tiny", "efficientnet_b0", "tiny_cnn"]
)
@pytest.mark.parametrize("norm", ["groupnorm", "frozen_bn", "batchnorm"])
def test_backbones_and_norm_policies(name: str, norm: str) -> None:
    model = tiny_model("torch", chunk=3, backbone=name, norm=norm).eval()
    batch = random_batch(2, 4, lengths=[4, 2])
    with torch.no_grad():
        logits = model(batch.frames, batch.mask)
    assert logits.shape == (2, 4, 3) and torch.isfinite(logits).all()
    has_bn = any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert has_bn == (norm == "batchnorm" and name != "convnext_tiny")  # ConvNeXt has LayerNorm


def test_local_weights_are_loaded_and_nothing_is_fetched(tmp_path: Path) -> None:
    torch.manual_seed(3)
    reference = torchvision.models.resnet18()
    path = tmp_path / "resnet18.pth"
    torch.save(reference.state_dict(), path)
    cnn, dim, _ = build_backbone(
        BackboneConfig(name="resnet18", weights=str(path), norm=Norm.frozen_bn)
    )
    assert dim == 512 and torch.equal(cnn.conv1.weight, reference.conv1.weight)
    # frozen BN carries the file's statistics
    assert torch.equal(cnn.bn1.running_var, reference.bn1.running_var)


def test_weights_for_another_architecture_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "resnet50.pth"
    torch.save(torchvision.models.resnet50().state_dict(), path)
    with pytest.raises(ConfigError, match=r"resnet50\.pth: does not fit"):
        build_backbone(BackboneConfig(name="resnet18", weights=str(path)))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_head_sees_the_past_only_unless_bidirectional(bidirectional: bool) -> None:
    model = tiny_model("torch", chunk=3, bidirectional=bidirectional).eval()
    batch = random_batch(1, 8)
    later = batch.frames.clone()
    later[:, 5:] = 255 - later[:, 5:]
    with torch.no_grad():
        before = model(batch.frames, batch.mask)
        after = model(later, batch.mask)
    past_changed = not torch.allclose(before[:, :5], after[:, :5])
    assert past_changed == bidirectional
    assert not torch.allclose(before[:, 5:], after[:, 5:])


@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_does_not_leak_into_real_frames(bidirectional: bool) -> None:
    model = tiny_model("torch", chunk=3, bidirectional=bidirectional).eval()
    batch = random_batch(1, 9, lengths=[6])
    noisy = batch.frames.clone()
    noisy[:, 6:] = 0
    with torch.no_grad():
        a = model(batch.frames, batch.mask)[:, :6]
        b = model(noisy, batch.mask)[:, :6]
        alone = model(batch.frames[:, :6], batch.mask[:, :6])
    assert torch.equal(a, b)
    assert torch.allclose(a, alone, atol=1e-6)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_carried_state_continues_the_sequence_and_stops_the_gradient(kind: str) -> None:
    torch.manual_seed(0)
    model = tiny_model(kind=kind, layers=2)
    head = model.temporal  # the head as the model runs it, the carried state included
    feats = torch.randn(2, 12, model.feature_dim, requires_grad=True)  # type: ignore[arg-type]
    mask = torch.ones(2, 12, dtype=torch.bool)
    whole = head(feats, mask)

    carry = Carry()
    starts = torch.tensor([True, True])
    windows = []
    for start in range(0, 12, 5):  # windows of 5, 5 and 2 frames
        carry.reset(starts)
        windows.append(head(feats[:, start : start + 5], mask[:, start : start + 5], carry))
        starts = torch.tensor([False, False])
    torch.testing.assert_close(torch.cat(windows, 1), whole, rtol=1e-5, atol=1e-6)

    # The carried state is detached: the last window's loss reaches only its own frames.
    windows[-1].sum().backward()
    assert feats.grad is not None
    assert feats.grad[:, :10].abs().max() == 0 and feats.grad[:, 10:].abs().max() > 0

    # A reset row starts afresh; the other row keeps its video's state.
    carry.reset(torch.tensor([True, False]))
    with torch.no_grad():
        fresh = head(feats[:1, :3], mask[:1, :3])
        continued = head(feats[:, :3], mask[:, :3], carry)
    torch.testing.assert_close(continued[:1], fresh)
    assert not torch.allclose(continued[1:], head(feats[1:, :3], mask[1:, :3]))


def test_weights_by_torchvision_name_come_from_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A machine that already holds the file, as torchvision keeps it: never a download.
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")  # any fetch would fail at once
    torch.manual_seed(5)
    reference = torchvision.models.resnet18()
    cache = tmp_path / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(reference.state_dict(), cache / "resnet18-f37072fd.pth")
    for entry in ("IMAGENET1K_V1", "DEFAULT"):
        cnn, _, _ = build_backbone(
            BackboneConfig(name="resnet18", weights=entry, norm=Norm.frozen_bn)
        )
        assert torch.equal(cnn.conv1.weight, reference.conv1.weight)
        # The norm policy applies after the weights: frozen BN keeps their statistics.
        assert torch.equal(cnn.bn1.running_mean, reference.bn1.running_mean)


def test_weights_that_cannot_be_fetched_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")  # no network, as on a cluster node
    with pytest.raises(ConfigError) as e:
        build_backbone(BackboneConfig(name="resnet18", weights="IMAGENET1K_V1"))
    message = str(e.value)
    assert "\n" not in message and "resnet18-f37072fd.pth is not in torchvision's cache" in message
    assert str(tmp_path / "hub" / "checkpoints") in message and "put the file there" in message
    assert not list(tmp_path.rglob("*.pth"))  # nothing half-downloaded left behind
    with pytest.raises(
        ConfigError,
        match=r"nor one of resnet18's torchvision weights \(IMAGENET1K_V1, DEFAULT\)",
    ):
        build_backbone(BackboneConfig(name="resnet18", weights="IMAGENET_V9"))


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_chrono_initialisation_opens_the_keep_gate(kind: str) -> None:
    torch.manual_seed(0)
    head = build_head(8, HeadConfig(kind=kind, hidden=64, chrono_frames=300), 2)
    assert head.rnn is not None
    h = 64
    keep = head.rnn.bias_ih_l0[h : 2 * h] + head.rnn.bias_hh_l0[h : 2 * h]
    # log U(1, 299): every unit starts out keeping its state, over 1 to 299 frames.
    assert keep.min() >= 0 and keep.max() <= math.log(299) and keep.std() > 0.3
    others = torch.cat([head.rnn.bias_ih_l0[:h], head.rnn.bias_ih_l0[2 * h :]])
    assert others.abs().max() < 1 / math.sqrt(h)  # PyTorch's initialisation, untouched
    # Remembering, in practice: 100 frames after one input, the state still shows it, where
    # PyTorch's initialisation has forgotten it (its keep gate starts half open: 0.5^100).
    trace = {}
    for chrono in (0, 300):
        torch.manual_seed(0)
        rnn = build_head(8, HeadConfig(kind=kind, hidden=h, chrono_frames=chrono), 2).rnn
        assert rnn is not None
        x = torch.zeros(1, 101, 8)
        x[0, 0] = 3.0
        with torch.no_grad():
            cued, blank = rnn(x)[0][0, -1], rnn(torch.zeros(1, 101, 8))[0][0, -1]
        trace[chrono] = float((cued - blank).abs().max())
    assert trace[300] > 1e-3 and trace[300] > 1000 * trace[0], trace


def test_chrono_needs_an_rnn() -> None:
    with pytest.raises(ConfigError, match=r"model\.head\.chrono_frames=300 \(lstm or gru\)"):
        load_config(None, ["model.head.kind=none", "model.head.chrono_frames=300"])
    with pytest.raises(ConfigError, match=r"model\.head\.chrono_frames=1: must be 0, or >= 2"):
        HeadConfig(kind="lstm", chrono_frames=1)


def test_the_tiny_cnn_has_no_torchvision_weights() -> None:
    with pytest.raises(ConfigError, match=r"model\.backbone\.weights='DEFAULT': tiny_cnn has none"):
        build_backbone(BackboneConfig(name="tiny_cnn", weights="DEFAULT"))
    with pytest.raises(ConfigError, match=r"not a torchvision model nor tiny_cnn"):
        build_backbone(BackboneConfig(name="tinycnn"))


def test_each_head_kind_builds_its_own_rnn() -> None:
    # model.head.kind is a string (it may be an import path): a comparison by identity with the
    # enum once made every kind a GRU.
    assert isinstance(build_head(8, HeadConfig(kind="lstm"), 2).rnn, torch.nn.LSTM)
    assert type(build_head(8, HeadConfig(kind="gru"), 2).rnn) is torch.nn.GRU
    assert build_head(8, HeadConfig(kind="none"), 2).rnn is None
    assert isinstance(tiny_model().head.rnn, torch.nn.LSTM)  # the default


def test_every_head_kind_has_a_builder() -> None:
    assert set(HEADS) == set(Temporal)  # model.head.kind's values, each buildable
    for kind in Temporal:
        assert isinstance(build_head(8, HeadConfig(kind=kind.value, hidden=8), 2), torch.nn.Module)
