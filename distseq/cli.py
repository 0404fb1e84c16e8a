"""``distseq`` command line: train, demo, shard, submit, export, bench."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from distseq.config import ConfigError

# Errors that users cause: printed as one line, never as a traceback.
EXIT_CONFIG = 2
EXIT_FAILURE = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="distseq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a CNN+RNN (also under torchrun -m distseq train)")
    train.add_argument("config", help="YAML config file")
    train.add_argument("overrides", nargs="*", help="key=value overrides, e.g. data.frames=512")

    demo = sub.add_parser("demo", help="synthetic long-video task, trained end to end on CPU")
    demo.add_argument("--out", default="runs/demo", help="where data and runs go")
    demo.add_argument("overrides", nargs="*", help="key=value overrides of the demo config")

    from distseq import export, shard, submit

    shard.add_parser(sub)
    export.add_parser(sub)
    submit.add_parser(sub)

    bench = sub.add_parser("bench", help="print benchmark numbers")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    memory = bench_sub.add_parser("memory", help="activation memory and step time per backend")
    memory.add_argument("--backbone", default="resnet18")
    memory.add_argument("--frames", type=int, nargs="+", default=[64, 256, 1024])
    memory.add_argument("--size", type=int, default=112)
    memory.add_argument("--chunk", type=int, default=8)
    memory.add_argument("--backends", nargs="+", default=["none", "torch", "fairscale"])
    memory.add_argument("--json", action="store_true", help="one JSON record per case")
    data = bench_sub.add_parser("data", help="loader frames/s per worker against plain decoding")
    data.add_argument("--size", type=int, default=224, help="frame size of the shards (px)")
    data.add_argument("--frames", type=int, default=64, help="window T (data.frames)")
    data.add_argument("--count", type=int, default=2048, help="frames timed per case")
    data.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    data.add_argument("--model-fps", type=float, default=1000.0, help="frames/s a step consumes")
    data.add_argument(
        "--shards", default="", help="local train shards (index.json beside); default: synthetic"
    )
    data.add_argument("--json", action="store_true", help="one JSON record per case")
    return parser


def _run(args: argparse.Namespace) -> None:
    if args.command == "train":
        from distseq.config import load_config
        from distseq.train import StopSignals, train

        # SIGTERM (scancel, preemption, torchrun shutting its workers down) saves before exiting.
        train(load_config(args.config, args.overrides), stop=StopSignals())
    elif args.command == "demo":
        from distseq.demo import run_demo

        run_demo(args.out, args.overrides)
    elif args.command == "submit":
        from distseq.submit import run as submit_run

        submit_run(args)
    elif args.command == "export":
        from distseq.export import run as export_run

        export_run(args)
    elif args.command == "shard":
        from distseq.shard import run as shard_run

        shard_run(args)
    elif args.command == "bench" and args.bench == "memory":
        from distseq.bench import bench_memory

        bench_memory(args)
    elif args.command == "bench" and args.bench == "data":
        from distseq.bench_data import bench_data

        bench_data(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from distseq.data import DataError
    from distseq.train import TrainingError

    rank = os.environ.get("RANK")
    prefix = "distseq: error: " if rank is None else f"distseq: error (rank {rank}): "
    try:
        _run(args)
    except ConfigError as e:
        print(prefix + str(e), file=sys.stderr)
        return EXIT_CONFIG
    except (DataError, TrainingError) as e:
        print(prefix + str(e), file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(prefix + "interrupted", file=sys.stderr)
        return 130
    return 0
