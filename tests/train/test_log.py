"""The metrics log: TensorBoard scalars are the JSONL records, and a resumed run shows each step
once in both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import tiny_config
from distseq.config import load_config
from distseq.train.log import scalar_tag
from distseq.train.loop import train


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    board = EventAccumulator(str(run / "tensorboard"))
    board.Reload()
    return {tag: [(e.step, e.value) for e in board.Scalars(tag)] for tag in board.Tags()["scalars"]}


@pytest.mark.slow
def test_tensorboard_holds_the_records_once_across_a_resume(tmp_path: Path, shards: Path) -> None:
    config = tiny_config(tmp_path, shards)
    overrides = ["data.num_workers=0", "train.steps=4", "train.save_every=2"]
    train(load_config(config, overrides))
    # As after a crash in step 4, once step 4 was logged but before it was saved: the relaunch
    # trains steps 3 and 4 again, and the log must not show them twice.
    run = tmp_path / "run"
    (run / "checkpoints" / "latest").write_text("step_00000002\n")
    train(load_config(config, overrides))
    logged = records(run)
    assert [r["step"] for r in logged if "loss" in r] == [1, 2, 3, 4]
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in logged:
        for key, value in record.items():
            if key != "step":
                expected.setdefault(scalar_tag(key), []).append((record["step"], value))
    board = scalars(run)
    assert board.keys() == expected.keys()
    assert {"train/loss", "train/lr", "train/grad_norm", "train/frames_per_s"} <= board.keys()
    assert {"train/data_wait_fraction", "train/skipped_samples", "val/accuracy"} <= board.keys()
    assert {
        "val/video_accuracy",
        "val/precision",
        "val/recall",
        "val/jaccard",
        "val/f1",
    } <= board.keys()
    for tag, points in expected.items():
        assert [s for s, _ in board[tag]] == [s for s, _ in points], tag  # each step once
        assert [v for _, v in board[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag
    assert all(0 <= v <= 1 for _, v in board["train/data_wait_fraction"])
