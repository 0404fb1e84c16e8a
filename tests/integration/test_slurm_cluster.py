"""Tests against a real single-node SLURM cluster, through submitit.

Start the cluster first (Debian/Ubuntu, as root; about 30 s the first time, 2 s after):

    .ci/slurm.sh up && . /tmp/distseq-slurm/env
    pytest tests/test_slurm_cluster.py -v
    .ci/slurm.sh down

Without `sbatch` on the PATH and SLURM_CONF set these tests skip, except under CI=true, where
they fail, so that a CI job that was meant to have a cluster cannot pass without one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle  # a dependency of submitit
import pytest
import submitit
from submitit.slurm.slurm import SlurmJob

from conftest import REPO, launch_torchrun, tiny_config

# The jobs unpickle the functions below in a fresh interpreter, where this test module (imported
# by pytest from its rootdir) cannot be imported by name: pickle them by value instead.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

JOB_TIMEOUT_S = 90  # bound on every wait for a job; each test takes ~5-20 s on a 2-CPU machine


# --- helpers (shared by the cluster tests) ----------------------------------------------------


def _executor(folder: Path, **params: object) -> submitit.AutoExecutor:
    executor = submitit.AutoExecutor(folder=folder)
    assert executor.cluster == "slurm", f"AutoExecutor picked {executor.cluster!r}, not slurm"
    defaults = dict(
        slurm_partition="debug",
        timeout_min=3,
        nodes=1,
        tasks_per_node=1,
        cpus_per_task=1,
        name="distseq-test",
    )
    executor.update_parameters(**{**defaults, **params})
    return executor


def _wait(job: submitit.Job, timeout_s: float = JOB_TIMEOUT_S) -> list:
    """job.results() with a bound: without accounting submitit would wait forever for a job
    that died without writing a result (its state reads UNKNOWN)."""
    deadline = time.monotonic() + timeout_s
    while not job.done():
        if time.monotonic() > deadline:
            job.cancel(check=False)
            logs = "\n".join(f"--- {name} ---\n{text}" for name, text in _logs(job).items())
            pytest.fail(
                f"job {job.job_id} not done after {timeout_s:.0f} s (state {job.state});\n{logs}"
            )
        time.sleep(0.5)
    return job.results()


def _logs(job: submitit.Job) -> dict[str, str]:
    out = {}
    for path in sorted(Path(job.paths.folder).glob(f"{job.job_id}_*_log.*")):
        out[path.name] = path.read_text(errors="replace")[-3000:]
    return out


def _sacct_states(job_id: str, timeout_s: float = 30) -> list[str]:
    """The states slurmdbd recorded for the job, one per run (requeues included), once the last
    run has ended; [] without accounting (sacct fails). Results can come back before the job
    has ended, so this waits, bounded, for a final state."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(
            ["sacct", "-n", "-P", "--duplicates", "--allocations", "-j", job_id, "-o", "State"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        if out.returncode != 0:
            return []
        states = out.stdout.split()
        if states and states[-1] not in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED"):
            return states
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} still {states} in sacct after {timeout_s:.0f} s")
        time.sleep(0.5)


# --- job functions (run on the cluster) -------------------------------------------------------


def _gloo_all_reduce() -> dict:
    import torch
    import torch.distributed as dist

    # Single-node cluster: keep gloo on loopback even where the hostname resolves elsewhere.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    dist.init_process_group(backend="gloo", init_method="env://")
    try:
        value = torch.tensor([float(10**env.rank)])  # rank 0 -> 1, rank 1 -> 10
        total = value.clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        gathered = [torch.zeros(1) for _ in range(env.world_size)]
        dist.all_gather(gathered, value)
    finally:
        dist.destroy_process_group()
    return {
        "rank": env.rank,
        "local_rank": env.local_rank,
        "world_size": env.world_size,
        "master": f"{env.master_addr}:{env.master_port}",
        "sum": total.item(),
        "gathered": [t.item() for t in gathered],
        "job_id": os.environ["SLURM_JOB_ID"],
    }


class _SlowCounter(submitit.helpers.Checkpointable):
    """Runs until it has been requeued once: the first run sleeps until the test interrupts it;
    the run after the requeue finishes at once. Each run appends a line to `progress`."""

    def __init__(self, progress: str) -> None:
        self.progress = progress

    def __call__(self) -> dict:
        env = submitit.JobEnvironment()
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        path = Path(self.progress)
        with path.open("a") as f:
            f.write(f"start job={env.job_id} restart={restarts} pid={os.getpid()}\n")
        runs = path.read_text().count("start ")
        if runs == 1:
            time.sleep(300)  # interrupted and requeued long before this ends
            raise RuntimeError("first run was never interrupted")
        with path.open("a") as f:
            f.write(f"done restart={restarts}\n")
        return {"runs": runs, "restart_count": restarts, "job_id": env.job_id}


# --- tests ------------------------------------------------------------------------------------


def test_two_task_gloo_all_reduce(slurm: Path) -> None:
    executor = _executor(slurm, tasks_per_node=2)
    job = executor.submit(_gloo_all_reduce)
    results = _wait(job)

    assert len(results) == 2, results
    by_rank = {r["rank"]: r for r in results}
    assert sorted(by_rank) == [0, 1]
    for rank, r in by_rank.items():
        assert r["world_size"] == 2
        assert r["local_rank"] == rank
        assert r["sum"] == 11.0, r
        assert r["gathered"] == [1.0, 10.0], r
        assert r["job_id"] == job.job_id
    assert by_rank[0]["master"] == by_rank[1]["master"]
    states = _sacct_states(job.job_id)
    if states:  # accounting on
        assert states == ["COMPLETED"], states


@pytest.mark.alone
def test_checkpointable_requeue(slurm: Path, tmp_path: Path) -> None:
    progress = tmp_path / "progress.txt"
    executor = _executor(slurm)
    job = executor.submit(_SlowCounter(str(progress)))

    # Wait for the first run to start, then preempt it as SLURM would.
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (progress.exists() and "start " in progress.read_text()):
        if time.monotonic() > deadline:
            job.cancel(check=False)
            pytest.fail(f"job {job.job_id} did not start in {JOB_TIMEOUT_S} s: {_logs(job)}")
        time.sleep(0.2)
    time.sleep(1.0)  # margin: submitit's handlers are set before the function starts
    assert isinstance(job, SlurmJob), type(job)
    job._interrupt()  # SIGTERM then USR2 -> checkpoint() -> scontrol requeue

    result = _wait(job)[0]
    lines = progress.read_text().splitlines()
    starts = [line for line in lines if line.startswith("start ")]
    assert len(starts) == 2, lines
    assert result["runs"] == 2
    assert result["restart_count"] >= 1, (result, lines)  # SLURM counted the requeue
    assert result["job_id"] == job.job_id  # same job, requeued rather than resubmitted
    assert lines[-1].startswith("done "), lines
    log = "".join(_logs(job).values())
    assert f"Requeued job {job.job_id}" in log, log  # submitit's checkpoint-and-requeue ran
    states = _sacct_states(job.job_id)
    if states:  # accounting on: the first run is recorded as REQUEUED
        assert states[0] in ("REQUEUED", "PREEMPTED"), states
        assert states[-1] == "COMPLETED", states


def test_distseq_submit_trains_on_two_tasks(slurm: Path, tmp_path: Path, shards: Path) -> None:
    """The README's SLURM line on two tasks, each video split across both (parallel.sequence),
    as submit's plan says before it queues the job and the job's ranks say as they start."""
    config = tiny_config(tmp_path, shards)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "distseq", "submit", str(config), "--tasks-per-node", "2"]
    cmd += ["--partition", "debug", "--time", "00:05:00", "--folder", str(slurm), "--wait"]
    cmd += ["parallel.sequence=2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=JOB_TIMEOUT_S * 2)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "submitted job" in proc.stdout and "stdout:" in proc.stdout, proc.stdout
    split = "parallel.sequence=2: each video's frames split across ranks 0-1"
    assert split in proc.stdout, proc.stdout[-2000:]  # the plan, before the job
    assert split in "".join(p.read_text() for p in slurm.glob("*_0_log.out")), "the job's rank 0"
    run = tmp_path / "run"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r] == [1, 2, 3]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000003"


# --- distseq submit: stopping on SLURM's signals -----------------------------------------------


def _submit_tiny(
    tmp_path: Path, shards: Path, folder: Path, tasks: int, *overrides: str
) -> tuple[SlurmJob, Path]:
    from distseq.launch.slurm import SlurmOptions, submit

    config = tiny_config(tmp_path, shards)
    opts = SlurmOptions(tasks_per_node=tasks, partition="debug", time="00:05:00")
    opts.folder = str(folder)
    job = submit(str(config), list(overrides), opts)
    assert isinstance(job, SlurmJob), type(job)
    return job, tmp_path / "run"


def _wait_for_step(job: SlurmJob, run: Path, step: int) -> None:
    """Until the run's metrics log records ``step``: then the job is inside its training loop."""
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (metrics.exists() and f'"step": {step},' in metrics.read_text()):
        if time.monotonic() > deadline or job.done():
            job.cancel(check=False)
            pytest.fail(f"job {job.job_id} never reached step {step}: {_logs(job)}")
        time.sleep(0.2)


def _saved_step(run: Path) -> int:
    return int((run / "checkpoints" / "latest").read_text().strip().removeprefix("step_"))


@pytest.fixture
def single_threaded(monkeypatch: pytest.MonkeyPatch) -> None:
    # Jobs inherit the submitting environment. One thread per rank makes a SLURM run and a
    # torchrun run of the same config compute bit for bit the same.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))


STEPS = 16
# No periodic checkpoints: a requeued run can only resume from the save on the signal.
UNTIL_THE_END = (f"train.steps={STEPS}", "train.save_every=0")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, shards: Path) -> dict:
    """The parameters of the tiny config run for STEPS steps by 2 ranks under torchrun on this
    host, never interrupted: what every SLURM job of 2 ranks below must end with."""
    from distseq.checkpoint.export import load_model

    tmp = tmp_path_factory.mktemp("uninterrupted")
    config = tiny_config(tmp, shards)
    script = tmp / "ref_train.py"
    script.write_text("import sys\nfrom distseq.cli import main\nsys.exit(main())\n")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GLOO_SOCKET_IFNAME", "lo")
        proc = launch_torchrun(script, 2, tmp, "train", str(config), *UNTIL_THE_END)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_model(tmp / "run").model.state_dict()


def _same_parameters(run: Path, expected: dict) -> None:
    import torch

    from distseq.checkpoint.export import load_model

    got = load_model(run).model.state_dict()
    assert got.keys() == expected.keys()
    for name, value in got.items():
        assert torch.equal(value, expected[name]), f"{name} differs from the uninterrupted run"


def _interrupt_and_finish(job: SlurmJob, run: Path) -> str:
    """Interrupt ``job`` as a preemption once it is training, let it requeue and finish; check
    that it resumed from the step it saved on the signal. Returns its logs."""
    _wait_for_step(job, run, 2)
    job._interrupt()  # SIGTERM then SIGUSR2 to every task, as a preemption
    results = _wait(job)
    assert [r["step"] for r in results] == [STEPS] * len(results), results
    log = "".join(_logs(job).values())
    saved = re.search(r"SIG\w+\+SIG\w+: saved step (\d+), requeued job (\d+) \(1 of", log)
    assert saved, log
    assert saved[2] == job.job_id
    k = int(saved[1])
    assert 2 <= k < STEPS, log
    assert f"resuming from {run / 'checkpoints' / f'step_{k:08d}'} at step {k}" in log, log
    states = _sacct_states(job.job_id)
    if states:
        assert states[0] in ("REQUEUED", "PREEMPTED") and states[-1] == "COMPLETED", states
    return log


@pytest.mark.usefixtures("single_threaded")
@pytest.mark.alone
def test_interrupted_job_saves_on_all_ranks_requeues_and_ends_as_uninterrupted(
    slurm: Path, tmp_path: Path, shards: Path, uninterrupted: dict
) -> None:
    # With a loader worker on each rank, as users run: the signals reach it too.
    job, run = _submit_tiny(tmp_path, shards, slurm, 2, *UNTIL_THE_END, "data.num_workers=1")
    _interrupt_and_finish(job, run)
    _same_parameters(run, uninterrupted)


# --- two nodes: the bed's hosts as SLURM nodes ---------------------------------------------------


def _names_both_nodes(log: str) -> None:
    start = next((line for line in log.splitlines() if "2 nodes, store ds-h1:" in line), None)
    assert start, log
    for k in (1, 2):
        assert f"ds-h{k} 10.77.0.{k} (eth0, GLOO_SOCKET_IFNAME=eth0; rank {k - 1})" in start


@pytest.mark.hosts
@pytest.mark.alone
def test_a_two_node_job_requeued_by_sigusr2_ends_as_one_host_uninterrupted(
    two_nodes: Path, tmp_path: Path, shards: Path, uninterrupted: dict
) -> None:
    from distseq.launch.slurm import SlurmOptions, submit

    config = tiny_config(tmp_path, shards)
    opts = SlurmOptions(nodes=2, tasks_per_node=1, partition="hosts", time="00:05:00")
    opts.folder = str(two_nodes)
    job = submit(str(config), list(UNTIL_THE_END), opts)
    assert isinstance(job, SlurmJob), type(job)
    log = _interrupt_and_finish(job, tmp_path / "run")
    _names_both_nodes(log)
    _same_parameters(tmp_path / "run", uninterrupted)


@pytest.mark.hosts
def test_sbatch_torchrun_runs_one_torchrun_on_each_of_two_nodes(
    two_nodes: Path, tmp_path: Path, shards: Path, uninterrupted: dict
) -> None:
    config = tiny_config(tmp_path, shards)
    two_nodes.mkdir()  # for the job's output; sbatch will not make it
    env = {**os.environ, "NPROC_PER_NODE": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # its torchrun
    cmd = ["sbatch", "--wait", "--partition=hosts", "--nodes=2", "--gpus-per-node=0"]
    cmd += ["--cpus-per-task=1", "--time=5", f"--output={two_nodes / '%j.out'}"]
    cmd += [str(REPO / "launch" / "sbatch_torchrun.sh"), str(config), *UNTIL_THE_END]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=JOB_TIMEOUT_S * 2)
    log = "".join(path.read_text(errors="replace") for path in two_nodes.glob("*.out"))
    assert proc.returncode == 0, proc.stderr + log[-3000:]
    _names_both_nodes(log)
    _same_parameters(tmp_path / "run", uninterrupted)


def _submit_waiting(tmp_path: Path, shards: Path, folder: Path, *args: str) -> subprocess.Popen:
    """``distseq submit --wait`` of the tiny config, as a user runs it, in the background."""
    config = tiny_config(tmp_path, shards)
    cmd = [sys.executable, "-m", "distseq", "submit", str(config), "--partition", "debug"]
    cmd += ["--time", "00:05:00", "--folder", str(folder), "--wait", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _job_of(proc: subprocess.Popen) -> SlurmJob:
    """The job ``_submit_waiting`` queued, from the first line it prints."""
    assert proc.stdout is not None
    said = re.fullmatch(r"submitted job (\d+)\n", proc.stdout.readline())
    assert said, proc.communicate(timeout=JOB_TIMEOUT_S)
    return SlurmJob(folder=proc.args[proc.args.index("--folder") + 1], job_id=said[1])


def _no_traceback(job: SlurmJob) -> str:
    log = "".join(_logs(job).values())
    assert "Traceback" not in log, log
    return log


@pytest.mark.usefixtures("single_threaded")
@pytest.mark.alone
def test_requeues_are_bounded_and_sigterm_alone_saves_and_exits(
    slurm: Path, tmp_path: Path, shards: Path
) -> None:
    # A loader worker, as users run: scancel's SIGTERM reaches it too (it used to die of it).
    steps = ["train.steps=200", "train.max_requeues=0", "data.num_workers=1"]
    job, run = _submit_tiny(tmp_path, shards, slurm, 1, *steps)
    _wait_for_step(job, run, 2)
    subprocess.run(["scancel", "--signal=TERM", job.job_id], check=True)  # a user's SIGTERM
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not job.done(force_check=True):
        if time.monotonic() > deadline:
            job.cancel(check=False)
            pytest.fail(f"job {job.job_id} still running after SIGTERM: {_logs(job)}")
        time.sleep(0.5)
    first = _saved_step(run)
    assert 2 <= first < 200, first
    log = _no_traceback(job)
    assert f"SIGTERM: saved step {first}, exiting; cancelled job {job.job_id}" in log, log
    assert "requeued" not in log, log
    states = _sacct_states(job.job_id)
    if states:  # it was FAILED (exit 143), which a user who stopped it does not expect
        assert states[0] == "CANCELLED", states  # "CANCELLED by UID"

    # Resubmitted with one requeue of its own, it resumes. SLURM requeues it, as a preemption
    # does: that is none of the job's own (SLURM_RESTART_COUNT counted it, and a job preempted
    # twice a day had spent its requeues in days), and the job is not cancelled. SIGUSR2 then
    # requeues it, and next finds its requeue spent: one line in the job's log and from submit
    # --wait, which exits as a stop does. It was two chained submitit tracebacks around the
    # line, and submit --wait said "Job (task=0) failed during processing".
    waiting = _submit_waiting(tmp_path, shards, slurm, *steps[:-2], "train.max_requeues=1")
    job = _job_of(waiting)
    _wait_for_log(job, "resuming from", 1)
    subprocess.run(["scontrol", "requeue", job.job_id], check=True)
    _wait_for_log(job, "resuming from", 2)
    job._interrupt(timeout=True)  # SIGUSR2 only, as before the time limit
    _wait_for_log(job, "resuming from", 3)
    job._interrupt(timeout=True)
    out, err = waiting.communicate(timeout=JOB_TIMEOUT_S)
    saved = _saved_step(run)
    spent = (
        f"job {job.job_id} stopped by SIGUSR2 after saving step {saved}, not requeued: it "
        "requeued itself 1 times (train.max_requeues=1); submit it again to go on"
    )
    assert waiting.returncode == 143 and err == (
        f"distseq: job {job.job_id}: {spent} (log: {job.paths.stderr})\n"
    ), out + err
    log = _no_traceback(job)
    lines = job.paths.stderr.read_text().splitlines()
    assert [line for line in lines if not line.startswith("srun:")][-1] == f"distseq: {spent}"
    assert "cancelled" not in log and f"requeued job {job.job_id} (1 of" in log, log
    states = _sacct_states(job.job_id)
    if states:
        assert states[:2] == ["REQUEUED", "REQUEUED"] and states[-1] == "FAILED", states


def _wait_for_log(job: SlurmJob, text: str, count: int) -> None:
    """Until ``text`` is ``count`` times in the job's first task's stderr, its runs appended."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not (job.paths.stderr.exists() and job.paths.stderr.read_text().count(text) >= count):
        if time.monotonic() > deadline:
            job.cancel(check=False)
            pytest.fail(f"job {job.job_id}: {text!r} not {count} times: {_logs(job)}")
        time.sleep(0.2)


@pytest.mark.usefixtures("single_threaded")
def test_a_config_error_found_in_the_job_is_one_line(
    slurm: Path, tmp_path: Path, shards: Path
) -> None:
    # The model is the job's to make (its weights to fetch, its code to import, where the job
    # runs): a traceback in the log, and submit --wait's line was submitit's.
    backbone = "model.backbone.name=nowhere_module:make_cnn"
    waiting = _submit_waiting(tmp_path, shards, slurm, "--tasks-per-node", "2", backbone)
    job = _job_of(waiting)
    out, err = waiting.communicate(timeout=JOB_TIMEOUT_S)
    said = (
        "config key model.backbone.name='nowhere_module:make_cnn': cannot import nowhere_module "
        "(ModuleNotFoundError: No module named 'nowhere_module'); is it installed, or on "
        "PYTHONPATH?"
    )
    assert waiting.returncode == 1 and err == (
        f"distseq: error: job {job.job_id}: rank 0: {said}; rank 1: {said} "
        f"(log: {job.paths.stderr})\n"
    ), out + err
    log = _no_traceback(job)
    for rank in (0, 1):
        assert f"distseq: error (rank {rank}): {said}" in log, log
    states = _sacct_states(job.job_id)
    if states:
        assert states == ["FAILED"], states
