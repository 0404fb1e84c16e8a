"""``distseq bench resume``: a relaunch timed from each step asked for (no timing thresholds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distseq.bench.resume import ResumeBench, bench_resume
from distseq.checkpoint.sharded import latest_checkpoint
from distseq.cli import main


@pytest.mark.slow
def test_each_step_is_trained_to_and_relaunched_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench"
    small = ["data.batch_size=2", "data.num_workers=0", "data.window=32"]
    records = bench_resume(ResumeBench(str(out), [5, 2], 4, False, small))
    assert [r.step for r in records] == [2, 5]
    for r in records:
        assert 0 < r.ready_seconds < r.first_step_seconds
    # The run itself reached the last step; each relaunch was a copy of it, removed after.
    latest = latest_checkpoint(out / "run" / "checkpoints")
    assert latest is not None and latest.name == "step_00000005"
    assert sorted(p.name for p in out.iterdir()) == ["data", "run"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].split() == ["resumed", "at", "step", "ready", "s", "first", "step", "s"]
    assert [line.split()[0] for line in lines[-2:]] == ["2", "5"]


def test_steps_below_one_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", "resume", "--out", str(tmp_path / "b"), "--at-steps", "0", "10"]) == 2
    assert capsys.readouterr().err.strip() == "distseq: error: --at-steps 0 10: give steps >= 1"
    assert not (tmp_path / "b").exists()
