"""configs/stages: the three-stage recipe's configs fit together. Stage 2 reads the features of
stage 1's backbone, and stage 3 warm-starts from stage 1's backbone and stage 2's head, as its
own train.init_from names them, every tensor of the right shape."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distseq.config import load_config, to_dict
from distseq.model.video import build_feature_model, build_model
from distseq.train.warm_start import warm_start

STAGES = Path(__file__).parents[2] / "configs" / "stages"
NO_WEIGHTS = "model.backbone.weights="  # ImageNet's are not on this machine


def test_the_third_stage_starts_from_the_first_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load_config(STAGES / "1-frames.yaml", [NO_WEIGHTS])
    second = load_config(STAGES / "2-head-on-features.yaml")
    assert second.data.features and second.data.window == 0
    monkeypatch.chdir(tmp_path)  # stage 3 names the runs of 1 and 2, relative to here
    for cfg in (first, second):
        Path(cfg.train.out_dir).mkdir(parents=True)
    third = load_config(STAGES / "3-end-to-end.yaml")
    assert third.train.init_from == [f"{first.train.out_dir}:backbone", second.train.out_dir]
    models = {1: build_model(first.model, 7), 2: build_feature_model(second.model, 7)}
    assert models[2].feature_dim == models[1].feature_dim == 2048  # stage 2 reads 1's features
    files = []
    for (stage, model), cfg in zip(models.items(), (first, second), strict=True):
        path = tmp_path / f"{stage}.pt"
        blob = {"format": 3, "model": model.state_dict(), "config": to_dict(cfg), "step": 1}
        torch.save({**blob, "classes": [str(c) for c in range(7)]}, path)
        files.append(path)
    model = build_model(third.model, 7)
    said: list[str] = []
    warm_start(model, [f"{files[0]}:backbone", str(files[1])], said.append)
    ours = model.state_dict()
    taken = {**models[1].state_dict(), **models[2].state_dict()}
    for key, tensor in ours.items():
        source = models[1] if key.startswith("backbone.") else models[2]
        assert torch.equal(tensor, source.state_dict()[key]), key
    assert set(ours) <= set(taken)
