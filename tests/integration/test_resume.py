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
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import (
    REPO,
    WORKERS,
    assert_identical,
    free_port,
    full_state,
    launch_torchrun,
    random_batch,
    run_distseq,
    sigterm_group_at_step,
    tiny_config,
)
from distseq.checkpoint.command import add_parser, run
from distseq.checkpoint.export import load_exported
from distseq.errors import TrainingError
from distseq.model.video import build_model

# Dropout draws from torch's RNG every step and a loader worker runs the stream, so an exact
# resume needs the RNG states and the data position, not only the weights.
# train.ema: the weight average (in every checkpoint) must resume bit-identical too.
BASE = ["train.steps=4", "train.save_every=2", "model.head.dropout=0.3", "data.num_workers=1"]
BASE += ["train.ema=0.9"]
STEPS = 4
TIMINGS = {"frames_per_s", "step_seconds", "data_wait_fraction"}  # differ between two runs


def launch(
    reference: Path, run_dir: Path, nproc: int, mode: str, *overrides: str, restarts: int = 0
) -> subprocess.CompletedProcess[str]:
    """``torchrun`` the training script on the reference's config, writing to ``run_dir``."""
    rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    return launch_torchrun(
        WORKERS / "train_with_faults.py",
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
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in records]


def latest(run_dir: Path) -> str:
    return (run_dir / "checkpoints" / "latest").read_text().strip()


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
    assert names == ["best", "latest", "step_00000003", "step_00000004"]  # best: step 4's


def test_batchnorm_statistics_are_one_across_ranks_and_resume_exactly(
    reference: Path, tmp_path: Path
) -> None:
    # Each rank's BatchNorm statistics follow its own frames; FSDP2 does not sync buffers.
    bn = ["model.backbone.norm=batchnorm"]
    straight = tmp_path / "straight"
    straight.mkdir()
    succeeded(launch(reference, straight, 2, "record_bn", *bn))
    for step in (2, 4):
        ranks = [torch.load(straight / f"bn_{r}_{step}.pt", weights_only=True) for r in (0, 1)]
        assert len(ranks[0]) == 2 * 2  # tiny_cnn's 2 BatchNorm layers, mean and variance
        assert_identical(ranks[0], ranks[1])
        assert not torch.equal(ranks[0]["backbone.1.running_var"], torch.ones(16))  # trained
    run = tmp_path / "run"
    run.mkdir()
    succeeded(launch(reference, run, 2, "plain", *bn, "train.stop_after=3"))
    succeeded(launch(reference, run, 2, "plain", *bn))
    assert_same_run(run, straight)


def test_a_signal_to_one_rank_stops_all_with_a_checkpoint(reference: Path, tmp_path: Path) -> None:
    stopped = launch(reference, tmp_path, 2, "term_rank1")
    assert stopped.returncode != 0
    assert "stopped on request after step 3, saved; run again to resume" in stopped.stderr
    assert latest(tmp_path) == "step_00000003"  # rank 0 got no signal, yet took part in the save
    resumed = succeeded(launch(reference, tmp_path, 2, "plain"))
    assert "at step 3" in resumed.stderr
    assert_same_run(tmp_path, reference)


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


def loaded_state(run_dir: Path, rank: int) -> dict[str, Any]:
    """Model, optimizer and weight average as rank ``rank`` held them right after loading
    (``record_load``)."""
    state = torch.load(run_dir / f"loaded_{rank}.pt", weights_only=True)
    return {key: state[key] for key in ("model", "optim", "ema")}


def test_checkpoint_reshards_to_another_world_size(reference: Path, tmp_path: Path) -> None:
    step2 = "checkpoints/step_00000002"
    shutil.copytree(reference / step2, tmp_path / step2)
    (tmp_path / "checkpoints" / "latest").write_text("step_00000002\n")

    one = succeeded(launch(reference, tmp_path, 1, "record_load", "train.stop_after=3"))
    assert "saved with 2 data-parallel ranks, resuming with 1" in one.stderr
    # One rank now holds the whole of what two ranks saved, every tensor exactly.
    assert_identical(loaded_state(tmp_path, 0), full_state(reference / step2))

    two = succeeded(launch(reference, tmp_path, 2, "record_load"))
    assert "saved with 1 data-parallel rank, resuming with 2" in two.stderr
    assert "ranks 1 and up re-seed" in two.stderr
    saved_by_one = full_state(tmp_path / "checkpoints/step_00000003")
    for rank in (0, 1):
        assert_identical(loaded_state(tmp_path, rank), saved_by_one)
    steps = [r for r in history(tmp_path) if "loss" in r]
    assert [r["step"] for r in steps] == [3, 4]


def test_export_predicts_as_the_trained_model(reference: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    out = tmp_path / "model.pt"
    run(parser.parse_args(["export", str(reference), "--out", str(out)]))

    blob = torch.load(out, weights_only=True)
    assert blob["step"] == STEPS and blob["classes"] == ["phase0", "phase1", "phase2"]
    assert blob["config"]["model"]["head"]["dropout"] == 0.3
    # Canonical keys: a model built plainly, with no memory policy, takes the file as it is.
    loaded = load_exported(out)
    plain = build_model(loaded.config.model, len(loaded.classes))
    plain.load_state_dict(blob["model"], strict=True)
    assert set(blob["model"]) == set(plain.state_dict())
    batch = random_batch(2, 8)
    with torch.no_grad():
        logits = plain.eval()(batch.frames, batch.mask)
    # The trained 2-rank FSDP2 model's own output with its weight average in place (train.ema:
    # what export writes); other thread counts may round differently.
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
    from distseq.train.loop import train

    # One intra-op thread, as the torchrun tests have (OMP_NUM_THREADS=1): with two, a kernel
    # that splits its work across threads rounded differently while the loader workers took
    # the cores, and two straight runs differed in the 7th digit of step 6's gradient norm.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_config(config, list(overrides)))
    finally:
        torch.set_num_threads(threads)


def test_ordered_mode_resumes_with_the_carried_rnn_states(shards: Path, tmp_path: Path) -> None:
    # Windows of 4 frames out of 9-12-frame videos: at the stop after step 3 most lanes are in
    # the middle of a video, so resuming without their carried states would change the losses.
    config = tiny_config(tmp_path, shards)
    common = ["data.ordered=true", "data.window=4", "data.num_workers=2", "train.steps=6"]
    common += ["model.head.dropout=0.3", "data.val="]
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
    # As SLURM preempting an sbatch job that runs torchrun: SIGTERM reaches every process of the
    # job, the agent (which passes it on), the ranks and their loader workers.
    config = tiny_config(tmp_path, shards)
    run = tmp_path / "run"
    argv = [str(config), "train.steps=500", "data.num_workers=1", f"train.out_dir={run}"]
    code, err = sigterm_group_at_step("train", *argv, cwd=tmp_path, run=run, torchrun=2)
    assert code != 0
    stopped = re.findall(r"\(rank (\d)\): stopped on request after step (\d+), saved", err)
    assert sorted(rank for rank, _ in stopped) == ["0", "1"], err[-3000:]
    assert "killed by signal" not in err, err[-3000:]
    step = int(stopped[0][1])
    assert 2 <= step < 500 and latest(run) == f"step_{step:08d}"


def test_a_budgeted_run_killed_and_relaunched_is_the_straight_run(
    shards: Path, tmp_path: Path
) -> None:
    # With BatchNorm the chunk size is part of the model: its statistics are per chunk. The run
    # plans once, records it, and a relaunch plans from the record, even where the config's
    # memory.chunk_frames now says otherwise.
    config = str(tiny_config(tmp_path, shards))
    argv = ["memory.budget=1GB", "model.backbone.norm=batchnorm", "train.steps=5", "data.val="]
    argv += ["train.save_every=1", "data.num_workers=0"]
    runs = {name: tmp_path / name for name in ("straight", "killed")}
    straight = run_distseq(
        "train", config, *argv, f"train.out_dir={runs['straight']}", cwd=tmp_path
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distseq",
            "train",
            config,
            *argv,
            f"train.out_dir={runs['killed']}",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pointer = runs["killed"] / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if pointer.exists() and pointer.read_text().strip() >= "step_00000002":
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert latest(runs["killed"]) < "step_00000005", "the run ended before it was killed"
    again = run_distseq(
        "train",
        config,
        *argv,
        f"train.out_dir={runs['killed']}",
        "memory.chunk_frames=1",
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    (line,) = [x for x in again.stdout.splitlines() if x.startswith("memory plan: ")]
    assert line.endswith("(as planned at the run's start)") and " chunk=2: " in line, line
    assert latest(runs["killed"]) == latest(runs["straight"]) == "step_00000005"
    final = full_state(runs["killed"] / "checkpoints" / "step_00000005")
    assert_identical(final, full_state(runs["straight"] / "checkpoints" / "step_00000005"))
