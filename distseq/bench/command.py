"""``distseq bench memory|compare|data|resume|protocols|traffic|gpu|heads|recipes``: benchmarks
that print numbers; their options, each a thin run over its module."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from distseq.bench.compare import CompareBench, bench_compare
from distseq.bench.data import DataBench, bench_data
from distseq.bench.gpu import GpuBench, bench_gpu
from distseq.bench.heads import HeadsBench, bench_heads
from distseq.bench.memory import MemoryBench, bench_memory
from distseq.bench.protocols import ProtocolsBench, bench_protocols
from distseq.bench.recipes.run import bench_recipes
from distseq.bench.recipes.trainings import RECIPES, STAGE3, RecipesBench
from distseq.bench.resume import ResumeBench, bench_resume
from distseq.bench.traffic import TrafficBench, bench_traffic
from distseq.config import Recompute
from distseq.errors import ConfigError
from distseq.launch.command import add_job_options, job_options
from distseq.options import renamed

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
T = TypeVar("T")


def add_parser(sub: Subparsers) -> None:
    bench = sub.add_parser("bench", help="print benchmark numbers")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    _add_memory(bench_sub)
    _add_compare(bench_sub)
    _add_data(bench_sub)
    _add_resume(bench_sub)
    _add_protocols(bench_sub)
    _add_traffic(bench_sub)
    _add_gpu(bench_sub)
    _add_heads(bench_sub)
    _add_recipes(bench_sub)


def _options(kind: type[T], args: argparse.Namespace) -> T:
    """The options record of a benchmark from the parsed command line: its fields by name."""
    values: dict[str, Any] = {f.name: getattr(args, f.name) for f in fields(kind)}  # type: ignore[arg-type]
    return kind(**values)


def _cnn(p: argparse.ArgumentParser, backbone: str, size: int) -> None:
    p.add_argument("--backbone", default=backbone, help="the CNN (model.backbone.name)")
    p.add_argument("--size", type=int, default=size, help="square frame size (px)")


def _add_memory(sub: Subparsers) -> None:
    p = sub.add_parser("memory", help="activation memory and step time per recompute backend")
    _cnn(p, "resnet18", 112)
    p.add_argument("--frames", type=int, nargs="+", default=[64, 256, 1024], help="T per case")
    p.add_argument("--chunk", type=int, default=8, help="frames per chunk (memory.chunk_frames)")
    p.add_argument(
        "--recompute",
        nargs="+",
        default=["none", "torch", "fairscale"],
        choices=[r.value for r in Recompute],
        help="recompute backends, one case each (memory.recompute)",
    )
    p.add_argument("--json", action="store_true", help="one JSON record per case")
    p.set_defaults(run=lambda args: bench_memory(_options(MemoryBench, args)))


def _add_compare(sub: Subparsers) -> None:
    p = sub.add_parser(
        "compare", help="plain, per-block checkpointing, TBPTT-64, chunked, planned: side by side"
    )
    _cnn(p, "resnet18", 112)
    p.add_argument("--frames", type=int, nargs="+", default=[256, 1024], help="T per case")
    p.add_argument("--chunk", type=int, default=8, help="the chunked row's fixed chunk")
    p.add_argument(
        "--plan-chunk", type=int, default=32, help="the planner rows' memory.chunk_frames"
    )
    p.add_argument(
        "--compile", default="", help="also plain and chunked compiled by this backend (inductor)"
    )
    p.add_argument("--out", default="runs/bench-compare", help="for compare.md, .json and .png")
    p.add_argument("--json", action="store_true", help="one JSON record per row")
    p.set_defaults(run=lambda args: bench_compare(_options(CompareBench, args)))


def _add_data(sub: Subparsers) -> None:
    p = sub.add_parser("data", help="loader frames/s per worker against plain decoding")
    p.add_argument("--size", type=int, default=224, help="frame size of the shards (px)")
    p.add_argument("--window", type=int, default=64, help="T, frames per window (data.window)")
    p.add_argument("--count", type=int, default=2048, help="frames timed per case")
    p.add_argument(
        "--num-workers",
        dest="workers",
        metavar="NUM_WORKERS",
        type=int,
        nargs="+",
        default=[0, 1, 2],
        help="loader workers (data.num_workers), one case each",
    )
    renamed(p, "--workers", "--num-workers")
    p.add_argument("--model-fps", type=float, default=1000.0, help="frames/s a step consumes")
    p.add_argument(
        "--shards", default="", help="local train shards (index.json beside); default: synthetic"
    )
    p.add_argument("--json", action="store_true", help="one JSON record per case")
    p.set_defaults(run=lambda args: bench_data(_options(DataBench, args)))


def _add_resume(sub: Subparsers) -> None:
    p = sub.add_parser(
        "resume", help="seconds a relaunched run takes to its first step, near and far into a run"
    )
    p.add_argument("--out", default="runs/bench-resume", help="where the task's data and runs go")
    p.add_argument(
        "--at-steps",
        type=int,
        nargs="+",
        default=[10, 1000],
        help="resume at each of these steps",
    )
    p.add_argument(
        "--train-sequences", type=int, default=256, help="the demo task's training videos"
    )
    p.add_argument("--json", action="store_true", help="one JSON record per step")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the demo's config")
    p.set_defaults(run=lambda args: bench_resume(_options(ResumeBench, args)))


def _add_protocols(sub: Subparsers) -> None:
    p = sub.add_parser(
        "protocols", help="eval's two protocols side by side on simulated Cholec80 predictions"
    )
    p.add_argument("--videos", type=int, default=40, help="Cholec80-shaped videos")
    p.add_argument("--shift", type=float, default=15.0, help="std of a phase change's error, s")
    p.add_argument(
        "--relaxed-seconds", type=float, default=10.0, help="the relaxed boundary, s (Cholec80's)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the simulated predictions")
    p.add_argument("--json", action="store_true", help="the numbers as JSON")
    p.set_defaults(run=lambda args: bench_protocols(_options(ProtocolsBench, args)))


def _add_traffic(sub: Subparsers) -> None:
    p = sub.add_parser(
        "traffic", help="collective bytes per rank per step at each world size (torchrun here)"
    )
    _cnn(p, "resnet18", 64)
    p.add_argument(
        "--length",
        dest="frames",
        metavar="LENGTH",
        type=int,
        default=16,
        help="T, each sequence's frames",
    )
    p.add_argument(
        "--chunks-per-sequence",
        dest="chunks",
        metavar="CHUNKS_PER_SEQUENCE",
        type=int,
        nargs="+",
        default=[1, 4],
        help="T / chunk, one run each",
    )
    renamed(p, "--frames", "--length")
    renamed(p, "--chunks", "--chunks-per-sequence")
    p.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4, 6], help="ranks per run")
    p.add_argument(
        "--sequences",
        type=int,
        nargs="+",
        default=[1, 2],
        help="parallel.sequence: each sequence split across S ranks, where S divides the world",
    )
    p.add_argument(
        "--recompute",
        nargs="+",
        default=["torch"],
        choices=[r.value for r in Recompute],
        help="recompute backends, one case each (memory.recompute; none holds every chunk)",
    )
    p.add_argument(
        "--modes", nargs="+", default=["fsdp", "ddp"], choices=["fsdp", "ddp"], help="parallel.mode"
    )
    p.add_argument("--json", action="store_true", help="one JSON record per row")
    p.set_defaults(run=lambda args: bench_traffic(_options(TrafficBench, args)))


def _add_gpu(sub: Subparsers) -> None:
    p = sub.add_parser(
        "gpu", help="the GPU acceptance run: memory, plan, bf16, offload, NCCL, compile, loader"
    )
    _cnn(p, "resnet50", 224)
    p.add_argument(
        "--length", dest="frames", metavar="LENGTH", type=int, default=256, help="T, the sequence's"
    )
    renamed(p, "--frames", "--length")
    p.add_argument("--chunk", type=int, default=16, help="frames per chunk (memory.chunk_frames)")
    p.add_argument("--compile", default="inductor", help="the torch.compile backend")
    p.add_argument("--loader-frames", type=int, default=1024, help="frames the loader row times")
    p.add_argument(
        "--dry-run", action="store_true", help="tiny sizes, on the CPU where there is no GPU"
    )
    p.add_argument("--out", default="runs/bench-gpu", help="for gpu.md and gpu.json")
    p.add_argument("--json", action="store_true", help="one JSON record instead of the table")
    p.set_defaults(run=lambda args: bench_gpu(_options(GpuBench, args)))


def _add_heads(sub: Subparsers) -> None:
    p = sub.add_parser(
        "heads", help="LSTM, MS-TCN, transformer side by side; MS-TCN against a plain loop"
    )
    p.add_argument("--frames", type=int, nargs="+", default=[1000, 10000], help="T per case")
    p.add_argument("--feature-dim", type=int, default=2048, help="F, features a frame (I3D's)")
    renamed(p, "--features", "--feature-dim")
    p.add_argument(
        "--num-classes",
        dest="classes",
        metavar="NUM_CLASSES",
        type=int,
        default=19,
        help="K, 50Salads'",
    )
    renamed(p, "--classes", "--num-classes")
    p.add_argument("--videos", type=int, default=40, help="training videos of the epoch rows")
    p.add_argument("--min-frames", type=int, default=2900, help="the shortest simulated video")
    p.add_argument("--max-frames", type=int, default=5800, help="the longest simulated video")
    p.add_argument("--end-to-end-frames", type=int, default=1000, help="T behind the chunked CNN")
    p.add_argument("--backbone", default="resnet18", help="the CNN of the end-to-end rows")
    p.add_argument("--size", type=int, default=64, help="frame size of the end-to-end rows")
    p.add_argument("--chunk", type=int, default=8, help="frames per chunk, end to end")
    p.add_argument("--json", action="store_true", help="one JSON record per row")
    p.set_defaults(run=lambda args: bench_heads(_options(HeadsBench, args)))


def _add_recipes(sub: Subparsers) -> None:
    p = sub.add_parser(
        "recipes",
        help="does end to end pay on my data? per-frame, TBPTT, two-stage, three-stage, exact",
    )
    p.add_argument("config", help="the config of the end-to-end model, with data.train and .val")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps of every training")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="train.seed values")
    p.add_argument("--tbptt", type=int, default=64, help="k of TBPTT-k (memory.tbptt_frames)")
    p.add_argument("--eval-every", type=int, default=20, help="steps between validations")
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), help=" ".join(RECIPES))
    p.add_argument(
        "--stage2",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of two_stage's head training (repeat the option for more)",
    )
    p.add_argument(
        "--stage3",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"an override of stage 3, after its measured {' '.join(STAGE3)} (repeatable)",
    )
    p.add_argument(
        "--test",
        default="",
        metavar="SHARDS",
        help="shards (a folder: its test split) to score each training's selected checkpoint on; "
        "default: data.val's scores, which selected them",
    )
    p.add_argument("--out", default="runs/bench-recipes", help="the runs, recipes.md, .json, .png")
    p.add_argument("--json", action="store_true", help="one JSON record per recipe and seed")
    jobs = p.add_argument_group("SLURM", "--slurm: every training a job, stages as dependencies")
    jobs.add_argument("--slurm", action="store_true", help="submit the trainings to SLURM")
    gpus = jobs.add_argument("--gpus", type=int, default=0, choices=[0, 1], help="a GPU each")
    given = [gpus, *add_job_options(jobs, "each training")]
    p.set_defaults(run=lambda args: _run_recipes(args, given))


def _run_recipes(args: argparse.Namespace, jobs: list[argparse.Action]) -> None:
    """The bench, its SLURM options refused without --slurm: they would be ignored."""
    ignored = [a.option_strings[0] for a in jobs if getattr(args, a.dest) != a.default]
    if ignored and not args.slurm:
        raise ConfigError(f"{' '.join(ignored)}: SLURM options, for --slurm")
    folder = str(Path(args.out).resolve() / "slurm" / "%j")
    args.slurm = job_options(args, folder, gpus_per_node=args.gpus) if args.slurm else None
    bench_recipes(_options(RecipesBench, args))
