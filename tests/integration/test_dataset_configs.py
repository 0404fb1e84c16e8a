"""configs/: each dataset's config loads and trains a few steps as written, but for its data and
its size: the action-segmentation ones on an imported release of their shapes (I3D's 2048
features), the Cholec80 ones end to end on the test shards with a tiny CNN in place of ResNet-50."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import REPO
from distseq.bench.heads import simulated_release
from distseq.config import load_config
from distseq.shard.released import import_release
from distseq.train.loop import train

ON_FEATURES = ["50salads-mstcn", "breakfast-mstcn", "gtea-mstcn"]
END_TO_END = ["cholec-resnet50-lstm", "cholec-resnet50-tecno", "cholec-resnet50-transformer"]
# The quick start's config is run by the README's own test, as the README says, at a tiny size.
RUN_BY_THE_README = ["quickstart"]
FEW = ["train.steps=2", "train.log_every=1", "data.num_workers=0", "parallel.mode=none"]


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A release of the published layout: 5 training videos and a test video, 2048 features."""
    root, out = tmp_path_factory.mktemp("release"), tmp_path_factory.mktemp("imported")
    simulated_release(root, videos=5, feature_dim=2048, num_classes=4, min_frames=30, max_frames=60)
    import_release(root, 1, out)
    return out


def test_every_config_is_tried() -> None:
    tried = {*ON_FEATURES, *END_TO_END, *RUN_BY_THE_README}
    assert {p.stem for p in (REPO / "configs").glob("*.yaml")} == tried


@pytest.mark.parametrize("name", ON_FEATURES)
def test_an_action_segmentation_config_trains_on_imported_features(
    name: str, release: Path, tmp_path: Path
) -> None:
    data = [
        f"data.train={release}/train-{{000000..000001}}.tar",
        f"data.val={release}/test-000000.tar",
    ]
    path = REPO / "configs" / f"{name}.yaml"
    cfg = load_config(path, [*data, *FEW, f"train.out_dir={tmp_path}/run"])
    assert (cfg.model.head.kind, cfg.model.head.stages, cfg.loss.smoothing) == ("mstcn", 4, 0.15)
    metrics = train(cfg)
    assert math.isfinite(metrics["loss"]) and 0 <= metrics["val_accuracy"] <= 1
    assert (tmp_path / "run" / "checkpoints").is_dir()


@pytest.mark.parametrize("name", END_TO_END)
def test_a_cholec80_config_trains_end_to_end(
    name: str, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = [
        f"data.train={shards}/train-{{000000..000003}}.tar",
        f"data.val={shards}/val-{{000000..000001}}.tar",
        "model.backbone.name=tiny_cnn",
        "model.backbone.weights=",
        "data.size=32",
        "data.window=8",
        "memory.chunk_frames=4",
        "data.shuffle_buffer=2",
    ]
    cfg = load_config(
        REPO / "configs" / f"{name}.yaml", [*tiny, *FEW, f"train.out_dir={tmp_path}/r"]
    )
    metrics = train(cfg)
    assert math.isfinite(metrics["loss"]) and 0 <= metrics["val_accuracy"] <= 1
    # A head without state learns from windows but predicts whole videos: the run says so.
    said = (
        "carries no state: it learns from windows of data.window=8 frames"
        in capsys.readouterr().out
    )
    assert said == (cfg.model.head.kind != "lstm")
