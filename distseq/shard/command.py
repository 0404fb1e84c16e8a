"""``distseq shard``: videos or frame folders plus phase labels -> shards in format v1
(``distseq.data.format``).

The options, each checked, and the run over ``write.py``.
"""

from __future__ import annotations

import argparse
import os
from fractions import Fraction
from pathlib import Path

from distseq.data.datasets import STANDARD_SPLITS
from distseq.data.format import JPEG_QUALITY
from distseq.data.label_text import read_mapping, read_video_list
from distseq.data.sources import safe_stem
from distseq.errors import ConfigError
from distseq.shard.write import Options, shard_inputs

# Rates typed as rounded decimals (14.985014985) become the exact ratio (15000/1001), so that
# floor(j * source_fps / fps) does not land one frame short at exact multiples.
_MAX_FPS_DENOMINATOR = 10_000


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "shard",
        help="videos or frame folders + phase labels -> WebDataset shards",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("inputs", nargs="+", type=Path, help="video files, frame folders, or folders")
    p.add_argument(
        "--labels",
        required=True,
        type=Path,
        help="folder of <stem>.txt|.csv|.tsv: rows 'frame<TAB>phase', one label per line (MS-TCN's "
        "groundTruth/), or 'start_s,end_s,phase'",
    )
    p.add_argument(
        "--unlabelled",
        action="append",
        default=[],
        metavar="NAME",
        help="a label name of frames that carry no label (repeatable)",
    )
    p.add_argument(
        "--label-tolerance",
        type=int,
        default=1,
        metavar="FRAMES",
        help="label files this many frames shorter or longer than their video are taken, the "
        "difference unlabelled or dropped (one line per video)",
    )
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--fps", type=Fraction, default=Fraction(1), help="output frame rate")
    p.add_argument(
        "--folder-fps", type=Fraction, default=None, help="frame rate of frame folders (= --fps)"
    )
    p.add_argument("--size", type=int, default=224, help="square output frames, pixels")
    p.add_argument("--quality", type=int, default=JPEG_QUALITY, help="JPEG quality, 1..100")
    p.add_argument("--max-shard-bytes", type=float, default=1e9, help="shard size limit")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--val-fraction", type=float, default=0.2, help="share of videos for val")
    split.add_argument("--val", default=None, help="comma-separated stems of the val videos")
    split.add_argument("--val-list", type=Path, default=None, help="file of val videos (.bundle)")
    split.add_argument(
        "--standard-split",
        default="",
        choices=sorted(STANDARD_SPLITS),
        help="a published train/val/test split by video number",
    )
    test = p.add_mutually_exclusive_group()
    test.add_argument("--test", default=None, help="comma-separated stems of the test videos")
    test.add_argument("--test-list", type=Path, default=None, help="file of test videos (.bundle)")
    p.add_argument(
        "--train-list",
        type=Path,
        default=None,
        help="file of train videos (.bundle); videos in no list are left out",
    )
    p.add_argument("--window", type=int, default=None, help="frames per sample (default: all)")
    p.add_argument("--stride", type=int, default=None, help="frames between windows (= window)")
    vocabulary = p.add_mutually_exclusive_group()
    vocabulary.add_argument(
        "--classes", default=None, help="comma-separated phase names, in id order"
    )
    vocabulary.add_argument(
        "--mapping", type=Path, default=None, help="MS-TCN's mapping.txt: '<id> <name>' lines"
    )
    p.add_argument(
        "--workers", type=int, default=min(8, os.cpu_count() or 1), help="0: no subprocesses"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the train/val split")
    p.set_defaults(run=run)


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [name.strip() for name in text.split(",") if name.strip()]


def parse_options(args: argparse.Namespace) -> Options:
    def check(ok: bool, option: str, value: object, want: str) -> None:
        if not ok:
            raise ConfigError(f"{option} {value}: {want}")

    check(args.fps > 0, "--fps", args.fps, "must be > 0")
    folder_fps = args.fps if args.folder_fps is None else args.folder_fps
    check(folder_fps > 0, "--folder-fps", folder_fps, "must be > 0")
    check(args.size >= 16, "--size", args.size, "must be >= 16 (data.size's minimum)")
    check(1 <= args.quality <= 100, "--quality", args.quality, "must be in 1..100")
    check(args.max_shard_bytes > 0, "--max-shard-bytes", args.max_shard_bytes, "must be > 0")
    check(0 <= args.val_fraction < 1, "--val-fraction", args.val_fraction, "must be in [0, 1)")
    check(args.workers >= 0, "--workers", args.workers, "must be >= 0")
    check(args.stride is None or args.window is not None, "--stride", args.stride, "needs --window")
    window = args.window or 0
    check(args.window is None or window >= 1, "--window", args.window, "must be >= 1")
    stride = window if args.stride is None else args.stride
    check(args.stride is None or stride >= 1, "--stride", args.stride, "must be >= 1")
    check(args.label_tolerance >= 0, "--label-tolerance", args.label_tolerance, "must be >= 0")
    lists = (args.test, args.test_list, args.train_list)
    check(
        not (args.standard_split and any(x is not None for x in lists)),
        "--standard-split",
        args.standard_split,
        "sets every split: drop --test, --test-list and --train-list",
    )
    classes = read_mapping(args.mapping) if args.mapping else _names(args.classes)
    val = read_video_list(args.val_list) if args.val_list else _names(args.val)
    test = read_video_list(args.test_list) if args.test_list else _names(args.test)
    train = read_video_list(args.train_list) if args.train_list else None
    if classes is not None:
        check(bool(classes), "--classes", args.classes, "must name at least one class")
        check(len(set(classes)) == len(classes), "--classes", args.classes, "has duplicates")
        both = sorted(set(args.unlabelled) & set(classes))
        check(not both, "--unlabelled", both[0] if both else "", "is also a class")
    return Options(
        inputs=list(args.inputs),
        labels=args.labels,
        out=args.out,
        fps=args.fps.limit_denominator(_MAX_FPS_DENOMINATOR),
        folder_fps=folder_fps.limit_denominator(_MAX_FPS_DENOMINATOR),
        size=args.size,
        quality=args.quality,
        max_shard_bytes=args.max_shard_bytes,
        val_fraction=args.val_fraction,
        val=None if val is None else [safe_stem(stem) for stem in val],
        test=[safe_stem(stem) for stem in test or []],
        train=None if train is None else [safe_stem(stem) for stem in train],
        standard_split=args.standard_split,
        unlabelled=args.unlabelled,
        tolerance=args.label_tolerance,
        window=window,
        stride=stride,
        workers=args.workers,
        seed=args.seed,
        classes=classes,
    )


def run(args: argparse.Namespace) -> None:
    opts = parse_options(args)
    s = shard_inputs(opts)
    print(
        f"distseq shard: {s.processed} videos encoded, {s.skipped} already done; "
        f"{s.shards} new shards with {s.frames} frames; manifest {opts.out / 'index.json'}"
    )
