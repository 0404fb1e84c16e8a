"""``distseq train CONFIG [key=value ...]``, also as ``torchrun -m distseq train``."""

from __future__ import annotations

import argparse
import os

from distseq.config import load_config
from distseq.train.loop import train
from distseq.train.signals import StopSignals


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("train", help="train a CNN+RNN (also under torchrun -m distseq train)")
    p.add_argument("config", help="YAML config file (distseq config CONFIG: as resolved)")
    p.add_argument(
        "overrides",
        nargs="*",
        help="key=value overrides, e.g. data.window=512 (every key: distseq config --keys)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    # SIGTERM (scancel, preemption, torchrun shutting its workers down) saves before exiting.
    stop = StopSignals()
    # Under torchrun every rank loads the config; the first alone tells of renamed keys.
    quiet = os.environ.get("RANK", "0") != "0"
    train(load_config(args.config, args.overrides, quiet=quiet), stop=stop)
