"""``bench recipes --slurm``: every training a SLURM job through submitit, the stages chained as
job dependencies, the seeds and recipes side by side; the table is made when the last ends.

A job runs the same ``SeedRuns.get`` as the local bench, so its training is an ordinary run in
``OUT/seed-N/NAME`` and ends with its ``result.json``. A job stopped by SIGUSR2 (its time limit)
saves and requeues itself (``train.max_requeues``), by SIGTERM (preemption, ``scancel``) saves
and ends; a job that waited on one that ended unfinished is cancelled. The jobs are recorded in
``OUT/slurm/jobs.json``: run the same command again and the bench reads back the finished
trainings, waits for those still queued or running (after a Ctrl-C, a lost login), and submits
the others anew, each resuming from its last checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import submitit

from distseq.bench.recipes.trainings import TRAININGS, RecipesBench, SeedRuns, say
from distseq.errors import ConfigError, TrainingError
from distseq.files import write_atomic
from distseq.launch.slurm import SlurmOptions, exit_stopped
from distseq.train.signals import Interrupted, StopSignals

# Each job's trainings, in order, and the jobs of its seed it waits for. The head's job writes
# stage 1's features before it trains: they are no training of their own.
JOBS = {
    "frames": (("frames",), ()),
    "head": (("features", "head"), ("frames",)),
    "stage3": (("stage3",), ("frames", "head")),
    "tbptt": (("tbptt",), ()),
    "end_to_end": (("end_to_end",), ()),
}
# The states (sacct's) of a job that SLURM will still run, or runs. PREEMPTED is not among them:
# a job preempted to be requeued passes through it at once, so a later look finds it ended.
_ALIVE = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
    "RESIZING", "SUSPENDED", "STOPPED", "READY",
}  # fmt: skip
# Between looks at the queue. submitit asks sacct itself at most every few seconds for a young
# job and every minute for an old one: a look in between reads its cache.
POLL_S = 2.0


@dataclass(frozen=True)
class TrainingJob:
    """What a job runs: its trainings of one seed, one after another."""

    args: RecipesBench  # with slurm=None: in the job, a training is made here
    seed: int
    trainings: tuple[str, ...]

    def __call__(self) -> None:
        stop = StopSignals()
        runs = SeedRuns(self.args, self.seed)
        for name in self.trainings:
            try:
                runs.get(name, stop)
            except Interrupted as e:
                exit_stopped(stop, runs.config(name).train.max_requeues, e.step)


def jobs_of(recipes: list[str]) -> list[str]:
    """The jobs the recipes need, each before those that wait on it."""
    needed = {("head" if name == "features" else name) for r in recipes for name in TRAININGS[r]}
    return [job for job in JOBS if job in needed]


def options_of(args: RecipesBench) -> str:
    """What a job's trainings are made from, as a short hash: a queued job of other options is
    not waited for (it has not written its config yet, which a rerun would refuse)."""
    made = asdict(replace(args, seeds=[], recipes=[], json=False, slurm=None))
    made["config_text"] = Path(args.config).read_text()
    return hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest()[:16]


class Jobs:
    """The bench's jobs: those submitted or found queued, recorded in ``OUT/slurm/jobs.json``
    (``{"seed-N/job": {"job": id, "options": options_of}}``)."""

    def __init__(self, args: RecipesBench, opts: SlurmOptions) -> None:
        self.args, self.opts = args, opts
        self.options = options_of(args)
        self.record = Path(args.out) / "slurm" / "jobs.json"
        self.ids: dict[str, dict[str, str]] = (
            json.loads(self.record.read_text()) if self.record.is_file() else {}
        )
        self.jobs: dict[str, submitit.Job[None]] = {}  # key "seed-N/job": those not finished
        self.waits: dict[str, list[str]] = {}  # key: the keys it waits on
        self.found: set[str] = set()  # keys whose job an earlier run queued

    def add(self, runs: SeedRuns, job: str) -> None:
        """``job`` of ``runs``' seed, unless its trainings are done: the one an earlier run
        queued where it still runs or will (and all it waits on was found so too), else a new
        one after the jobs it waits on."""
        trainings, after = JOBS[job]
        if all(runs.finished(name) for name in trainings):
            return
        key = f"seed-{runs.seed}/{job}"
        self.waits[key] = [k for k in (f"seed-{runs.seed}/{a}" for a in after) if k in self.jobs]
        found = self._alive(key)
        if found is not None and all(k in self.found for k in self.waits[key]):
            say(f"waiting for job {found.job_id}: {key}, queued before ({found.state})")
            self.jobs[key] = found
            self.found.add(key)
            return
        if found is not None:  # it waits on a job that ended unfinished: SLURM never runs it
            found.cancel(check=False)
            say(f"cancelled job {found.job_id}: {key} waited on a job that ended unfinished")
        self._submit(key, runs.seed, trainings)

    def _submit(self, key: str, seed: int, trainings: tuple[str, ...]) -> None:
        executor = submitit.AutoExecutor(folder=self.opts.folder, cluster="slurm")
        params = self.opts.executor_parameters() | {"name": f"recipes-{key}"}
        ids = [self.jobs[k].job_id for k in self.waits[key]]
        if ids:
            params["slurm_dependency"] = "afterok:" + ":".join(ids)
        executor.update_parameters(**params)
        task = TrainingJob(replace(self.args, slurm=None), seed, trainings)
        # A Ctrl-C between queuing the job and recording it would leave a job that a rerun does
        # not know of, and queues again: it waits until both are done.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.jobs[key] = executor.submit(task)
            self.ids[key] = {"job": self.jobs[key].job_id, "options": self.options}
            write_atomic(self.record, json.dumps(self.ids, indent=1).encode())
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        waits = f" after job {', '.join(ids)}" if ids else ""
        say(f"submitted job {self.jobs[key].job_id}: {key}{waits}")

    def _alive(self, key: str) -> submitit.Job[None] | None:
        """The job recorded for ``key``, where SLURM still runs it or will; one queued with other
        options, or whose state SLURM does not say, refused."""
        if key not in self.ids:
            return None
        recorded = self.ids[key]
        job: submitit.Job[None] = submitit.SlurmJob(folder=self.opts.folder, job_id=recorded["job"])
        state = job.state.split()[0]
        if state == "UNKNOWN":
            raise TrainingError(
                f"bench recipes --slurm: sacct does not say the state of job {job.job_id} ({key}, "
                f"{self.record}): run again when it does"
            )
        if state not in _ALIVE:
            return None
        if recorded["options"] != self.options:
            raise ConfigError(
                f"bench recipes --slurm: job {job.job_id} ({key}) was queued with other options "
                f"than these: scancel {job.job_id}, or give another --out"
            )
        return job

    def wait(self) -> None:
        """Until every job has ended; a job whose trainings did not finish fails those that wait
        on it (cancelled: SLURM would keep them pending forever). One line per job as it ends."""
        failed: list[str] = []
        total, ended = len(self.jobs), 0
        while self.jobs:
            for key, job in list(self.jobs.items()):
                if key not in self.jobs or not job.done():
                    continue
                del self.jobs[key]
                ended += 1
                where = job.get_info().get("NodeList", "?")
                if self._finished(key):
                    say(f"[{ended}/{total}] {key}: done (job {job.job_id} on {where})")
                    continue
                failed.append(f"job {job.job_id} ({key}) {job.state} (log: {job.paths.stderr})")
                say(f"[{ended}/{total}] {key}: {failed[-1]}")
                for other in self._waiting_on(key):
                    self.jobs.pop(other).cancel(check=False)
                    ended += 1
                    failed.append(f"{other} not run: it waited on {key}")
                    say(f"[{ended}/{total}] {failed[-1]}")
            time.sleep(POLL_S if self.jobs else 0)
        if failed:
            raise TrainingError(
                f"bench recipes --slurm: {len(failed)} of {total} jobs did not finish: "
                f"{'; '.join(failed)}. Run the same command again: the finished trainings are "
                "read back, the others resume from their last checkpoints"
            )

    def _finished(self, key: str) -> bool:
        seed, job = key.split("/")
        runs = SeedRuns(self.args, int(seed.removeprefix("seed-")))
        return all(runs.finished(name) for name in JOBS[job][0])

    def _waiting_on(self, key: str) -> list[str]:
        """The queued jobs that wait on ``key``, directly or not."""
        out: list[str] = []
        for other, waits in self.waits.items():
            if other in self.jobs and other not in out and (key in waits or set(waits) & set(out)):
                out.append(other)
        return out


def check_sacct() -> None:
    """The bench reads its jobs' states with sacct: SLURM's accounting must be on."""
    try:
        proc = subprocess.run(
            ["sacct", "-n", "-X", "-j", "1"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError(f"bench recipes --slurm reads its jobs' states with sacct: {e}") from None
    if proc.returncode != 0:
        said = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no answer"
        raise ConfigError(
            f"bench recipes --slurm reads its jobs' states with sacct, which says: {said} "
            "(SLURM's accounting must be on)"
        )


def run_on_slurm(args: RecipesBench, opts: SlurmOptions) -> None:
    """Every training of the bench done, each as a job (module docstring)."""
    opts.executor_parameters()  # a bad --time is refused before any job is queued
    check_sacct()
    jobs = Jobs(args, opts)
    try:
        for seed in args.seeds:
            runs = SeedRuns(args, seed)
            for job in jobs_of(args.recipes):
                jobs.add(runs, job)
        if jobs.jobs:
            say(f"{len(jobs.jobs)} jobs in SLURM; their logs: {Path(opts.folder).parent}/<job id>/")
            jobs.wait()
    except KeyboardInterrupt:
        if not jobs.ids:
            raise
        raise TrainingError(
            "bench recipes --slurm: stopped waiting; the jobs go on in SLURM "
            f"({jobs.record}): run the same command again to wait for them and make the table"
        ) from None
