"""``distseq submit``: what it refuses before a job is queued, and the sbatch script it writes
(the jobs themselves run on the CI cluster: tests/integration/test_slurm_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_distseq as distseq
from conftest import tiny_config
from distseq.cli import main


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


def _submit(capsys: pytest.CaptureFixture[str], config: Path, *args: str) -> tuple[int, str, str]:
    """``distseq submit CONFIG ARGS`` in this process: its code, stdout, stderr. Refused, it
    queues nothing, and needs no cluster."""
    code = main(["submit", str(config), *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "overrides,code,said",
    [
        # train's own checks before its first step, on the login node: a job failed on them
        # seconds after its wait in the queue, in a traceback. (A dry run checks no data: it
        # may be made where the data is not.)
        (["data.train=nowhere/train-{000000..000001}.tar"], 1, "nowhere/index.json"),
        (["train.select=max val_mAP"], 2, "config key train.select='max val_mAP'"),
    ],
)
def test_submit_refuses_what_train_would_refuse_before_its_first_step(
    overrides: list[str],
    code: int,
    said: str,
    tmp_path: Path,
    shards: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    got, out, err = _submit(capsys, tiny_config(tmp_path, shards), *overrides)
    assert (got, out) == (code, "")
    assert err.count("\n") == 1 and said in err, err


@pytest.mark.parametrize("time", ["00:02:00", "00:01:30"])  # SLURM rounds the seconds up
def test_submit_refuses_a_signal_delay_as_long_as_the_time_limit(
    time: str, tmp_path: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # SLURM would signal each run of the job as it starts: it saved and requeued itself every
    # ~40 s until train.max_requeues ran out, without a word.
    code, out, err = _submit(capsys, tiny_config(tmp_path, shards), "--time", time, "--dry-run")
    assert (code, out, err.count("\n")) == (2, "", 1), err
    assert err.startswith("distseq: error: --signal-delay 120: ") and (
        f"shorter than --time {time} (120 s)" in err
    ), err
