"""``distseq train`` as a SLURM job through submitit, one task per GPU (``distseq submit``).

Each task sets up ``torch.distributed`` from SLURM's variables and calls the same ``train`` as
torchrun does. A requeued job calls it again, and ``train`` resumes from the run's latest
checkpoint on its own.

Stopping early. submitit's own handler calls ``checkpoint()`` on the first task only, inside the
signal handler, and exits at once: too early for a save that every rank of a sharded model must
join. So every task records the signal instead, and the training loop, which polls all ranks
once per step, saves a checkpoint with all of them at the next step boundary:

- SIGUSR2 (sent ``--signal-delay`` seconds before the time limit, and by submitit's
  ``job._interrupt()``): save, then the first task requeues the job, at most
  ``train.max_requeues`` times (counted in the job's submitit folder: SLURM_RESTART_COUNT
  counts a preemption's requeues too).
- SIGTERM alone (preemption, ``scancel``, ``scancel --signal=TERM``): save and exit. Where SLURM
  is not ending the job itself (``scancel --signal=TERM``, a ``kill``), the first task cancels
  it, so that sacct says CANCELLED, as for ``scancel``, rather than FAILED; a scheduler that
  preempts with requeue starts the job again.

Every task ends in one line, as ``distseq train`` does: a stop on request exits 143
(``errors.EXIT_STOPPED``) after the first task's line, an error users cause (a bad config
found in the job, a bad frame, requeues spent) with its code and one line on each rank, rather
than submitit's tracebacks. ``job_end`` reads those lines back for ``submit --wait``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import submitit
import torch
from submitit.slurm.slurm import _make_sbatch_string

from distseq.config import Config, load_config, with_absolute_paths
from distseq.data.manifest import load_manifest
from distseq.data.tar import expand
from distseq.errors import (
    EXIT_FAILURE,
    EXIT_STOPPED,
    ConfigError,
    Stopped,
    TrainingError,
    error_line,
    exit_code,
)
from distseq.files import write_atomic
from distseq.train.loop import train
from distseq.train.select import Selection
from distseq.train.signals import Interrupted, StoppedAtStart, StopSignals

_TIME = re.compile(r"^(?:(\d+)-)?(\d+):(\d{2})(?::(\d{2}))?$")


def timeout_minutes(text: str) -> int:
    """SLURM's [D-]HH:MM[:SS] as whole minutes (rounded up)."""
    m = _TIME.match(text)
    if not m:
        raise ConfigError(f"--time {text!r}: expected [D-]HH:MM[:SS], e.g. 24:00:00")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return days * 24 * 60 + hours * 60 + minutes + (1 if seconds else 0)


@dataclass
class SlurmOptions:
    nodes: int = 1
    gpus_per_node: int = 0  # 0: a CPU job (gloo); then tasks_per_node sets the ranks per node
    tasks_per_node: int = 1
    cpus_per_task: int = 1
    partition: str = ""
    time: str = "01:00:00"
    account: str = ""
    folder: str = "runs/slurm/%j"
    # SIGUSR2 comes this long before the time limit: allow for one step plus a checkpoint save.
    signal_delay_s: int = 120

    def executor_parameters(self) -> dict[str, object]:
        minutes = timeout_minutes(self.time)
        delay = self.signal_delay_s
        # SLURM sends the signal once less than the delay is left: from the job's start where the
        # delay is the whole time limit or more, and every leg would requeue itself at once.
        if delay < 0 or delay >= minutes * 60:
            raise ConfigError(
                f"--signal-delay {delay}: must be 0 (no signal) or more, and shorter than --time "
                f"{self.time} ({minutes * 60} s), or every run of the job saves and requeues "
                "itself as soon as it starts"
            )
        params: dict[str, object] = {
            "nodes": self.nodes,
            "tasks_per_node": self.gpus_per_node or self.tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
            "timeout_min": minutes,
            "slurm_partition": self.partition or None,
            "slurm_account": self.account or None,
            "name": "distseq",
            "slurm_signal_delay_s": self.signal_delay_s,
        }
        if self.gpus_per_node:
            params["gpus_per_node"] = self.gpus_per_node
        return {k: v for k, v in params.items() if v is not None}


def exit_stopped(stop: StopSignals, max_requeues: int, step: int) -> NoReturn:
    """Requeue the job if it was asked to, at most ``max_requeues`` times (train.max_requeues);
    else end it, cancelled where SLURM is not ending it itself. Exiting leaves no result file,
    which is how submitit knows the job is not done."""
    job = os.environ["SLURM_JOB_ID"]
    first = os.environ.get("SLURM_PROCID", "0") == "0"
    names = "+".join(signal.Signals(s).name for s in sorted(stop.received))
    if signal.SIGUSR2 not in stop.received:
        _end(Stopped(f"{names}: saved step {step}, exiting{_cancelled()}"))
    # Its own requeues, not SLURM_RESTART_COUNT: that counts those of a preemption too, and a job
    # preempted twice a day spent train.max_requeues=10 in five days, then ended at its next
    # time limit instead of requeueing itself.
    record = submitit.JobEnvironment().paths.folder / f"{job}_requeues"
    requeues = int(record.read_text()) if record.is_file() else 0
    if requeues >= max_requeues:
        _end(
            Stopped(
                f"job {job} stopped by {names} after saving step {step}, not requeued: it "
                f"requeued itself {requeues} times (train.max_requeues={max_requeues}); submit it "
                "again to go on"
            )
        )
    if first:
        write_atomic(record, f"{requeues + 1}\n")  # first: the requeue ends this process
        try:
            subprocess.run(["scontrol", "requeue", job], check=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            _end(TrainingError(f"job {job}: saved step {step}, but could not requeue: {e}"))
    _end(Stopped(f"{names}: saved step {step}, requeued job {job} ({requeues + 1} of "
                 f"train.max_requeues={max_requeues})"))  # fmt: skip


def _cancelled() -> str:
    """After a stop by SIGTERM alone, on the first task: cancel the job unless SLURM is ending it
    already (a ``scancel``: the job COMPLETING; its time limit; a preemption: ``PreemptTime``
    set, the job still RUNNING through its grace time, and perhaps to be requeued), so that
    sacct says CANCELLED, not FAILED. What to add to the task's line."""
    job = os.environ["SLURM_JOB_ID"]
    if os.environ.get("SLURM_PROCID", "0") != "0" or not _cancel_unless_ending(job):
        return ""
    return f"; cancelled job {job}, submit it again to go on"


def _cancel_unless_ending(job: str) -> bool:
    """Cancel ``job`` unless SLURM is ending it already; whether it cancelled it."""
    try:
        shown = subprocess.run(
            ["scontrol", "show", "job", "-o", job],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        fields = dict(f.split("=", 1) for f in shown.split() if "=" in f)
        if fields.get("JobState") != "RUNNING" or fields.get("PreemptTime", "None") != "None":
            return False
        subprocess.run(["scancel", job], check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False  # the job ends all the same, as FAILED
    return True


# The start of every task's last line, as ``_end`` writes it; an error's (``error_line``).
_END = "distseq: "
_ERROR = re.compile(r"^distseq: error \(rank (\d+)\): ")


def _end(error: Exception) -> NoReturn:
    """End this task as ``distseq train`` ends: a stop on request in one line of the first
    task's, an error in one line of every task's, with the command line's exit code."""
    code = exit_code(error)
    assert code is not None, error
    if code != EXIT_STOPPED:
        print(error_line(str(error)), file=sys.stderr, flush=True)
    elif os.environ.get("SLURM_PROCID", "0") == "0":
        print(_END + str(error), file=sys.stderr, flush=True)
    raise SystemExit(code)


def job_end(job: submitit.Job[Any]) -> tuple[str, int]:
    """How ``job`` ended, where it ended without a result: the last line of each task's log,
    where ``_end`` wrote it (an error's ``rank N: ...``), and the code it exited with, 1 where a
    task failed; ``("", 1)`` where no task wrote one (killed, or a bug's traceback)."""
    lines: list[str] = []
    for path in sorted(Path(job.paths.folder).glob(f"{job.job_id}_*_log.err")):
        said = [
            line.strip()
            for line in path.read_text(errors="replace").splitlines()
            if line.strip() and not line.startswith(("slurmstepd:", "srun:"))
        ]
        if said and said[-1].startswith(_END):
            lines.append(said[-1])
    errors = [_ERROR.sub(r"rank \1: ", line) for line in lines if _ERROR.match(line)]
    if errors:
        return "; ".join(dict.fromkeys(errors)), EXIT_FAILURE
    stops = [line.removeprefix(_END) for line in lines]
    return "; ".join(dict.fromkeys(stops)), EXIT_STOPPED if stops else EXIT_FAILURE


class TrainTask:
    """One rank of the job."""

    def __init__(self, config: str, overrides: list[str]) -> None:
        self.config = config
        self.overrides = overrides

    def __call__(self) -> dict[str, float]:
        stop = StopSignals()
        env = submitit.helpers.TorchDistributedEnvironment().export(
            set_cuda_visible_devices=torch.cuda.is_available()
        )
        try:
            # As under torchrun, the first rank alone tells of renamed keys.
            cfg = load_config(self.config, self.overrides, quiet=env.rank != 0)
            try:
                return train(cfg, stop=stop)
            except Interrupted as e:
                exit_stopped(stop, cfg.train.max_requeues, e.step)
        except StoppedAtStart as e:  # SIGTERM while the run starts, as a user's or SLURM's
            _end(Stopped(f"{e}{_cancelled()}"))
        except Exception as e:
            if exit_code(e) is None:  # a bug: submitit's traceback says where
                raise
            _end(e)


def check_before_queuing(cfg: Config) -> None:
    """What ``train`` checks of a config before its first step that needs no model: that the
    shards are there (their manifest) and that validation logs train.select's score. A job would
    fail on them seconds after its wait in the queue. The model (weights to fetch) is the job's;
    a dry run, which may be made where the data is not, checks neither."""
    cfg = with_absolute_paths(cfg)  # as the job's run sees them, from the same folder
    load_manifest(cfg.data)
    expand(cfg.data.train, "data.train", "train")
    if cfg.train.select:  # refused by train with or without data.val
        Selection.of(cfg.train.select, cfg.train.patience)


def submit(config: str, overrides: list[str], opts: SlurmOptions) -> submitit.Job[dict[str, float]]:
    check_before_queuing(load_config(config, overrides))  # here, not in a queued job
    executor = submitit.AutoExecutor(folder=opts.folder, cluster="slurm")
    executor.update_parameters(**opts.executor_parameters())
    return executor.submit(TrainTask(str(Path(config).resolve()), overrides))


def sbatch_script(opts: SlurmOptions) -> str:
    """The sbatch script ``submit`` would send, for --dry-run."""
    params = opts.executor_parameters()
    return _make_sbatch_string(
        command="python -u -m submitit.core._submit '<folder>'",
        folder=opts.folder,
        job_name=str(params["name"]),
        partition=opts.partition or None,
        time=int(str(params["timeout_min"])),
        nodes=opts.nodes,
        ntasks_per_node=int(str(params["tasks_per_node"])),
        cpus_per_task=opts.cpus_per_task,
        gpus_per_node=opts.gpus_per_node or None,
        account=opts.account or None,
        signal_delay_s=opts.signal_delay_s,
    )
