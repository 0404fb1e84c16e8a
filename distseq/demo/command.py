"""``distseq demo``: the recall task trained three ways on the CPU, one table (three_ways.py)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from distseq.demo.three_ways import run_demo, table
from distseq.files import output_folder


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="long-sequence recall, trained three ways, on CPU")
    p.add_argument("--out", default="runs/demo", help="where data and runs go")
    p.add_argument("--train-sequences", type=int, default=256, help="sequences made to train on")
    p.add_argument("--val-sequences", type=int, default=128, help="sequences made to score on")
    p.add_argument("--json", action="store_true", help="one JSON record per model")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the demo config")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    output_folder(args.out)
    records = run_demo(args.out, args.overrides, args.train_sequences, args.val_sequences)
    if args.json:
        for record in records:
            print(json.dumps(asdict(record)))
    else:
        print("\n" + table(records, args.val_sequences))
