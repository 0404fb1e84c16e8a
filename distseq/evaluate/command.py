"""``distseq eval`` and ``report``: their options, and each a thin run over the library
(``evaluation`` and ``scored_files``, ``report``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TypeAlias

from distseq.checkpoint.export import load_model
from distseq.data.label_text import read_mapping
from distseq.errors import ConfigError
from distseq.evaluate.folds import folds_table, over_folds
from distseq.evaluate.judging import Judging, evaluate, table, write_report
from distseq.evaluate.report import make_report
from distseq.evaluate.scored_files import score_files
from distseq.files import output_folder, write_atomic
from distseq.parallel import DistInfo, close_distributed, init_distributed
from distseq.score.metrics import PROTOCOLS

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
    p.add_argument(
        "--fps",
        type=float,
        default=None,
        help="frames/s of the shards, before data.frame_stride; default: index.json",
    )
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

    p = sub.add_parser("report", help="plots of a run and one report.html")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (train.out_dir)")
    p.add_argument("--out", default="", help="default: RUN/report")
    p.add_argument("--split", default="", help="shards of the ribbons; default: the run's val")
    p.set_defaults(run=run_report)


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
    if args.out:
        output_folder(args.out)
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


def run_report(args: argparse.Namespace) -> None:
    source = Path(args.run_dir)
    out = output_folder(args.out) if args.out else source / "report"
    images = make_report(source, out, args.split)
    print(f"wrote {out / 'report.html'} with {len(images)} pictures")
