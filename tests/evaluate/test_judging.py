"""A model judged on a split, called directly (evaluation.py): the report, its files, the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ONE, untrained
from distseq.errors import ConfigError
from distseq.evaluate.judging import Judging, evaluate, table
from distseq.score.metrics import count_video, summarize
from streams import N_VAL


def test_a_split_s_report_and_its_files(shards: Path, tmp_path: Path) -> None:
    loaded = untrained(shards, ["phase0", "phase1", "phase2"])
    split = f"{shards}/val-{{000000..000001}}.tar"
    report = evaluate(loaded, split, "", Judging(2.0), 1.0, tmp_path, ONE)
    assert report["videos"] == N_VAL and (report["fps"], report["relaxed_frames"]) == (1.0, 2)
    # As JSON text, where a phase never predicted (precision NaN) equals itself.
    assert json.dumps(json.loads((tmp_path / "eval.json").read_text())) == json.dumps(report)
    assert sorted(p.stem for p in tmp_path.glob("*.csv")) == [f"val-{i:06d}" for i in range(N_VAL)]
    with pytest.raises(ConfigError, match="are not the model's"):
        evaluate(untrained(shards, ["x", "y", "z"]), split, "", Judging(), None, tmp_path, ONE)


def test_the_table_lays_out_what_papers_report() -> None:
    # One video of 4 frames, truth 0 0 1 1, predicted 0 1 1 1: accuracy 3/4; phase 0 has
    # precision 1/1, recall 1/2; phase 1 precision 2/3, recall 2/2. Phase 2 is absent: n/a.
    counts = count_video("v", [0, 1, 1, 1], [0, 0, 1, 1], 3)
    report = {"classes": ["a", "b", "c"], "protocol": "distseq", "fps": 1.0}
    report |= {"relaxed_seconds": 0.0, "relaxed_frames": 0, "background": []}
    report |= summarize([counts], ["a", "b", "c"])
    lines = table(report).splitlines()
    assert lines[0] == "1 videos, fps 1.0, relaxed boundary off, distseq protocol"
    assert lines[2].split() == ["accuracy", "75.00", "±", "0.00"]
    assert lines[9].split() == ["a", "100.00", "50.00", "50.00", "66.67"]
    assert lines[10].split() == ["b", "66.67", "100.00", "66.67", "80.00"]
    assert lines[11].split() == ["c", "n/a", "n/a", "n/a", "n/a"]
    # Segments: truth a a b b, prediction a b b b: a [0, 1) has IoU 1/2 with a [0, 2), b [1, 4)
    # 2/3 with b [2, 4): both match at 0.1 to 0.5, edit 100.
    assert lines[-1] == (
        "segments (strict, background: none): edit 100.00 ± 0.00, "
        "F1@10 100.00, F1@25 100.00, F1@50 100.00"
    )


def test_split_test_is_the_test_shards_of_the_model_s_manifest(
    shards: Path, tmp_path: Path
) -> None:
    # A copy of the shards whose second val shard is the test split (as distseq shard
    # --test-list writes it): --split test takes it, from the manifest beside data.train.
    data = tmp_path / "data"
    data.mkdir()
    for shard in shards.glob("*.tar"):
        name = "test-000000.tar" if shard.name == "val-000001.tar" else shard.name
        (data / name).write_bytes(shard.read_bytes())
    index = json.loads((shards / "index.json").read_text())
    info = index["shards"].pop("val-000001.tar")
    index["shards"]["test-000000.tar"] = {**info, "split": "test"}
    (data / "index.json").write_text(json.dumps(index))
    loaded = untrained(data, ["phase0", "phase1", "phase2"])
    report = evaluate(loaded, "test", "", Judging(), 1.0, tmp_path / "t", ONE)
    assert report["videos"] == info["samples"] == N_VAL - 3  # val-000000 holds 3 of the 5
    assert sorted(p.stem for p in (tmp_path / "t").glob("*.csv")) == ["val-000003", "val-000004"]
    index["shards"] = {k: v for k, v in index["shards"].items() if v["split"] != "train"}
    (data / "index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match="lists no train shards"):
        evaluate(loaded, "train", "", Judging(), 1.0, tmp_path / "t", ONE)
