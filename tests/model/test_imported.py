"""Your modules through the config: model.backbone.name and model.head.kind as import paths
(a package written here, as a user's would be), and timm backbones, its weights from a file and
from a pre-filled Hugging Face cache (no hub here)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distseq.config import BackboneConfig, HeadConfig, ModelConfig, Norm, load_config
from distseq.errors import ConfigError
from distseq.model.video import build_feature_model, build_model

NETS = """
import torch
from torch import nn

def make_cnn(width=8):
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())

class Mean(nn.Module):
    def __init__(self, in_features, num_classes, scale=1.0):
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)
        self.scale = scale
    def forward(self, feats, mask):
        return self.fc(feats) * self.scale

def make_head(in_features, num_classes, scale=1.0):
    return Mean(in_features, num_classes, scale)

def not_a_module(**kwargs):
    return 42

NUMBER = 3
"""


@pytest.fixture
def nets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "usernets.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def config(backbone: str, head: str = "lstm", **kw: object) -> ModelConfig:
    return ModelConfig(
        backbone=BackboneConfig(name=backbone, norm=Norm.batchnorm, args=kw.pop("args", {})),  # type: ignore[arg-type]
        head=HeadConfig(kind=head, hidden=8, args=kw.pop("head_args", {})),  # type: ignore[arg-type]
    )


def test_a_backbone_and_a_head_by_import_path_with_their_args(nets: Path) -> None:
    cfg = config(
        "usernets:make_cnn", "usernets:make_head", args={"width": 6}, head_args={"scale": 2.0}
    )
    model = build_model(cfg, num_classes=4)
    assert model.feature_dim == 6  # measured on one frame: the module has no such attribute
    assert model.head.scale == 2.0 and model.head.fc.in_features == 6
    assert isinstance(model.backbone[1], torch.nn.BatchNorm2d)  # norm=batchnorm keeps it
    frames = torch.randint(0, 256, (2, 5, 3, 16, 16), dtype=torch.uint8)
    assert model(frames, torch.ones(2, 5, dtype=torch.bool)).shape == (2, 5, 4)
    # The feature size without weights (data.features), on the meta device.
    assert build_feature_model(cfg, 4).feature_dim == 6
    # groupnorm (the default norm) converts its BatchNorm as it does torchvision's.
    grouped = build_model(
        ModelConfig(backbone=BackboneConfig(name="usernets:make_cnn", args={"width": 8})), 4
    )
    assert isinstance(grouped.backbone[1], torch.nn.GroupNorm)


def test_import_paths_from_a_yaml_file(nets: Path) -> None:
    path = nets / "own.yaml"
    path.write_text(
        "model:\n  backbone: {name: 'usernets:make_cnn', args: {width: 5}}\n"
        "  head: {kind: 'usernets:make_head', args: {scale: 0.5}}\n"
    )
    cfg = load_config(path)
    assert cfg.model.backbone.args == {"width": 5} and cfg.model.head.args == {"scale": 0.5}
    assert build_model(cfg.model, 3).feature_dim == 5


@pytest.mark.parametrize(
    ("backbone", "head", "args", "error"),
    [
        ("nopackage.nets:make", "lstm", {}, r"name='nopackage.nets:make': cannot import nopackage"),
        ("usernets:make_nothing", "lstm", {}, "usernets has no make_nothing"),
        ("usernets:NUMBER", "lstm", {}, "NUMBER is not callable"),
        ("usernets:not_a_module", "lstm", {}, "returned a int, not an nn.Module"),
        ("usernets:make_cnn", "lstm", {"depth": 3}, r"with \['depth'\] failed \(TypeError"),
        ("resnet18", "usernets:make_head", {}, None),
        ("usernets:make_cnn", "usernets:make_nothing", {}, "head.kind='usernets:make_no.*has no"),
    ],
)  # fmt: skip
def test_a_bad_import_path_is_one_line_naming_the_key(
    nets: Path, backbone: str, head: str, args: dict, error: str | None
) -> None:
    if error is None:  # the control: a torchvision backbone with a head of yours builds
        assert build_model(config(backbone, head), 3).feature_dim == 512
        return
    with pytest.raises(ConfigError, match=error) as raised:
        build_model(config(backbone, head, args=args), 3)
    assert "\n" not in str(raised.value)


def test_args_without_an_import_path_and_distseq_s_own_arguments_are_refused(nets: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.head\.args.*is for an import path"):
        HeadConfig(kind="lstm", args={"x": 1})
    with pytest.raises(ConfigError, match=r"model\.head\.kind='transformerx'"):
        HeadConfig(kind="transformerx")
    with pytest.raises(
        ConfigError, match=r"model.head.args: \['num_classes'\] are given by distseq"
    ):
        build_model(
            config("usernets:make_cnn", "usernets:make_head", head_args={"num_classes": 2}), 3
        )
    with pytest.raises(
        ConfigError, match=r"for another head.*memory\.tbptt_frames=4 \(lstm or gru\)"
    ):
        load_config(None, ["model.head.kind=usernets:make_head", "memory.tbptt_frames=4"])


def test_timm_backbone_with_random_weights_its_size_and_normalisation() -> None:
    timm = pytest.importorskip("timm", reason="the timm extra: pip install 'distseq[timm]'")
    model = build_model(config("timm:test_resnet"), num_classes=3)
    reference = timm.create_model("test_resnet", num_classes=0)
    assert model.feature_dim == reference.num_features
    assert model.input.mean == tuple(reference.pretrained_cfg["mean"])
    frames = torch.randint(0, 256, (1, 4, 3, 32, 32), dtype=torch.uint8)
    assert model(frames, torch.ones(1, 4, dtype=torch.bool)).shape == (1, 4, 3)
    with pytest.raises(ConfigError, match="'timm:no_such_net': not a timm model"):
        build_model(config("timm:no_such_net"), 3)


@pytest.mark.slow
def test_timm_weights_from_a_file_and_from_a_prefilled_hub_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timm = pytest.importorskip("timm", reason="the timm extra: pip install 'distseq[timm]'")
    from safetensors.torch import save_file

    torch.manual_seed(7)
    trained = timm.create_model("test_resnet")  # with its classifier, as a checkpoint has it
    state = {k: v.contiguous() for k, v in trained.state_dict().items()}
    file = tmp_path / "weights.pth"
    torch.save(state, file)
    by_file = BackboneConfig(name="timm:test_resnet", weights=str(file), norm=Norm.batchnorm)
    loaded = build_model(ModelConfig(backbone=by_file), 3)
    for name, tensor in loaded.backbone.state_dict().items():
        assert torch.equal(tensor, state[name]), name

    # The cache as huggingface_hub lays it out after a download: what a user's machine holds.
    hub_id = trained.pretrained_cfg["hf_hub_id"]
    repo = tmp_path / "hf" / "hub" / f"models--{hub_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    save_file(state, str(snapshot / "model.safetensors"))
    (snapshot / "config.json").write_text(json.dumps({"architecture": "test_resnet"}))
    # A fresh process, as a user's: huggingface_hub reads HF_HOME when it is imported.
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    build = f"""
import torch
from distseq.config import BackboneConfig, ModelConfig, Norm
from distseq.model.video import build_model
cfg = BackboneConfig(name="timm:test_resnet", weights="pretrained", norm=Norm.batchnorm)
state = build_model(ModelConfig(backbone=cfg), 3).backbone.state_dict()
torch.save(state, {str(tmp_path / "out.pt")!r})
"""
    run = subprocess.run([sys.executable, "-c", build], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    cached = torch.load(tmp_path / "out.pt", weights_only=True)
    assert cached.keys() == {k for k in state if not k.startswith("fc.")}
    for name, tensor in cached.items():
        assert torch.equal(tensor, state[name]), name

    (snapshot / "model.safetensors").unlink()  # not in the cache: one line saying where to put it
    run = subprocess.run([sys.executable, "-c", build], env=env, capture_output=True, text=True)
    assert run.returncode != 0
    assert re.search(
        r"weights: timm could not make test_resnet \(its pretrained weights are not in the "
        r"Hugging Face cache",
        run.stderr,
    ), run.stderr[-2000:]


def test_timm_norm_and_activation_layers_keep_their_activation() -> None:
    # timm's BatchNormAct2d holds the activation after the norm: replaced by a plain norm, the
    # activations went (24 of MobileNetV3's 34), silently.
    timm = pytest.importorskip("timm", reason="the timm extra: pip install 'distseq[timm]'")
    from timm.layers import BatchNormAct2d

    def acts(module: torch.nn.Module) -> int:
        return sum(isinstance(m, torch.nn.SiLU | torch.nn.ReLU) for m in module.modules())

    torch.manual_seed(0)
    plain = timm.create_model("test_efficientnet", num_classes=0)
    assert any(isinstance(m, BatchNormAct2d) for m in plain.modules())
    built = {}
    for norm in (Norm.batchnorm, Norm.frozen_bn, Norm.groupnorm):
        torch.manual_seed(0)
        cfg = ModelConfig(backbone=BackboneConfig(name="timm:test_efficientnet", norm=norm))
        built[norm] = build_model(cfg, 3)
        assert acts(built[norm].backbone) == acts(plain), norm
    assert not any(isinstance(m, BatchNormAct2d) for m in built[Norm.groupnorm].backbone.modules())
    # Frozen statistics are BatchNorm's in eval mode: the same features.
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        same = built[Norm.batchnorm].backbone.eval()(x), built[Norm.frozen_bn].backbone.eval()(x)
    torch.testing.assert_close(*same)


def test_timm_features_after_the_pool_have_the_size_the_model_makes() -> None:
    pytest.importorskip("timm", reason="the timm extra: pip install 'distseq[timm]'")
    # MobileNetV3 has a conv after its pool: 1024 features where num_features says 576.
    model = build_model(config("timm:mobilenetv3_small_050"), 3).eval()
    frames = torch.randint(0, 256, (1, 2, 3, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        feats = model.features(frames, torch.ones(1, 2, dtype=torch.bool))
    assert model.feature_dim == feats.shape[-1] == 1024
