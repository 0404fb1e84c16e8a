"""A torchrun agent killed with SIGKILL takes its distseq workers with it, within seconds,
whether they are starting up or training. (torchrun starts each worker in a session of its own,
so nothing else would stop them.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, free_port, tiny_config

GONE_WITHIN_S = 10.0


def children(pid: int) -> list[int]:
    """Processes whose parent is ``pid``, from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == pid:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Running, not exited (an exited orphan may wait as a zombie for its new parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.1)


@pytest.mark.parametrize("when", ["starting", "training"])
def test_workers_exit_when_their_agent_is_killed(when: str, tmp_path: Path, shards: Path) -> None:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    cmd += ["--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "distseq", "train"]
    cmd += [str(tiny_config(tmp_path, shards)), "train.steps=1000", f"train.out_dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    log = tmp_path / "workers.log"
    with log.open("w") as err:
        agent = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
    workers: list[int] = []
    try:
        wait_for(lambda: len(children(agent.pid)) == 2, 60, "two workers")
        workers = children(agent.pid)
        if when == "starting":
            time.sleep(1.0)  # importing torch, not yet in the process group
        else:
            metrics = run / "metrics.jsonl"
            wait_for(
                lambda: metrics.exists() and '"step": 2,' in metrics.read_text(), 120, "step 2"
            )
        assert all(alive(pid) for pid in workers)
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        wait_for(lambda: not any(alive(pid) for pid in workers), GONE_WITHIN_S, "workers' exit")
    finally:
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if agent.poll() is None:
            agent.kill()
    lines = log.read_text()
    for rank in (0, 1):
        assert (
            f"distseq: error (rank {rank}): the torchrun agent (pid {agent.pid}) is gone" in lines
        )
