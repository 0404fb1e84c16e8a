"""``distseq eval``, ``predict``, ``features`` and ``report``: their options, and each a thin run
over the library (``evaluation`` and ``scored_files``, ``predict``, ``features``, ``report``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TypeAlias

from distseq.checkpoint.export import Loaded, load_model
from distseq.config import Norm
from distseq.data.label_text import read_mapping
from distseq.errors import ConfigError
from distseq.evaluate.evaluation import Judging, evaluate, table, write_report
from distseq.evaluate.features import FORMATS, named_backbone, write_features
from distseq.evaluate.folds import folds_table, over_folds
from distseq.evaluate.metrics import PROTOCOLS
from distseq.evaluate.predict import FrameRecipe, frame_recipe, predict_videos
from distseq.evaluate.report import make_report
from distseq.evaluate.scored_files import score_files
from distseq.files import write_atomic
from distseq.parallel import DistInfo, close_distributed, init_distributed

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "eval",
        help="phase and segment metrics of trained models, or of prediction files, on whole videos",
    )
    p.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="run directory, checkpoint, or exported .pt (safe to share); several: one per fold",
    )
    p.add_argument(
        "--predictions",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a folder of prediction files instead of a model (repeatable: one per fold)",
    )
    p.add_argument("--labels", type=Path, default=None, help="the truth files of --predictions")
    p.add_argument("--mapping", type=Path, default=None, help="MS-TCN's mapping.txt: the classes")
    p.add_argument(
        "--prediction-stride",
        type=int,
        default=None,
        metavar="N",
        help="prediction files of labels alone (no frame numbers) give every Nth truth frame; "
        "without it such a file must have a label for every truth frame",
    )
    p.add_argument(
        "--split", default="val", help="val, test or train (the model's shards) or a shard pattern"
    )
    p.add_argument("--manifest", default="", help="index.json of --split; default: beside it")
    p.add_argument(
        "--protocol",
        default="distseq",
        choices=PROTOCOLS,
        help="distseq (documented) or script: Cholec80's MATLAB evaluation, its slips included",
    )
    p.add_argument(
        "--relaxed-seconds",
        type=float,
        default=None,
        help="Cholec80's is 10; default: off (the script protocol: 10)",
    )
    p.add_argument("--fps", type=float, default=None, help="frames/s scored; default: index.json")
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

    p = _model_over_videos(sub, "predict", "per-frame phases of videos, frame folders or shards")
    p.add_argument("--ribbon", action="store_true", help="also a PNG ribbon of the phases")
    p.set_defaults(run=run_predict)

    p = _model_over_videos(
        sub, "features", "per-frame backbone features once: feature shards, or <video>.npy", "*"
    )
    p.add_argument(
        "--format",
        default="shards",
        choices=FORMATS,
        help="shards: from shards, for data.features=true; npy: (features, frames) per video",
    )
    p.add_argument(
        "--backbone",
        default="",
        help="a torchvision backbone by name instead of MODEL: every positional is an input",
    )
    p.add_argument("--weights", default="", help="--backbone's weights: IMAGENET1K_V2 or a file")
    p.add_argument(
        "--norm", default="frozen_bn", choices=[n.value for n in Norm], help="--backbone's norm"
    )
    p.set_defaults(run=run_features)

    p = sub.add_parser("report", help="plots of a run and one report.html")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (train.out_dir)")
    p.add_argument("--out", default="", help="default: RUN/report")
    p.add_argument("--split", default="", help="shards of the ribbons; default: the run's val")
    p.set_defaults(run=run_report)


def _model_over_videos(
    sub: Subparsers, name: str, what: str, inputs: str = "+"
) -> argparse.ArgumentParser:
    """The options of a model run over videos whose frames are made as its training frames were
    (``predict`` and ``features``); ``inputs``: their nargs."""
    p = sub.add_parser(name, help=what)
    p.add_argument("model", help="exported .pt (safe to share), run directory or checkpoint")
    p.add_argument("inputs", nargs=inputs, help="video files, frame folders, folders, or shards")
    p.add_argument("--out", required=True, type=Path, help="folder for one file per video")
    p.add_argument("--fps", type=float, default=None, help="frames/s; default: training index.json")
    p.add_argument("--folder-fps", type=float, default=None, help="of frame folders (= --fps)")
    p.add_argument("--size", type=int, default=0, help="stored square size; default: as trained")
    p.add_argument("--quality", type=int, default=0, help="JPEG quality; default: as trained")
    p.add_argument(
        "--chunk", type=int, default=0, help="frames per forward; default: memory.chunk_frames"
    )
    return p


def _model_and_frames(
    args: argparse.Namespace, loaded: Loaded | None = None
) -> tuple[Loaded, FrameRecipe, int]:
    """The model of ``_model_over_videos``' options (or ``loaded``), its frame recipe, and the
    chunk size."""
    loaded = loaded or load_model(Path(args.model))
    how = frame_recipe(loaded, args.fps, args.folder_fps, args.size, args.quality)
    return loaded, how, args.chunk or loaded.config.memory.chunk_frames


def run_eval(args: argparse.Namespace) -> None:
    sources = [*args.models, *map(str, args.predictions)]
    if bool(args.models) == bool(args.predictions):
        raise ConfigError("distseq eval: give MODEL(s) or --predictions DIR(s), one of the two")
    if bool(args.predictions) != (args.labels is not None):
        raise ConfigError("--predictions and --labels go together")
    if args.prediction_stride is not None and args.prediction_stride < 1:
        raise ConfigError(f"--prediction-stride {args.prediction_stride}: must be >= 1")
    if args.prediction_stride is not None and not args.predictions:
        raise ConfigError("--prediction-stride is for --predictions")
    if args.mapping is not None and not args.predictions:
        raise ConfigError("--mapping is for --predictions: a model knows its classes")
    if len(sources) > 1 and not args.out:
        raise ConfigError("several folds: pass --out, the folder of folds.json and each fold's")
    judging = Judging(args.relaxed_seconds, args.protocol, tuple(args.background))
    info = init_distributed()  # under torchrun, each model's videos are split across the ranks
    reports, names = [], []
    try:
        for i, source in enumerate(sources):
            path = Path(source)
            out = Path(args.out) if args.out else (path if path.is_dir() else path.parent) / "eval"
            if len(sources) > 1:
                out = out / f"fold{i + 1}"
            if args.predictions:
                reports.append(_score_folder(path, args, judging, out, info.is_main))
            else:
                reports.append(_evaluate_model(path, args, judging, out, info))
            names.append(f"fold{i + 1}" if len(sources) > 1 else path.name)
    finally:
        close_distributed()
    if not info.is_main:
        return
    if len(reports) == 1:
        print(json.dumps(reports[0], indent=1) if args.json else table(reports[0]))
        return
    summary = {"sources": sources, **over_folds(reports, names)}
    write_atomic(Path(args.out) / "folds.json", json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1) if args.json else folds_table(summary))


def _evaluate_model(
    path: Path, args: argparse.Namespace, judging: Judging, out: Path, info: DistInfo
) -> dict[str, object]:
    loaded = load_model(path)
    return evaluate(loaded, args.split, args.manifest, judging, args.fps, out, info)


def _score_folder(
    folder: Path, args: argparse.Namespace, judging: Judging, out: Path, is_main: bool
) -> dict[str, object]:
    mapping = read_mapping(args.mapping) if args.mapping else None
    say = print if is_main else (lambda line: None)
    report = score_files(
        folder, args.labels, mapping, judging, args.fps, say, args.prediction_stride
    )
    if is_main:
        write_report(out, report)
    return report


def run_predict(args: argparse.Namespace) -> None:
    loaded, how, chunk = _model_and_frames(args)
    info = init_distributed()
    try:
        total = predict_videos(loaded, args.inputs, how, chunk, args.out, args.ribbon, info)
    finally:
        close_distributed()
    if info.is_main:
        print(f"predicted {total} videos into {args.out}")


def run_features(args: argparse.Namespace) -> None:
    named = None
    if args.backbone:  # no MODEL: the first positional is an input too
        args.inputs = [args.model, *args.inputs]
        named = named_backbone(args.backbone, args.weights, args.norm, args.inputs, args.size)
    elif not args.inputs:
        raise ConfigError("distseq features: give the inputs after MODEL (or --backbone NAME)")
    loaded, how, chunk = _model_and_frames(args, named)
    info = init_distributed()
    try:
        done = write_features(loaded, args.inputs, how, chunk, args.out, info, args.format)
    finally:
        close_distributed()
    if info.is_main:
        speed = (
            f", {done.frames / done.seconds:.1f} frames/s in the backbone" if done.seconds else ""
        )
        print(
            f"wrote {done.videos} videos ({done.frames} frames) into {args.out}, "
            f"{done.skipped} {'shards' if args.format == 'shards' else 'videos'} already there"
            f"{speed}"
        )


def run_report(args: argparse.Namespace) -> None:
    source = Path(args.run_dir)
    out = Path(args.out) if args.out else source / "report"
    images = make_report(source, out, args.split)
    print(f"wrote {out / 'report.html'} with {len(images)} pictures")
