"""``distseq submit``: what it refuses before a job is queued, and the sbatch script it writes
(the jobs themselves run on the CI cluster: tests/integration/test_slurm_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_distseq as distseq
from conftest import tiny_config


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["memory.tbptt_frames=64", "model.head.bidirectional=true"], "memory.tbptt_frames"),
        (["parallel.precision=bf16", "parallel.mode=ddp"], "parallel.precision"),
        (["parallel.sequence=3"], "parallel.sequence"),  # one rank: 3 does not divide it
    ],
)
def test_submit_refuses_a_config_that_would_fail_on_the_cluster(
    overrides: list[str], key: str, tmp_path: Path, shards: Path
) -> None:
    config = str(tiny_config(tmp_path, shards))
    proc = distseq("submit", config, *overrides, "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and f"config key {key}=" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_submit_dry_run_shows_the_sbatch_script(tmp_path: Path, shards: Path) -> None:
    config = str(tiny_config(tmp_path, shards))
    proc = distseq(
        "submit",
        config,
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--partition",
        "gpu",
        "--time",
        "1-00:30:00",
        "--account",
        "lab",
        "--dry-run",
        "parallel.sequence=2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash")  # the plan line is beside it, on stderr
    assert "each video's frames split across ranks 0-1, 2-3, 4-5, " in proc.stderr
    for line in (
        "--nodes=2",
        "--ntasks-per-node=8",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--time=1470",
        "--account=lab",
        "--signal=USR2@120",
    ):
        assert f"#SBATCH {line}" in proc.stdout, line
    bad = distseq("submit", config, "--time", "1 day", "--dry-run", cwd=tmp_path)
    assert bad.returncode == 2 and "--time" in bad.stderr
