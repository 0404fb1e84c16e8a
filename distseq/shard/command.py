"""``distseq shard``: videos or frame folders plus phase labels -> shards in format v1
(``distseq.data.format``).

Each input becomes one sample, or with ``--window T`` one sample per window of T frames every
``--stride`` frames. Output frame j shows source frame ``floor(j * source_fps / fps)`` (frame
index based: constant frame rate is assumed), resized so its short side is ``--size`` and centre
cropped to a square, then JPEG encoded. Its label is that source frame's label.

The stages are ``sources`` (inputs, labels) -> ``encode`` (worker processes) -> ``pack``
(shards, commit records, resume); see ``pack`` for the layout of ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from tqdm import tqdm

from distseq.errors import ConfigError, DataError
from distseq.shard.encode import Job, encode_all, file_sha256, source_bytes
from distseq.shard.pack import (
    Packer,
    check_unchanged,
    claim,
    next_indices,
    read_commits,
    write_index,
)
from distseq.shard.sources import find_label_file, find_sources, read_labels, safe_stem

log = logging.getLogger(__name__)
# Rates typed as rounded decimals (14.985014985) become the exact ratio (15000/1001), so that
# floor(j * source_fps / fps) does not land one frame short at exact multiples.
_MAX_FPS_DENOMINATOR = 10_000


@dataclass(frozen=True)
class Options:
    inputs: list[Path]
    labels: Path
    out: Path
    fps: Fraction
    folder_fps: Fraction  # frame rate of frame-folder inputs
    size: int
    quality: int
    max_shard_bytes: float
    val_fraction: float
    val: list[str] | None  # explicit val stems; None: draw val_fraction of the videos
    window: int  # 0: one sample per video
    stride: int
    workers: int  # 0: encode in this process
    seed: int
    classes: list[str] | None  # None: sorted names found in the label files

    def settings(self, classes: list[str]) -> dict[str, Any]:
        """What decides a sample's content: a re-run into the same --out must not change it."""
        return {
            "fps": str(self.fps),
            "folder_fps": str(self.folder_fps),
            "size": self.size,
            "quality": self.quality,
            "window": self.window,
            "stride": self.stride,
            "classes": classes,
        }


@dataclass(frozen=True)
class Summary:
    videos: int  # inputs found
    skipped: int  # already committed by an earlier run
    processed: int
    shards: int  # written by this run
    frames: int  # written by this run


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
        help="folder of <stem>.txt|.csv|.tsv: rows 'frame<TAB>phase' or 'start_s,end_s,phase'",
    )
    p.add_argument("--out", required=True, type=Path, help="output folder")
    p.add_argument("--fps", type=Fraction, default=Fraction(1), help="output frame rate")
    p.add_argument(
        "--folder-fps", type=Fraction, default=None, help="frame rate of frame folders (= --fps)"
    )
    p.add_argument("--size", type=int, default=224, help="square output frames, pixels")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality, 1..100")
    p.add_argument("--max-shard-bytes", type=float, default=1e9, help="shard size limit")
    split = p.add_mutually_exclusive_group()
    split.add_argument("--val-fraction", type=float, default=0.2, help="share of videos for val")
    split.add_argument("--val", default=None, help="comma-separated stems of the val videos")
    p.add_argument("--window", type=int, default=None, help="frames per sample (default: all)")
    p.add_argument("--stride", type=int, default=None, help="frames between windows (= window)")
    p.add_argument("--classes", default=None, help="comma-separated phase names, in id order")
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
    classes = _names(args.classes)
    val = _names(args.val)
    if classes is not None:
        check(bool(classes), "--classes", args.classes, "must name at least one class")
        check(len(set(classes)) == len(classes), "--classes", args.classes, "has duplicates")
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


def split_videos(stems: list[str], opts: Options) -> dict[str, str]:
    """Train/val by video: the explicit --val list, or a seeded draw of --val-fraction."""
    if opts.val is not None:
        unknown = sorted(set(opts.val) - set(stems))
        if unknown:
            raise ConfigError(f"--val {unknown[0]}: no input has that stem")
        val = set(opts.val)
    else:
        order = sorted(stems)
        random.Random(f"distseq-split:{opts.seed}").shuffle(order)
        # At least one train video whenever there are any.
        count = min(round(len(order) * opts.val_fraction), len(order) - 1)
        val = set(order[:count])
    return {stem: "val" if stem in val else "train" for stem in stems}


def shard_inputs(opts: Options) -> Summary:
    """Write the shards, commit records and index.json for ``opts``; see the module docstring."""
    sources = find_sources(opts.inputs)
    label_files = {s.stem: find_label_file(opts.labels, s) for s in sources}
    labels = {stem: read_labels(path) for stem, path in label_files.items()}
    if opts.classes is not None:
        classes = opts.classes
        for lab in labels.values():
            unknown = sorted(lab.names() - set(classes))
            if unknown:
                raise DataError(f"{lab.path}: label {unknown[0]!r} is not in --classes")
    else:
        classes = sorted(set().union(*(lab.names() for lab in labels.values())))
    split = split_videos([s.stem for s in sources], opts)
    class_ids = {name: i for i, name in enumerate(classes)}
    out = opts.out

    with claim(out, opts.settings(classes)):
        records = read_commits(out)
        committed = {stem: rec for r in records for stem, rec in r["sources"].items()}
        for s in sources:
            if s.stem in committed:
                check_unchanged(s, label_files[s.stem], committed[s.stem], split[s.stem])
        todo = [s for s in sources if s.stem not in committed]
        log.info("%d of %d videos to encode into %s", len(todo), len(sources), out)
        work = out / ".work"
        work.mkdir()
        jobs = [
            Job(
                source=s,
                labels=labels[s.stem],
                class_ids=class_ids,
                fps=opts.fps,
                folder_fps=opts.folder_fps,
                size=opts.size,
                quality=opts.quality,
                window=opts.window,
                stride=opts.stride,
                tar=work / f"{s.stem}.tar",
            )
            for s in todo
        ]
        next_index = next_indices(records)
        packers = {
            sp: Packer(out, sp, next_index[sp], opts.max_shard_bytes) for sp in ("train", "val")
        }
        results = encode_all(jobs, opts.workers)
        try:
            with (
                contextlib.closing(results),
                tqdm(total=len(jobs), unit="video", disable=not jobs) as bar,
            ):
                for job, enc in zip(jobs, results, strict=True):
                    s = job.source
                    source = {
                        "split": split[s.stem],
                        "sha256": enc.sha256,
                        "bytes": source_bytes(s),
                        "frames": enc.frames,
                        "fps": enc.fps,
                        "samples": enc.samples,
                        "labels": label_files[s.stem].name,
                        "labels_sha256": file_sha256(label_files[s.stem]),
                    }
                    packers[split[s.stem]].add(enc.tar, s.stem, source)
                    bar.update()
            for packer in packers.values():
                packer.close()
        finally:
            for packer in packers.values():
                packer.discard()
            shutil.rmtree(work, ignore_errors=True)
        write_index(out, classes, float(opts.fps), opts.size, opts.quality, read_commits(out))
    return Summary(
        videos=len(sources),
        skipped=len(sources) - len(todo),
        processed=len(todo),
        shards=sum(p.shards_written for p in packers.values()),
        frames=sum(p.frames_written for p in packers.values()),
    )
