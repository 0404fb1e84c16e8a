"""``distseq demo`` shortened: three models, every column, the table a newcomer sees."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from conftest import run_distseq
from distseq.demo.three_ways import DemoRecord, table


@pytest.mark.slow
def test_a_short_demo_gives_all_three_rows(tmp_path: Path) -> None:
    argv = ["demo", "--out", str(tmp_path / "demo"), "--train-sequences", "16"]
    argv += ["--val-sequences", "8", "--json", "train.steps=2", "data.batch_size=2"]
    proc = run_distseq(*argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["model"] for r in rows] == ["per_frame", "tbptt", "end_to_end"]
    for r in rows:
        assert set(r) == {f.name for f in fields(DemoRecord)}
        assert 0 <= r["memory_accuracy"] == r["accuracy"] <= 1  # all labelled frames need memory
        assert r["step_seconds"] > 0 and r["train_seconds"] > 0
        # Chunks of 64 out of 512 frames: checkpointing keeps far less than plain autograd.
        assert 0 < r["peak_bytes"] < r["plain_peak_bytes"] / 2, r
    for name in ("per_frame", "tbptt", "end_to_end"):
        assert (tmp_path / "demo" / name / "checkpoints" / "latest").is_file()
    # The task's frames are mostly unlabelled; the report leaves them out (white in a ribbon).
    report = run_distseq("report", str(tmp_path / "demo" / "end_to_end"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-3000:]
    assert len(list((tmp_path / "demo" / "end_to_end" / "report" / "ribbons").glob("*.png"))) == 8
    text = table([DemoRecord(**r) for r in rows], 8)
    assert text.splitlines()[0].startswith("recall a cue 200+ frames back: 8 validation sequences")
    names = [line.split()[0] for line in text.splitlines()[2:]]
    assert names == ["per_frame", "tbptt", "end_to_end"]
