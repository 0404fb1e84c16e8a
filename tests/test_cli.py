"""The command line as users run it: config errors, and a real 2-rank training run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from conftest import REPO, free_port, tiny_config

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def distseq(*args: str, cwd: Path, torchrun: int = 0) -> subprocess.CompletedProcess[str]:
    launcher = [sys.executable, "-m"]
    if torchrun:
        launcher += [
            "torch.distributed.run",
            f"--nproc_per_node={torchrun}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            "-m",
        ]
    return subprocess.run(
        [*launcher, "distseq", *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=600
    )


@pytest.mark.parametrize(
    "override,key",
    [
        ("memory.chunk_size=4", "memory.chunk_size"),  # unknown key
        ("data.frames=many", "data.frames"),  # wrong type
        ("memory.chunk_frames=0", "memory.chunk_frames"),  # out of range
        ("memory.backend=fsdp1", "memory.backend"),  # not a choice
        ("model.backbone.name=resnet7", "model.backbone.name"),
        ("model.backbone.weights=/nonexistent.pth", "model.backbone.weights"),
        ("data.train=", "data.train"),  # no shards at all
        ("data.length_buckets=2 data.ordered=true", "data.length_buckets"),  # keys that clash
    ],
)
def test_config_errors_name_the_key_and_exit_2(
    override: str, key: str, tmp_path: Path, shards: Path
) -> None:
    proc = distseq("train", str(tiny_config(tmp_path, shards)), *override.split(), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    proc = distseq("train", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "nope.yaml" in proc.stderr and "Traceback" not in proc.stderr


def test_torchrun_fsdp_training_run(tmp_path: Path, shards: Path) -> None:
    proc = distseq("train", str(tiny_config(tmp_path, shards)), cwd=tmp_path, torchrun=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [
        json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["loss"] > 0 and r["frames_per_s"] > 0 for r in steps)
    val = [r["val_accuracy"] for r in records if "val_accuracy" in r]
    assert len(val) == 1 and 0.0 <= val[0] <= 1.0
    ckpt = tmp_path / "run/checkpoints"
    assert (ckpt / "latest").read_text().strip() == "step_00000003"
    # the sharded checkpoint holds the whole model: read it back without any process group
    meta = dcp.FileSystemReader(str(ckpt / "step_00000003")).read_metadata()
    keys = set(meta.state_dict_metadata)
    assert "model.encoder.encoder.cnn.conv1.weight" in keys and "model.head.classifier.bias" in keys
    assert torch.Size(meta.state_dict_metadata["model.head.classifier.bias"].size) == (3,)
    # and `distseq export` consolidates it into one file that loads without unpickling code
    proc = distseq(
        "export", str(tmp_path / "run"), "--out", str(tmp_path / "model.pt"), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    exported = torch.load(tmp_path / "model.pt", weights_only=True)
    assert exported["step"] == 3 and exported["model"]["head.classifier.bias"].shape == (3,)


def test_demo_runs_end_to_end_and_reports_both_accuracies(tmp_path: Path) -> None:
    # The README's first command, shortened: the full demo's accuracy is reported in the README.
    proc = distseq("demo", "--out", str(tmp_path / "demo"), "train.steps=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CNN alone (per frame)" in proc.stdout and "CNN+LSTM, end to end" in proc.stdout
    for run in ("cnn_only", "cnn_rnn"):
        assert (tmp_path / "demo" / run / "checkpoints" / "latest").is_file()


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
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
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
