"""``distseq bench resume``: how long a relaunched run takes to its first step, near the start of
a run and far into it.

A relaunch once passed over every batch the run had trained on, reading each from its shards: on
the demo's stream (8 videos of 512 frames a batch) 17 s after 200 batches and 84 s after 1,000,
growing with the step, on every requeue and in every rank. The stream now seeks to the position
its checkpoint holds (``data/train_stream.py``). This bench trains the demo's config (``distseq
demo``'s recall task, its end-to-end run) to each step of ``--at-steps``, relaunches a copy of the
run from the checkpoint there, and times it: set-up and restore to its first batch ("ready"), and
to the end of its first step.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from distseq.config import load_config
from distseq.demo.three_ways import demo_config_path, task_shards
from distseq.errors import ConfigError
from distseq.files import output_folder
from distseq.train.loop import train


@dataclass
class ResumeBench:
    """One ``bench resume`` run: its options, as the command line gives them."""

    out: str
    at_steps: list[int]
    train_sequences: int
    json: bool
    overrides: list[str]


@dataclass
class ResumeRecord:
    step: int  # the checkpoint's, where the relaunch resumes
    ready_seconds: float  # from train() to its first poll: set-up, restore, the first batch
    first_step_seconds: float  # from train() to the end of its first step


def _timed_leg(out: Path, overrides: list[str], step: int) -> ResumeRecord:
    """A copy of the run at ``out``, relaunched from its checkpoint at ``step`` for one step."""
    leg = out.with_name(f"{out.name}-from-{step}")
    if leg.exists():
        shutil.rmtree(leg)
    shutil.copytree(out, leg)
    cfg = load_config(
        demo_config_path(), [*overrides, f"train.out_dir={leg}", f"train.stop_after={step + 1}"]
    )
    polls: list[float] = []

    def poll() -> bool:  # train polls once before its first step and after each
        polls.append(time.perf_counter())
        return False

    start = time.perf_counter()
    train(cfg, stop=poll)
    shutil.rmtree(leg)
    return ResumeRecord(step, polls[0] - start, polls[1] - start)


def bench_resume(args: ResumeBench) -> list[ResumeRecord]:
    steps = sorted(set(args.at_steps))
    if not steps or steps[0] < 1:
        raise ConfigError(f"--at-steps {' '.join(map(str, args.at_steps))}: give steps >= 1")
    out = output_folder(args.out)
    shards = task_shards(out / "data", args.train_sequences, 1)
    run = out / "run"
    if run.exists():  # a run trained to other steps would resume rather than train
        shutil.rmtree(run)
    # No validation: the legs time the relaunch alone, and every step of --at-steps is saved.
    base = [*shards, "data.val=", f"train.steps={steps[-1] + 1}", "train.eval_every=0"]
    base += [f"train.out_dir={run}", "train.select=", *args.overrides]
    records = []
    for step in steps:
        print(f"training to step {step} ...", flush=True)
        train(load_config(demo_config_path(), [*base, f"train.stop_after={step}"]))
        records.append(_timed_leg(run, base, step))
        if args.json:
            print(json.dumps(asdict(records[-1])), flush=True)
    if not args.json:
        print("\n" + table(records))
    return records


def table(records: list[ResumeRecord]) -> str:
    lines = [f"{'resumed at step':>15} {'ready s':>8} {'first step s':>13}"]
    for r in records:
        lines.append(f"{r.step:>15} {r.ready_seconds:>8.2f} {r.first_step_seconds:>13.2f}")
    return "\n".join(lines)
