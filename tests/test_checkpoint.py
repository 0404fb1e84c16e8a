"""Checkpoints under real torchrun (gloo, CPU): exact resume after a stop, a killed save or a
torchrun restart; resharding to another world size; export; one-line errors."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from conftest import REPO, free_port, launch_torchrun, random_batch, tiny_config
from distseq.checkpoint import Position, TrainState, latest_checkpoint, save_checkpoint
from distseq.config import Config, OptimConfig
from distseq.export import add_parser, load_exported, run
from distseq.train import TrainingError, build_optimizer

# Dropout draws from torch's RNG every step and a loader worker runs the stream, so an exact
# resume needs the RNG states and the data position, not only the weights.
BASE = ["train.steps=4", "train.save_every=2", "model.head.dropout=0.3", "data.num_workers=1"]
STEPS = 4

# One rank's training process. Faults are injected here, by patching; distseq has no test hooks.
SCRIPT = """
import os, signal, sys
from pathlib import Path

import torch
import torch.distributed.checkpoint.filesystem as dcp_fs

import distseq.train
from conftest import random_batch
from distseq.config import load_config

mode, config, *overrides = sys.argv[1:]
cfg = load_config(config, overrides)
rank = int(os.environ["RANK"])


def die():
    os.kill(os.getpid(), signal.SIGKILL)


if mode == "record":  # keep the trained model's predictions, to check the export against
    save = distseq.train.save_checkpoint

    def save_and_predict(root, state, position, *args):
        path = save(root, state, position, *args)
        if position.step == cfg.train.steps:
            batch = random_batch(2, 8)
            with torch.no_grad():
                logits = state.model.eval()(batch.frames, batch.mask)
            state.model.train()
            if rank == 0:
                torch.save(logits, root.parent / "logits.pt")
        return path

    distseq.train.save_checkpoint = save_and_predict

elif mode == "kill_in_save":  # rank 0 dies after writing shards, before DCP's metadata
    finish = dcp_fs.FileSystemWriter.finish

    def finish_or_die(self, **kwargs):
        if Path(self.path).name == f"step_{cfg.train.steps:08d}.tmp":
            die()
        return finish(self, **kwargs)

    dcp_fs.FileSystemWriter.finish = finish_or_die

elif mode == "kill_rank1_once" and rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    # in its third step, after the checkpoint of step 2; the restarted group must resume there
    step = distseq.train.train_step
    calls = []

    def step_or_die(*args):
        calls.append(1)
        if len(calls) == 3:
            die()
        return step(*args)

    distseq.train.train_step = step_or_die

elif mode == "term_rank1" and rank == 1:  # rank 1 alone is told to stop, during step 3
    step = distseq.train.train_step
    calls = []

    def step_then_term(*args):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(*args)

    distseq.train.train_step = step_then_term

distseq.train.train(cfg, stop=distseq.train.StopSignals())
"""


def launch(
    reference: Path, run_dir: Path, nproc: int, mode: str, *overrides: str, restarts: int = 0
) -> subprocess.CompletedProcess[str]:
    """``torchrun`` the training script on the reference's config, writing to ``run_dir``."""
    script = run_dir / "train_script.py"
    script.write_text(SCRIPT)
    rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    return launch_torchrun(
        script,
        nproc,
        run_dir,
        mode,
        str(reference / "tiny.yaml"),
        f"train.out_dir={run_dir}",
        *BASE,
        *overrides,
        launcher_args=[f"--max-restarts={restarts}", *rendezvous],
    )


def succeeded(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stderr[-5000:]
    return proc


def history(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl without the timings, which differ from run to run."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "frames_per_s"} for r in records]


def latest(run_dir: Path) -> str:
    return (run_dir / "checkpoints" / "latest").read_text().strip()


def full_state(checkpoint: Path) -> dict[str, Any]:
    """Everything in a sharded checkpoint (model and optimizer), read without a process group."""
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(checkpoint, Path(tmp) / "full.pt")
        return torch.load(Path(tmp) / "full.pt", weights_only=True)


def assert_identical(a: Any, b: Any, key: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), key
        for k in a:
            assert_identical(a[k], b[k], f"{key}.{k}")
    elif isinstance(a, torch.Tensor):
        same = torch.equal(a, b)
        assert same, key
    else:
        assert a == b, key


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """Bit-identical to the uninterrupted reference: parameters, optimizer state, every loss."""
    assert latest(run_dir) == latest(reference) == f"step_{STEPS:08d}"
    final = full_state(run_dir / "checkpoints" / latest(run_dir))
    assert_identical(final, full_state(reference / "checkpoints" / latest(reference)))
    assert history(run_dir) == history(reference)
    assert not list((run_dir / "checkpoints").glob("*.tmp"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """The uninterrupted 2-rank run that the others must reproduce; its config is theirs."""
    run_dir = tmp_path_factory.mktemp("reference")
    tiny_config(run_dir, request.getfixturevalue("shards"))
    succeeded(launch(run_dir, run_dir, 2, "record"))
    assert [r["step"] for r in history(run_dir) if "loss" in r] == [1, 2, 3, 4]
    return run_dir


def test_stopped_run_resumes_bit_identical(reference: Path, tmp_path: Path) -> None:
    # Stopping after step 3 leaves the LR schedule, which decays to train.steps, as it was.
    succeeded(launch(reference, tmp_path, 2, "plain", "train.stop_after=3"))
    assert latest(tmp_path) == "step_00000003"
    resumed = succeeded(launch(reference, tmp_path, 2, "plain", "train.keep_last=2"))
    assert "resuming from" in resumed.stderr and "at step 3" in resumed.stderr
    assert_same_run(tmp_path, reference)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step_00000003", "step_00000004"]


def test_a_signal_to_one_rank_stops_all_with_a_checkpoint(reference: Path, tmp_path: Path) -> None:
    stopped = launch(reference, tmp_path, 2, "term_rank1")
    assert stopped.returncode != 0
    assert "stopped on request after step 3, saved; run again to resume" in stopped.stderr
    assert latest(tmp_path) == "step_00000003"  # rank 0 got no signal, yet took part in the save
    resumed = succeeded(launch(reference, tmp_path, 2, "plain"))
    assert "at step 3" in resumed.stderr
    assert_same_run(tmp_path, reference)


def test_every_crash_window_of_a_save_leaves_latest_complete(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    optimizer, schedule = build_optimizer(model, OptimConfig(), total_steps=10)
    state = TrainState(model, optimizer, schedule, Config(), ["a", "b"])
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        save_checkpoint(root, state, Position(step=step), {}, keep_last=2)
    # Killed while writing step 3; killed at step 4 between the rename and the pointer update.
    (root / "step_00000003.tmp").mkdir()
    shutil.copytree(root / "step_00000002", root / "step_00000004")
    (root / "latest.tmp").write_text("step_00000004\n")
    assert latest_checkpoint(root) == root / "step_00000002"
    # Resumed from step 2, the run saves step 3; step 4 is from the run it replaced.
    save_checkpoint(root, state, Position(step=3), {}, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000002", "step_00000003"]
    assert latest_checkpoint(root) == root / "step_00000003"


def test_killed_save_leaves_the_previous_checkpoint(reference: Path, tmp_path: Path) -> None:
    killed = launch(reference, tmp_path, 2, "kill_in_save")
    assert killed.returncode != 0, killed.stderr[-3000:]
    partial = tmp_path / "checkpoints" / f"step_{STEPS:08d}.tmp"
    assert partial.is_dir() and not (partial / ".metadata").exists()
    assert latest(tmp_path) == "step_00000002"

    resumed = succeeded(launch(reference, tmp_path, 2, "plain"))
    assert "at step 2" in resumed.stderr
    assert_same_run(tmp_path, reference)


def test_torchrun_restart_resumes_from_the_last_checkpoint(reference: Path, tmp_path: Path) -> None:
    proc = succeeded(launch(reference, tmp_path, 2, "kill_rank1_once", restarts=1))
    assert "at step 2" in proc.stderr  # the restarted group resumed from step 2's checkpoint
    assert_same_run(tmp_path, reference)


def test_checkpoint_reshards_to_another_world_size(reference: Path, tmp_path: Path) -> None:
    step2 = "checkpoints/step_00000002"
    shutil.copytree(reference / step2, tmp_path / step2)
    (tmp_path / "checkpoints" / "latest").write_text("step_00000002\n")

    one = succeeded(launch(reference, tmp_path, 1, "plain", "train.stop_after=3"))
    assert "saved with world size 2, resuming with 1" in one.stderr
    two = succeeded(launch(reference, tmp_path, 2, "plain"))
    assert "saved with world size 1, resuming with 2" in two.stderr
    assert "ranks 1 and up re-seed" in two.stderr
    steps = [r for r in history(tmp_path) if "loss" in r]
    assert [r["step"] for r in steps] == [3, 4] and all(r["loss"] > 0 for r in steps)
    start = full_state(reference / step2)["model"]
    end = full_state(tmp_path / "checkpoints/step_00000004")["model"]
    assert not torch.equal(start["head.classifier.weight"], end["head.classifier.weight"])


def test_export_predicts_as_the_trained_model(reference: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    out = tmp_path / "model.pt"
    run(parser.parse_args(["export", str(reference), "--out", str(out)]))

    blob = torch.load(out, weights_only=True)
    assert blob["step"] == STEPS and blob["classes"] == ["phase0", "phase1", "phase2"]
    assert blob["config"]["model"]["head"]["dropout"] == 0.3
    model, _, _ = load_exported(out)
    batch = random_batch(2, 8)
    with torch.no_grad():
        logits = model(batch.frames, batch.mask)
    # The trained 2-rank FSDP2 model's own output; other thread counts may round differently.
    expected = torch.load(reference / "logits.pt", weights_only=True)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)


def test_unreadable_checkpoint_is_one_line(reference: Path, tmp_path: Path) -> None:
    broken = tmp_path / "step_00000004"
    shutil.copytree(reference / "checkpoints" / "step_00000004", broken)
    shard = next(broken.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(TrainingError, match=re.escape(f"checkpoint {broken} is unreadable")) as e:
        run(argparse.Namespace(checkpoint=str(broken), out=str(tmp_path / "model.pt")))
    assert "\n" not in str(e.value)
    with pytest.raises(TrainingError, match=re.escape(f"no checkpoint at {tmp_path}")):
        run(argparse.Namespace(checkpoint=str(tmp_path), out=str(tmp_path / "model.pt")))


def test_resuming_another_model_is_one_line(reference: Path, tmp_path: Path) -> None:
    shutil.copytree(reference / "checkpoints", tmp_path / "checkpoints")
    config = [str(reference / "tiny.yaml"), *BASE, f"train.out_dir={tmp_path}"]
    proc = subprocess.run(
        [sys.executable, "-m", "distseq", "train", *config, "model.head.hidden=32"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "model.head.hidden=16 in the checkpoint, 32 now" in proc.stderr
    assert str(tmp_path / "checkpoints" / "step_00000004") in proc.stderr


def _train_in_process(config: Path, *overrides: str) -> None:
    from distseq.config import load_config
    from distseq.train import train

    train(load_config(config, list(overrides)))


@pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")
def test_ordered_mode_resumes_with_the_carried_rnn_states(shards: Path, tmp_path: Path) -> None:
    # Windows of 4 frames out of 9-12-frame videos: at the stop after step 3 most lanes are in
    # the middle of a video, so resuming without their carried states would change the losses.
    config = tiny_config(tmp_path, shards)
    common = ["data.ordered=true", "data.frames=4", "data.num_workers=2", "train.steps=6"]
    common += ["model.head.dropout=0.3", "data.val=''"]
    _train_in_process(config, *common, f"train.out_dir={tmp_path / 'ref'}")
    run = tmp_path / "run"
    _train_in_process(config, *common, f"train.out_dir={run}", "train.stop_after=3")
    saved = torch.load(run / "checkpoints" / "step_00000003" / "rank0.pt", weights_only=True)
    assert sorted(saved["carries"]) == [0, 1]  # one set of lanes per loader worker
    _train_in_process(config, *common, f"train.out_dir={run}")
    assert history(run) == history(tmp_path / "ref")
    final = [full_state(r / "checkpoints" / "step_00000006") for r in (run, tmp_path / "ref")]
    assert_identical(*final)


def test_sigterm_to_torchrun_saves_before_the_workers_exit(shards: Path, tmp_path: Path) -> None:
    # As SLURM preempting an sbatch job that runs torchrun: the agent passes SIGTERM on.
    config = tiny_config(tmp_path, shards)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    cmd += ["--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "distseq", "train"]
    cmd += [str(config), "train.steps=500", f"train.out_dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        metrics = run / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while not (metrics.exists() and '"step": 2,' in metrics.read_text()):
            assert agent.poll() is None and time.monotonic() < deadline, "training never started"
            time.sleep(0.2)
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=120)
    finally:
        agent.kill()
    assert agent.returncode != 0
    stopped = re.findall(r"\(rank (\d)\): stopped on request after step (\d+), saved", err)
    assert sorted(rank for rank, _ in stopped) == ["0", "1"], err[-3000:]
    step = int(stopped[0][1])
    assert 2 <= step < 500 and latest(run) == f"step_{step:08d}"
