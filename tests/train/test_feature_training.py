"""``data.features=true``: the head alone trains on feature shards (``distseq features``), with
the same loss, validation, checkpoints and resume as a run over frames; its head warm-starts an
end-to-end model."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import ONE
from distseq.checkpoint.export import Loaded, load_model
from distseq.config import Config, load_config
from distseq.data.manifest import find_manifest
from distseq.data.val_stream import val_batches
from distseq.errors import ConfigError
from distseq.evaluate.judging import Judging, evaluate
from distseq.infer.features import write_features
from distseq.infer.predict import FrameSampling
from distseq.model.video import FeatureModel, build_model
from distseq.train.loop import train
from distseq.train.step import train_step
from distseq.train.warm_start import warm_start
from streams import N_VAL

CLASSES = ["phase0", "phase1", "phase2"]


def _frames_config(shards: Path, *overrides: str) -> Config:
    data = [
        f"data.train={shards}/train-{{000000..000003}}.tar",
        f"data.val={shards}/val-{{000000..000001}}.tar",
        "data.size=32",
        "data.num_workers=0",
        "model.head.hidden=8",
    ]
    return load_config(None, [*data, *overrides])


@pytest.fixture(scope="module")
def backbone(shards: Path) -> Loaded:
    """The per-frame model whose backbone makes the features (untrained: what matters is that
    the features are its)."""
    cfg = _frames_config(shards)
    torch.manual_seed(0)
    return Loaded(build_model(cfg.model, len(CLASSES)).eval(), cfg, CLASSES, 0)


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory, shards: Path, backbone: Loaded) -> Path:
    out = tmp_path_factory.mktemp("features")
    inputs = [f"{shards}/train-{{000000..000003}}.tar", f"{shards}/val-{{000000..000001}}.tar"]
    # Each video in one chunk, as the test below runs the backbone over it: the convolutions then
    # see the same batch and round alike.
    write_features(backbone, inputs, FrameSampling(None, 32, 90, None), 100, out, ONE)
    return out


def _features_config(features: Path, out: Path, *overrides: str) -> Config:
    data = [
        f"data.train={features}/train-{{000000..000003}}.tar",
        f"data.val={features}/val-{{000000..000001}}.tar",
        "data.features=true",
        "data.window=0",
        "data.num_workers=0",
        "model.head.hidden=8",
        "train.log_every=1",
        f"train.out_dir={out}",
    ]
    return load_config(None, [*data, *overrides])


def test_the_head_on_features_computes_what_it_does_on_the_frames(
    features: Path, backbone: Loaded, shards: Path, tmp_path: Path
) -> None:
    """One step's loss and head gradients on the feature shards equal those of the whole model
    over the frames of the same videos with its backbone frozen and its features rounded to
    float16 as the shards store them (without the rounding: 0.24% of the largest gradient off)."""
    frames = replace(_frames_config(shards).data, batch_size=1)
    feats = replace(_features_config(features, tmp_path).data, batch_size=1)
    by_frames = list(val_batches(frames, find_manifest(frames.val, "", "x")))
    by_features = list(val_batches(feats, find_manifest(feats.val, "", "x")))
    assert [b.keys for b in by_features] == [b.keys for b in by_frames] and len(by_frames) == N_VAL
    whole = copy.deepcopy(backbone.model)
    whole.backbone.requires_grad_(False)
    # Contiguous frames, as the writer stacks them: the loader's channels-last ones take other
    # convolution kernels, 1e-5 off, which float16 then rounds apart.
    stored = whole.features
    whole.features = lambda x, mask: stored(x.contiguous(), mask).half().float()  # type: ignore[method-assign]
    head = FeatureModel(copy.deepcopy(backbone.model.head), backbone.model.feature_dim)
    results = []
    for model, batches in ((whole, by_frames), (head, by_features)):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        loss, real = train_step(model, optimizer, batches, 1)  # one video a micro-batch
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss, real, grads))
    (loss_a, real_a, grads_a), (loss_b, real_b, grads_b) = results
    assert real_a == real_b == sum(int(b.mask.sum()) for b in by_frames)
    assert loss_a == pytest.approx(loss_b, 1e-6)
    assert grads_a.keys() == grads_b.keys() and all(k.startswith("head.") for k in grads_a)
    for key, grad in grads_a.items():
        err = (grad - grads_b[key]).abs().max() / grad.abs().max()
        assert err < 1e-6, key


def test_a_features_run_trains_validates_and_resumes_bit_exact(
    features: Path, tmp_path: Path
) -> None:
    whole = _features_config(features, tmp_path / "whole", "train.steps=4", "train.eval_every=2")
    metrics = train(whole)
    assert metrics["step"] == 4 and 0.0 <= metrics["val_accuracy"] <= 1.0
    lines = (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()
    assert sum("val_accuracy" in json.loads(line) for line in lines) == 2
    legs = _features_config(features, tmp_path / "legs", "train.steps=4", "train.eval_every=2")
    train(replace(legs, train=replace(legs.train, stop_after=2)))
    train(legs)
    a, b = load_model(tmp_path / "whole").model, load_model(tmp_path / "legs").model
    assert isinstance(a, FeatureModel) and list(a.state_dict()) == list(b.state_dict())
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    report = evaluate(load_model(tmp_path / "whole"), "val", "", Judging(), None, tmp_path, ONE)
    assert report["videos"] == N_VAL


def test_a_features_run_refuses_shards_and_backbones_that_do_not_match(
    features: Path, shards: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"model.backbone.name=resnet50: makes 2048 features"):
        train(_features_config(features, tmp_path / "a", "model.backbone.name=resnet50"))
    frames = _features_config(features, tmp_path / "b", f"data.train={shards}/train-000000.tar")
    with pytest.raises(ConfigError, match=r"data.features=true, but .* describes frame shards"):
        train(frames)
    cfg = _frames_config(shards, f"data.train={features}/train-000000.tar")
    with pytest.raises(ConfigError, match=r"describes feature shards \(512 a frame\)"):
        train(replace(cfg, train=replace(cfg.train, out_dir=str(tmp_path / "c"))))
    with pytest.raises(ConfigError, match=r"memory.budget='1GB': does not apply with data.feat"):
        _features_config(features, tmp_path / "d", "memory.budget=1GB")
    with pytest.raises(ConfigError, match=r"data.augment=.*flip=True.*: does not apply with"):
        _features_config(features, tmp_path / "d", "data.augment.flip=true")


@pytest.mark.slow
def test_the_stages_warm_start_one_model(
    features: Path, shards: Path, backbone: Loaded, tmp_path: Path
) -> None:
    """Stage 3 takes the backbone of a per-frame run (``:backbone``: its classifier is another
    shape) and the head of a features run."""
    frames_run = tmp_path / "frames"
    per_frame = _frames_config(
        shards,
        "model.head.kind=none",
        "data.window=4",
        "train.steps=1",
        f"train.out_dir={frames_run}",
    )
    train(per_frame)
    train(_features_config(features, tmp_path / "head", "train.steps=1"))
    cfg = _frames_config(shards)
    torch.manual_seed(5)
    model = build_model(cfg.model, 3)
    with pytest.raises(
        ConfigError, match=r"init_from .*frames: head\.classifier\.weight has shape"
    ):
        warm_start(model, [str(frames_run)], print)
    said: list[str] = []
    warm_start(model, [f"{frames_run}:backbone", str(tmp_path / "head")], said.append)
    ours = model.state_dict()
    stage1 = load_model(frames_run).model.state_dict()
    stage2 = load_model(tmp_path / "head").model.state_dict()
    assert all(torch.equal(ours[k], v) for k, v in stage1.items() if k.startswith("backbone."))
    assert all(torch.equal(ours[k], v) for k, v in stage2.items())
    assert set(stage2) == {k for k in ours if k.startswith("head.")}
    assert "not in it: head.classifier (2), head.rnn (4)" in said[0]
    assert "not in it: backbone." in said[1]
