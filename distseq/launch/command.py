"""``distseq submit CONFIG [key=value ...]``: ``distseq train`` as a SLURM job (``slurm.py``)."""

from __future__ import annotations

import argparse
import sys

import submitit

from distseq.config import load_config
from distseq.errors import EXIT_STOPPED, Stopped, TrainingError, first_line
from distseq.launch.slurm import SlurmOptions, job_end, sbatch_script, submit
from distseq.parallel import sequence_line


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("submit", help="run `distseq train` as a SLURM job (submitit)")
    p.add_argument("config", help="YAML config file")
    p.add_argument("overrides", nargs="*", help="key=value overrides")
    p.add_argument("--nodes", type=int, default=1, help="SLURM nodes")
    p.add_argument("--gpus-per-node", type=int, default=0, help="one task per GPU; 0: CPU job")
    p.add_argument("--tasks-per-node", type=int, default=1, help="ranks per node of a CPU job")
    add_job_options(p, "the job")
    p.add_argument("--folder", default="runs/slurm/%j", help="submitit logs; %%j is the job id")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch script, submit nothing")
    p.add_argument("--wait", action="store_true", help="block until the job ends, print its result")
    p.set_defaults(run=run)


def add_job_options(
    p: argparse.ArgumentParser | argparse._ArgumentGroup, job: str
) -> list[argparse.Action]:
    """The SLURM options of every job (``SlurmOptions``), for ``job``, as people say it."""
    return [
        p.add_argument(
            "--cpus-per-task", type=int, default=1, help="CPUs per rank (loader workers)"
        ),
        p.add_argument("--partition", default="", help="SLURM partition; default: the cluster's"),
        p.add_argument("--time", default="01:00:00", help=f"time limit of {job}: [D-]HH:MM[:SS]"),
        p.add_argument("--account", default="", help="SLURM account; default: yours"),
        p.add_argument(
            "--signal-delay",
            type=int,
            default=120,
            help=f"seconds before the time limit at which SLURM signals {job} (SIGUSR2) to save "
            "and requeue itself (train.max_requeues times at most): room for a step and a save, "
            "shorter than --time; 0: no signal, the job ends at its time limit (TIMEOUT), saved "
            "only if a step and a save fit in the cluster's KillWait",
        ),
    ]


def job_options(
    args: argparse.Namespace,
    folder: str,
    nodes: int = 1,
    gpus_per_node: int = 0,
    tasks_per_node: int = 1,
) -> SlurmOptions:
    """The ``SlurmOptions`` of ``add_job_options``' options, the job's layout and its logs'
    ``folder``."""
    return SlurmOptions(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        tasks_per_node=tasks_per_node,
        cpus_per_task=args.cpus_per_task,
        partition=args.partition,
        time=args.time,
        account=args.account,
        folder=folder,
        signal_delay_s=args.signal_delay,
    )


def run(args: argparse.Namespace) -> None:
    opts = job_options(args, args.folder, args.nodes, args.gpus_per_node, args.tasks_per_node)
    # A bad config or split fails here, not in a queued job (and submit checks the data).
    line = sequence_line(load_config(args.config, args.overrides), *_layout(opts))
    if line:  # beside a dry run's script, which stays one to save and sbatch
        print(line, file=sys.stderr if args.dry_run else sys.stdout)
    if args.dry_run:
        print(sbatch_script(opts))
        return
    job = submit(args.config, args.overrides, opts)
    print(f"submitted job {job.job_id}")
    print(f"  stdout: {job.paths.stdout}")
    print(f"  stderr: {job.paths.stderr}")
    if args.wait:
        try:
            print(f"result (rank 0): {job.results()[0]}", flush=True)
        except submitit.core.utils.UncompletedJobError as e:  # FailedJobError is a subclass
            # The job's own last line(s), with its exit code: 143 for a stop on request.
            said, code = job_end(job)
            said = said or first_line(e)  # a job that died without one (killed, a bug)
            error = Stopped if code == EXIT_STOPPED else TrainingError
            raise error(f"job {job.job_id}: {said} (log: {job.paths.stderr})") from None


def _layout(opts: SlurmOptions) -> tuple[int, dict[int, str]]:
    """The job's ranks and, over several nodes, each rank's node: SLURM gives consecutive
    ranks to a node, as torchrun does."""
    per = opts.gpus_per_node or opts.tasks_per_node
    world = opts.nodes * per
    hosts = {r: f"node {r // per + 1}" for r in range(world)} if opts.nodes > 1 else {}
    return world, hosts
