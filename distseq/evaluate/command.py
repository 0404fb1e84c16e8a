"""``distseq eval``, ``distseq predict`` and ``distseq report``: their options, and each a thin
run over the library (``evaluation``, ``predict``, ``report``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TypeAlias

from distseq.checkpoint.export import load_model
from distseq.errors import ConfigError
from distseq.evaluate.evaluation import evaluate, table
from distseq.evaluate.predict import frame_recipe, predict_videos
from distseq.evaluate.report import make_report
from distseq.parallel import close_distributed, init_distributed

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser("eval", help="phase metrics of a trained model on whole videos")
    p.add_argument("model", help="run directory, checkpoint, or exported .pt (safe to share)")
    p.add_argument("--split", default="val", help="val (the model's data.val) or a shard pattern")
    p.add_argument("--manifest", default="", help="index.json of --split; default: beside it")
    p.add_argument("--relaxed-seconds", type=float, default=0.0, help="Cholec80's is 10")
    p.add_argument("--fps", type=float, default=None, help="stored frames/s; default: index.json")
    p.add_argument("--out", default="", help="eval.json and CSVs; default: MODEL's folder / eval")
    p.add_argument("--json", action="store_true", help="print eval.json instead of the table")
    p.add_argument(
        "--background",
        action="append",
        default=[],
        metavar="NAME",
        help="a class that makes no segment of the segment metrics (repeatable)",
    )
    p.set_defaults(run=run_eval)

    p = sub.add_parser("predict", help="per-frame phases of videos, frame folders or shards")
    p.add_argument("model", help="exported .pt (safe to share), run directory or checkpoint")
    p.add_argument("inputs", nargs="+", help="video files, frame folders, folders, or shards")
    p.add_argument("--out", required=True, help="folder for <video>.csv (and .png)")
    p.add_argument("--fps", type=float, default=None, help="frames/s; default: training index.json")
    p.add_argument("--folder-fps", type=float, default=None, help="of frame folders (= --fps)")
    p.add_argument("--size", type=int, default=0, help="stored square size; default: as trained")
    p.add_argument("--quality", type=int, default=0, help="JPEG quality; default: as trained")
    p.add_argument(
        "--chunk", type=int, default=0, help="frames per forward; default: memory.chunk_frames"
    )
    p.add_argument("--ribbon", action="store_true", help="also a PNG ribbon of the phases")
    p.set_defaults(run=run_predict)

    p = sub.add_parser("report", help="plots of a run and one report.html")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (train.out_dir)")
    p.add_argument("--out", default="", help="default: RUN/report")
    p.add_argument("--split", default="", help="shards of the ribbons; default: the run's val")
    p.set_defaults(run=run_report)


def run_eval(args: argparse.Namespace) -> None:
    if args.relaxed_seconds < 0:
        raise ConfigError(f"--relaxed-seconds {args.relaxed_seconds}: must be >= 0")
    source = Path(args.model)
    loaded = load_model(source)
    out = Path(args.out) if args.out else (source if source.is_dir() else source.parent) / "eval"
    info = init_distributed()  # under torchrun, the videos are split across the ranks
    try:
        report = evaluate(
            loaded,
            args.split,
            args.manifest,
            args.relaxed_seconds,
            args.fps,
            out,
            info,
            args.background,
        )
    finally:
        close_distributed()
    if info.is_main:
        print(json.dumps(report, indent=1) if args.json else table(report, loaded.classes))


def run_predict(args: argparse.Namespace) -> None:
    loaded = load_model(Path(args.model))
    how = frame_recipe(loaded, args.fps, args.folder_fps, args.size, args.quality)
    chunk = args.chunk or loaded.config.memory.chunk_frames
    out = Path(args.out)
    info = init_distributed()
    try:
        total = predict_videos(loaded, args.inputs, how, chunk, out, args.ribbon, info)
    finally:
        close_distributed()
    if info.is_main:
        print(f"predicted {total} videos into {out}")


def run_report(args: argparse.Namespace) -> None:
    source = Path(args.run_dir)
    out = Path(args.out) if args.out else source / "report"
    images = make_report(source, out, args.split)
    print(f"wrote {out / 'report.html'} with {len(images)} pictures")
