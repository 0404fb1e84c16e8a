"""Shared helpers: real torchrun launches and tiny models that run in seconds on 2 CPU cores."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from distseq.config import (
    BackboneConfig,
    Backend,
    HeadConfig,
    MemoryConfig,
    ModelConfig,
    Norm,
)
from distseq.data import IGNORE_INDEX, Batch
from distseq.memory import apply_memory_policy
from distseq.model import VideoModel, build_model

REPO = Path(__file__).resolve().parents[1]


def tiny_model(
    backend: str = "torch",
    chunk: int = 4,
    *,
    backbone: str = "resnet18",
    norm: str = "groupnorm",
    classes: int = 3,
    seed: int = 0,
    **head: object,
) -> VideoModel:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        backbone=BackboneConfig(name=backbone, norm=Norm(norm)),
        head=HeadConfig(**{"hidden": 16, **head}),  # type: ignore[arg-type]
    )
    model = build_model(cfg, classes)
    return apply_memory_policy(model, MemoryConfig(backend=Backend(backend), chunk_frames=chunk))


def random_batch(
    b: int,
    t: int,
    size: int = 32,
    lengths: list[int] | None = None,
    seed: int = 1,
    classes: int = 3,
) -> Batch:
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (b, t, 3, size, size), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, classes, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.bool)
    for i, n in enumerate(lengths or []):
        mask[i, n:] = False
    labels[~mask] = IGNORE_INDEX
    return Batch(frames, labels, mask)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def report(record: dict) -> None:
    """Called by a rank inside a torchrun script: one result file per rank, so that ranks'
    output never interleaves."""
    rank = int(os.environ["RANK"])
    Path(f"result_{rank}.json").write_text(json.dumps({"rank": rank, **record}))


def torchrun(
    script: str, nproc: int, tmp_path: Path, *args: str, timeout: float = 300
) -> list[dict]:
    """Run ``script`` under a real ``torchrun --nproc_per_node=nproc`` (gloo, CPU) in tmp_path.

    Each rank calls :func:`report`; the records come back in rank order.
    """
    path = tmp_path / f"script_{nproc}.py"
    path.write_text(textwrap.dedent(script))
    for old in tmp_path.glob("result_*.json"):
        old.unlink()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(path),
        *args,
    ]
    # A new session, so that a timeout kills the workers too, not only torchrun.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun timed out after {timeout} s:\n{out[-3000:]}\n{err[-5000:]}")
    if proc.returncode != 0:
        pytest.fail(f"torchrun failed ({proc.returncode}):\n{out[-3000:]}\n{err[-5000:]}")
    return [json.loads((tmp_path / f"result_{r}.json").read_text()) for r in range(nproc)]
