"""Stop signals (signals.py): before the first step SIGTERM stops the run at once, wherever it
is (the probe of a memory plan, a restore); from then on a stop waits for the step boundary."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.checkpoint as dcp

from conftest import REPO, sigterm_group_at_step, tiny_config
from distseq.config import load_config
from distseq.memory import probe
from distseq.train.loop import train
from distseq.train.signals import StoppedAtStart, StopSignals


@pytest.fixture
def signals() -> Iterator[None]:
    """StopSignals installs process-wide handlers: put the defaults back after each test."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def test_sigterm_before_the_first_poll_stops_at_once_and_after_it_waits(signals: None) -> None:
    stop = StopSignals()
    with pytest.raises(StoppedAtStart, match="stopped by SIGTERM while starting"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next bytecode: never reached
    assert not stop()  # the first poll, at the boundary before the first step
    os.kill(os.getpid(), signal.SIGTERM)  # from now on recorded, for the next step boundary
    assert stop() and stop.received == {signal.SIGTERM}


def test_sigusr2_waits_for_the_first_step_boundary(signals: None) -> None:
    stop = StopSignals()
    os.kill(os.getpid(), signal.SIGUSR2)
    assert stop() and stop.received == {signal.SIGUSR2}


def _sigterm_then(real: Any) -> Any:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    return wrapped


def test_sigterm_during_the_probe_stops_the_run(
    signals: None, tmp_path: Path, shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(tiny_config(tmp_path, shards), ["memory.budget=1GB", "data.num_workers=0"])
    monkeypatch.setattr(probe, "measure_step", _sigterm_then(probe.measure_step))
    with pytest.raises(StoppedAtStart):
        train(cfg, stop=StopSignals())
    run = tmp_path / "run"
    assert not (run / "plan.json").exists() and not (run / "checkpoints").exists()


def test_sigterm_during_a_restore_stops_the_run_and_keeps_the_checkpoint(
    signals: None, tmp_path: Path, shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tiny_config(tmp_path, shards)
    train(load_config(config, ["data.num_workers=0", "data.val=", "train.stop_after=1"]))
    latest = tmp_path / "run" / "checkpoints" / "latest"
    assert latest.read_text() == "step_00000001\n"
    monkeypatch.setattr(dcp, "load", _sigterm_then(dcp.load))
    with pytest.raises(StoppedAtStart):
        train(load_config(config, ["data.num_workers=0", "data.val="]), stop=StopSignals())
    assert latest.read_text() == "step_00000001\n"
    assert sorted(p.name for p in latest.parent.iterdir()) == ["latest", "step_00000001"]


@pytest.mark.slow
def test_the_command_leaves_at_once_with_one_line(tmp_path: Path, shards: Path) -> None:
    # A probe of 64-frame steps takes seconds: long enough to be in it when the signal comes,
    # which the missing plan line shows.
    config = tiny_config(tmp_path, shards)
    argv = ["memory.budget=1GB", "data.window=64", "memory.chunk_frames=16", "data.val="]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "distseq", "train", str(config), *argv],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    written = tmp_path / "run" / "config.yaml"  # after the handlers are in place
    deadline = time.monotonic() + 120
    while not written.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10  # at once, not after minutes of probing
    assert proc.returncode == 143 and "memory plan:" not in out, out + err
    assert err.splitlines() == [
        "distseq: stopped by SIGTERM while starting (before the first step): nothing to "
        "save; run again to start, or to resume from the last checkpoint"
    ]


@pytest.mark.slow
def test_sigterm_to_the_whole_group_saves_with_loader_workers(tmp_path: Path, shards: Path) -> None:
    # kill -- -PGID, a node shutting down, a wrapper passing the signal on to its group: the
    # loader's worker gets it as well as the trainer. It used to die of it, and the trainer with
    # "DataLoader worker ... is killed by signal", saving nothing.
    config = tiny_config(tmp_path, shards)
    argv = ["train.steps=500", "data.num_workers=1", "data.val="]
    code, err = sigterm_group_at_step(
        "train", str(config), *argv, cwd=tmp_path, run=tmp_path / "run"
    )
    saved = re.fullmatch(
        r"distseq: stopped on request after step (\d+), saved; run again to resume",
        err.splitlines()[-1],
    )
    # 143, as a stop before the first step and a stopped `distseq submit` job: it used to be 1,
    # the code of a failed run.
    assert code == 143 and saved and "Traceback" not in err, err[-3000:]
    latest = tmp_path / "run" / "checkpoints" / "latest"
    assert latest.read_text() == f"step_{int(saved[1]):08d}\n"
