"""``bench recipes --slurm``: every training a SLURM job through submitit, the stages chained as
job dependencies, the seeds and recipes side by side; the table is made when the last ends.

A job runs the same ``SeedRuns.get`` as the local bench, so its training is an ordinary run in
``OUT/seed-N/NAME`` and ends with its ``result.json``. A job stopped by SIGUSR2 (its time limit)
saves and requeues itself (``train.max_requeues``), by SIGTERM (preemption, ``scancel``) saves
and ends; a job that waited on one that failed is cancelled. The jobs are recorded in
``OUT/slurm/jobs.json``: run the same command again and the bench reads back the finished
trainings, waits for those still queued or running (after a Ctrl-C, a lost login), and submits
the others anew, each resuming from its last checkpoint.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import submitit

from distseq.bench.recipes.trainings import TRAININGS, RecipesBench, SeedRuns, say
from distseq.errors import TrainingError
from distseq.files import write_atomic
from distseq.launch.slurm import exit_stopped
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
# SLURM's states of a job that will still run or is running (squeue's long names).
_ALIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}
POLL_S = 2.0  # between looks at the queue: sacct answers in milliseconds on a quiet cluster


@dataclass(frozen=True)
class TrainingJob:
    """What a job runs: its trainings of one seed, one after another."""

    args: RecipesBench
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


class Queue:
    """The bench's jobs: those submitted or found queued, recorded in ``OUT/slurm/jobs.json``."""

    def __init__(self, args: RecipesBench) -> None:
        assert args.slurm is not None
        self.args = args
        self.folder = Path(args.out) / "slurm"
        self.record = self.folder / "jobs.json"
        self.ids: dict[str, str] = (
            json.loads(self.record.read_text()) if self.record.is_file() else {}
        )
        self.jobs: dict[str, submitit.Job[None]] = {}  # key "seed-N/job", those not finished
        self.waits: dict[str, list[str]] = {}  # key -> the keys it waits on

    def add(self, runs: SeedRuns, job: str) -> None:
        """``job`` of ``runs``' seed, unless its trainings are done: the one an earlier run
        queued where it is still alive, else a new one after the jobs it waits on."""
        trainings, after = JOBS[job]
        if all(runs.finished(name) for name in trainings):
            return
        key, mine = f"seed-{runs.seed}/{job}", [f"seed-{runs.seed}/{a}" for a in after]
        self.waits[key] = [k for k in mine if k in self.jobs]
        found = self._alive(key)
        if found is not None:
            say(f"waiting for job {found.job_id}: {key}, queued before ({found.state})")
            self.jobs[key] = found
            return
        executor = submitit.AutoExecutor(folder=self.folder / "%j", cluster="slurm")
        assert self.args.slurm is not None
        params = self.args.slurm.executor_parameters() | {"name": f"recipes-{key}"}
        ids = [self.jobs[k].job_id for k in self.waits[key]]
        if ids:
            params["slurm_dependency"] = "afterok:" + ":".join(ids)
        executor.update_parameters(**params)
        self.jobs[key] = executor.submit(TrainingJob(self.args, runs.seed, trainings))
        self.ids[key] = self.jobs[key].job_id
        write_atomic(self.record, json.dumps(self.ids, indent=1).encode())
        waits = f" after job {', '.join(ids)}" if ids else ""
        say(f"submitted job {self.jobs[key].job_id}: {key}{waits}")

    def _alive(self, key: str) -> submitit.Job[None] | None:
        """The job recorded for ``key``, where SLURM still runs or will run it."""
        if key not in self.ids:
            return None
        job: submitit.Job[None] = submitit.SlurmJob(folder=self.folder / "%j", job_id=self.ids[key])
        return job if job.state.split()[0] in _ALIVE else None

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


def run_on_slurm(args: RecipesBench) -> None:
    """Every training of the bench done, each as a job (module docstring)."""
    queue = Queue(args)
    try:
        for seed in args.seeds:
            runs = SeedRuns(args, seed)
            for job in jobs_of(args.recipes):
                queue.add(runs, job)
        if queue.jobs:
            say(f"{len(queue.jobs)} jobs in SLURM; their logs: {queue.folder}/<job id>/")
            queue.wait()
    except KeyboardInterrupt:
        raise TrainingError(
            "bench recipes --slurm: stopped waiting; the jobs go on in SLURM "
            f"({queue.record}): run the same command again to wait for them and make the table"
        ) from None
