"""``distseq export CHECKPOINT --out FILE``: one model file, safe to share (``export.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from distseq.checkpoint.export import export


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("export", help="write one consolidated model file from a checkpoint")
    parser.add_argument(
        "checkpoint", help="run directory, its checkpoints/, a latest file or a step_N directory"
    )
    parser.add_argument("--out", required=True, help="the .pt file to write")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    loaded = export(Path(args.checkpoint), Path(args.out))
    print(f"wrote {args.out}: {loaded.which}")
