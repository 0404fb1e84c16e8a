"""``distseq shard``: videos or frame folders plus phase labels -> shards in format v1
(``distseq.data.manifest``); or, with ``--released ROOT --fold N``, the released features of an
action-segmentation dataset (MS-TCN's layout) -> feature shards.

The options, each checked, and the run over ``write.py`` (or ``released.py``).
"""

from __future__ import annotations

import argparse
import os
from fractions import Fraction
from pathlib import Path

from distseq.data.cholec80 import STANDARD_SPLITS
from distseq.data.label_text import read_mapping, read_video_list
from distseq.data.manifest import JPEG_QUALITY, SPLITS, Manifest
from distseq.data.sources import safe_stem
from distseq.errors import ConfigError
from distseq.files import output_folder
from distseq.options import renamed
from distseq.shard.released import DEFAULT_VIDEOS_PER_SHARD, import_release
from distseq.shard.write import Options, shard_inputs

# Rates typed as rounded decimals (14.985014985) become the exact ratio (15000/1001), so that
# floor(j * source_fps / fps) does not land one frame short at exact multiples.
_MAX_FPS_DENOMINATOR = 10_000


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "shard",
        help="videos or frame folders + phase labels -> WebDataset shards",
        description="Videos or frame folders plus phase labels -> shards in format v1; or, with "
        "--released ROOT --fold N, the released features of an action-segmentation dataset "
        "(MS-TCN's layout) -> feature shards.",
    )
    p.add_argument("inputs", nargs="*", type=Path, help="video files, frame folders, or folders")
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument(
        "--workers", type=int, default=min(8, os.cpu_count() or 1), help="0: no subprocesses"
    )
    _labels(p.add_argument_group("labels"))
    _frames(p.add_argument_group("frames and samples"))
    _splits(p.add_argument_group("splits"))
    renamed(p, "--window", "--sample-frames")
    _released(
        p.add_argument_group(
            "released features",
            "MS-TCN's release of 50Salads, Breakfast or GTEA (ROOT/features/*.npy, "
            "groundTruth/, mapping.txt, splits/) -> feature shards for data.features=true; no "
            "videos are read",
        )
    )
    # What --released leaves no meaning to: given with it, each is refused by name.
    frame_options = {dest: p.get_default(dest) for dest in _FRAME_OPTIONS}
    p.set_defaults(run=run, frame_defaults=frame_options)


def _labels(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--labels",
        default=None,
        type=Path,
        help="folder of <stem>.txt|.csv|.tsv: rows 'frame<TAB>phase', one label per line (MS-TCN's "
        "groundTruth/), or 'start_s,end_s,phase'",
    )
    vocabulary = g.add_mutually_exclusive_group()
    vocabulary.add_argument(
        "--classes", default=None, help="comma-separated phase names, in id order"
    )
    vocabulary.add_argument(
        "--mapping", type=Path, default=None, help="MS-TCN's mapping.txt: '<id> <name>' lines"
    )
    g.add_argument(
        "--unlabelled",
        action="append",
        default=[],
        metavar="NAME",
        help="a label name of frames that carry no label (repeatable)",
    )
    g.add_argument(
        "--label-tolerance",
        type=int,
        default=1,
        metavar="FRAMES",
        help="label files this many frames shorter or longer than their video are taken, the "
        "difference unlabelled or dropped (one line per video)",
    )


def _frames(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--fps", type=Fraction, default=Fraction(1), help="output frame rate")
    g.add_argument(
        "--folder-fps", type=Fraction, default=None, help="frame rate of frame folders (= --fps)"
    )
    g.add_argument("--size", type=int, default=224, help="square output frames, pixels")
    g.add_argument("--quality", type=int, default=JPEG_QUALITY, help="JPEG quality, 1..100")
    g.add_argument("--max-shard-bytes", type=float, default=1e9, help="shard size limit")
    g.add_argument(
        "--sample-frames", type=int, default=None, help="frames per sample (default: all)"
    )
    g.add_argument(
        "--stride", type=int, default=None, help="frames between samples (= --sample-frames)"
    )


def _splits(g: argparse._ArgumentGroup) -> None:
    val = g.add_mutually_exclusive_group()
    val.add_argument("--val-fraction", type=float, default=0.2, help="share of videos for val")
    val.add_argument("--val", default=None, help="comma-separated stems of the val videos")
    val.add_argument("--val-list", type=Path, default=None, help="file of val videos (.bundle)")
    val.add_argument(
        "--standard-split",
        default="",
        choices=sorted(STANDARD_SPLITS),
        help="a published train/val/test split by video number",
    )
    test = g.add_mutually_exclusive_group()
    test.add_argument("--test", default=None, help="comma-separated stems of the test videos")
    test.add_argument("--test-list", type=Path, default=None, help="file of test videos (.bundle)")
    g.add_argument(
        "--train-list",
        type=Path,
        default=None,
        help="file of train videos (.bundle); videos in no list are left out",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the train/val split")


def _released(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--released", type=Path, default=None, metavar="ROOT", help="the release's folder"
    )
    g.add_argument(
        "--fold",
        type=int,
        default=None,
        metavar="N",
        help="splits/train.splitN.bundle -> train shards, test.splitN.bundle -> test shards",
    )
    g.add_argument(
        "--videos-per-shard",
        type=int,
        default=None,
        metavar="V",
        help=f"videos in a shard (default: {DEFAULT_VIDEOS_PER_SHARD})",
    )


# The options of videos and frame folders, by dest; --released takes none of them.
_FRAME_OPTIONS = (
    "labels",
    "unlabelled",
    "label_tolerance",
    "fps",
    "folder_fps",
    "size",
    "quality",
    "max_shard_bytes",
    "val_fraction",
    "val",
    "val_list",
    "standard_split",
    "test",
    "test_list",
    "train_list",
    "sample_frames",
    "stride",
    "classes",
    "mapping",
    "workers",
    "seed",
)


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [name.strip() for name in text.split(",") if name.strip()]


def _check(ok: bool, option: str, value: object, want: str) -> None:
    if not ok:
        raise ConfigError(f"{option} {value}: {want}")


def parse_released(args: argparse.Namespace) -> tuple[Path, int, Path, int]:
    """--released ROOT, --fold N, --out and --videos-per-shard, with no option of videos."""
    if args.inputs:
        raise ConfigError(f"--released reads no videos: drop {args.inputs[0]}")
    for dest, default in args.frame_defaults.items():
        if getattr(args, dest) != default:
            raise ConfigError(
                f"--{dest.replace('_', '-')}: not an option of --released (the release's "
                "features, labels and splits are taken as they are)"
            )
    if args.fold is None:
        raise ConfigError("--released needs --fold N: the N of splits/train.splitN.bundle")
    _check(args.fold >= 1, "--fold", args.fold, "must be >= 1")
    given = args.videos_per_shard
    per_shard = DEFAULT_VIDEOS_PER_SHARD if given is None else given
    _check(per_shard >= 1, "--videos-per-shard", per_shard, "must be >= 1")
    return args.released, args.fold, args.out, per_shard


def parse_options(args: argparse.Namespace) -> Options:
    check = _check
    for option, value in (("--fold", args.fold), ("--videos-per-shard", args.videos_per_shard)):
        check(value is None, option, value, "is for --released ROOT")
    if not args.inputs:
        raise ConfigError("distseq shard needs videos, frame folders or folders (or --released)")
    if args.labels is None:
        raise ConfigError("distseq shard needs --labels FOLDER, the videos' label files")

    check(args.fps > 0, "--fps", args.fps, "must be > 0")
    folder_fps = args.fps if args.folder_fps is None else args.folder_fps
    check(folder_fps > 0, "--folder-fps", folder_fps, "must be > 0")
    check(args.size >= 16, "--size", args.size, "must be >= 16 (data.size's minimum)")
    check(1 <= args.quality <= 100, "--quality", args.quality, "must be in 1..100")
    check(args.max_shard_bytes > 0, "--max-shard-bytes", args.max_shard_bytes, "must be > 0")
    check(0 <= args.val_fraction < 1, "--val-fraction", args.val_fraction, "must be in [0, 1)")
    check(args.workers >= 0, "--workers", args.workers, "must be >= 0")
    given = args.sample_frames
    check(
        args.stride is None or given is not None, "--stride", args.stride, "needs --sample-frames"
    )
    sample_frames = given or 0
    check(given is None or sample_frames >= 1, "--sample-frames", given, "must be >= 1")
    stride = sample_frames if args.stride is None else args.stride
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
        sample_frames=sample_frames,
        stride=stride,
        workers=args.workers,
        seed=args.seed,
        classes=classes,
    )


def run(args: argparse.Namespace) -> None:
    output_folder(args.out)
    if args.released is not None:
        root, fold, out, per_shard = parse_released(args)
        done = import_release(root, fold, out, per_shard)
        splits = [sp for sp in SPLITS if any(i.split == sp for i in done.manifest.shards.values())]
        patterns = " ".join(f"'{out}/{p}'" for p in _patterns(done.manifest, splits))
        print(
            f"distseq shard: {done.videos} videos in {len(done.manifest.shards)} shards "
            f"({done.written} written, {done.skipped} already there), {done.frames} frames "
            f"written; manifest {out / 'index.json'}; shards {patterns}"
        )
        return
    opts = parse_options(args)
    s = shard_inputs(opts)
    print(
        f"distseq shard: {s.processed} videos encoded, {s.skipped} already done; "
        f"{s.shards} new shards with {s.frames} frames; manifest {opts.out / 'index.json'}"
    )


def _patterns(manifest: Manifest, splits: list[str]) -> list[str]:
    """Each split's shards as a brace pattern (data.train, data.val take them)."""
    found = []
    for split in splits:
        count = sum(info.split == split for info in manifest.shards.values())
        last = f"{count - 1:06d}"
        found.append(f"{split}-{{000000..{last}}}.tar" if count > 1 else f"{split}-000000.tar")
    return found
