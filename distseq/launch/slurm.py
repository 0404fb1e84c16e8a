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
  ``train.max_requeues`` times (SLURM_RESTART_COUNT counts them).
- SIGTERM alone (preemption, or ``scancel``): save and exit. A scheduler that preempts with
  requeue starts the job again; a cancelled job stays cancelled, with its work saved.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import submitit
import torch
from submitit.slurm.slurm import _make_sbatch_string

from distseq.config import load_config
from distseq.errors import ConfigError, TrainingError
from distseq.train.loop import train
from distseq.train.signals import Interrupted, StopSignals

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
        params: dict[str, object] = {
            "nodes": self.nodes,
            "tasks_per_node": self.gpus_per_node or self.tasks_per_node,
            "cpus_per_task": self.cpus_per_task,
            "timeout_min": timeout_minutes(self.time),
            "slurm_partition": self.partition or None,
            "slurm_account": self.account or None,
            "name": "distseq",
            "slurm_signal_delay_s": self.signal_delay_s,
        }
        if self.gpus_per_node:
            params["gpus_per_node"] = self.gpus_per_node
        return {k: v for k, v in params.items() if v is not None}


def exit_stopped(stop: StopSignals, max_requeues: int, step: int) -> NoReturn:
    """Requeue the job if it was asked to, at most ``max_requeues`` times (train.max_requeues).
    Exiting leaves no result file, which is how submitit knows the job is not done."""
    job = os.environ["SLURM_JOB_ID"]
    first = os.environ.get("SLURM_PROCID", "0") == "0"
    names = "+".join(signal.Signals(s).name for s in sorted(stop.received))
    if signal.SIGUSR2 not in stop.received:
        if first:
            print(f"distseq: {names}: saved step {step}, exiting", file=sys.stderr, flush=True)
        raise SystemExit(143)
    requeues = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    if requeues >= max_requeues:
        raise TrainingError(
            f"job {job} stopped by {names} after saving step {step}, not requeued: it ran "
            f"{requeues + 1} times (train.max_requeues={max_requeues}); submit it again to go on"
        )
    if first:
        try:
            subprocess.run(["scontrol", "requeue", job], check=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            msg = f"job {job}: saved step {step}, but could not requeue: {e}"
            raise TrainingError(msg) from None
        print(
            f"distseq: {names}: saved step {step}, requeued job {job} "
            f"({requeues + 1} of train.max_requeues={max_requeues})",
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(0)


class TrainTask:
    """One rank of the job."""

    def __init__(self, config: str, overrides: list[str]) -> None:
        self.config = config
        self.overrides = overrides

    def __call__(self) -> dict[str, float]:
        stop = StopSignals()
        quiet = os.environ.get("SLURM_PROCID", "0") != "0"  # as under torchrun: rank 0 speaks
        cfg = load_config(self.config, self.overrides, quiet=quiet)
        submitit.helpers.TorchDistributedEnvironment().export(
            set_cuda_visible_devices=torch.cuda.is_available()
        )
        try:
            return train(cfg, stop=stop)
        except Interrupted as e:
            exit_stopped(stop, cfg.train.max_requeues, e.step)


def submit(config: str, overrides: list[str], opts: SlurmOptions) -> submitit.Job[dict[str, float]]:
    load_config(config, overrides)  # fail here, not in a queued job, on a bad config
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
