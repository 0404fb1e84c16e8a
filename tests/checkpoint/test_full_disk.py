"""A save that does not fit: one line that says the device is full and by how much, the partial
save removed, and a relaunch with room goes on from the last complete checkpoint."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import run_distseq, tiny_config

# The tiny model's checkpoint (tiny_cnn + LSTM, AdamW) is about 230 KB: one fits, two do not.
SMALL, ROOMY = "400k", "2m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of SMALL bytes: a real filesystem that fills up, as a scratch disk does."""
    if os.geteuid() != 0:
        pytest.skip("mounts a tmpfs, which needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL}", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


@pytest.mark.slow
def test_a_full_disk_says_so_cleans_up_and_resumes(
    small_disk: Path, tmp_path: Path, shards: Path
) -> None:
    run = small_disk / "run"
    args = ["train", str(tiny_config(tmp_path, shards)), f"train.out_dir={run}"]
    args += ["train.steps=4", "train.save_every=2", "data.val="]
    full = run_distseq(*args, cwd=tmp_path)
    assert full.returncode == 1, full.stderr[-3000:]
    errors = [line for line in full.stderr.split("\n") if line.startswith("distseq: error")]
    assert len(errors) == 1 and "Traceback" not in full.stderr, full.stderr[-3000:]
    error = errors[0]
    assert "checkpoint step_00000004.tmp could not be written: the device of" in error
    numbers = re.search(
        r"is full \(([\d.]+) MB free; one checkpoint needs about ([\d.]+) MB", error
    )
    assert numbers is not None, error
    free, need = (float(x) * 10**6 for x in numbers.groups())
    assert "train.keep_last=3 of them plus the one being written must fit" in error
    assert error.endswith("resumes from step_00000002")
    # The partial save is gone; the estimate is what a checkpoint really takes, and the free
    # space is what is left beside the complete one.
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_00000002"]
    saved = sum(f.stat().st_size for f in (checkpoints / "step_00000002").iterdir())
    assert 0.9 * saved < need < 1.1 * saved
    assert free == pytest.approx(shutil.disk_usage(small_disk).free, rel=0.01) and free < need

    remount = ["mount", "-o", f"remount,size={ROOMY}", str(small_disk)]
    subprocess.run(remount, check=True)
    resumed = run_distseq(*args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 2" in resumed.stderr
    assert (checkpoints / "latest").read_text() == "step_00000004\n"
