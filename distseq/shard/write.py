"""The run of ``distseq shard``: inputs and labels, split by video, encoded in worker processes
and packed into crash-safe shards with their index.json.

Each input becomes one sample, or with ``--sample-frames T`` one sample of T frames every
``--stride`` frames. Output frame j shows source frame ``floor(j * source_fps / fps)`` (frame
index based: constant frame rate is assumed), resized so its short side is ``--size`` and centre
cropped to a square, then JPEG encoded. Its label is that source frame's label.

The stages are ``data.sources`` (inputs) and ``labels`` -> ``encode`` (worker processes) ->
``pack`` (shards, commit records, resume); see ``pack`` for the layout of ``--out``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import shutil
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from tqdm import tqdm

from distseq.data.cholec80 import default_class_order, standard_split
from distseq.data.decode import UNLABELLED
from distseq.data.sources import Source, find_sources
from distseq.errors import ConfigError, DataError
from distseq.shard.encode import Job, encode_all, file_sha256, source_bytes
from distseq.shard.labels import Labels, find_label_file, read_labels
from distseq.shard.pack import (
    Packer,
    check_unchanged,
    claim,
    next_indices,
    read_commits,
    write_index,
)

log = logging.getLogger(__name__)


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
    sample_frames: int  # 0: one sample per video
    stride: int
    workers: int  # 0: encode in this process
    seed: int
    classes: list[str] | None  # None: the names found (datasets.default_class_order)
    test: list[str] = field(default_factory=list)  # explicit test stems
    train: list[str] | None = None  # explicit train stems; None: the videos not in val or test
    standard_split: str = ""  # a name of datasets.STANDARD_SPLITS, instead of the lists
    unlabelled: list[str] = field(default_factory=list)  # label names of unlabelled frames
    tolerance: int = 1  # frames of length difference taken between labels and video

    def settings(self, classes: list[str]) -> dict[str, Any]:
        """What decides a sample's content: a re-run into the same --out must not change it."""
        return {
            "fps": str(self.fps),
            "folder_fps": str(self.folder_fps),
            "size": self.size,
            "quality": self.quality,
            "window": self.sample_frames,  # its name before --sample-frames: old --out read alike
            "stride": self.stride,
            "classes": classes,
            "unlabelled": sorted(self.unlabelled),
            "label_tolerance": self.tolerance,
        }


@dataclass(frozen=True)
class Summary:
    videos: int  # inputs found
    skipped: int  # already committed by an earlier run
    processed: int
    shards: int  # written by this run
    frames: int  # written by this run


def split_videos(stems: list[str], opts: Options) -> dict[str, str]:
    """Each video's split: a standard split; else the test and train lists, and the explicit
    --val list or a seeded draw of --val-fraction from the videos left. A video in no split
    (with a train list) is not in the result."""
    if opts.standard_split:
        return standard_split(opts.standard_split, stems)
    lists = {"--val": opts.val or [], "--test": opts.test, "--train": opts.train or []}
    for option, listed in lists.items():
        unknown = sorted(set(listed) - set(stems))
        if unknown:
            raise ConfigError(f"{option} {unknown[0]}: no input has that stem")
    for (a, first), (b, second) in itertools.combinations(lists.items(), 2):
        both = sorted(set(first) & set(second))
        if both:
            raise ConfigError(f"{both[0]} is in {a} and in {b}: a video is in one split")
    test = set(opts.test)
    if opts.val is not None:
        val = set(opts.val)
    else:
        order = sorted(set(opts.train or stems) - test)
        random.Random(f"distseq-split:{opts.seed}").shuffle(order)
        # At least one train video whenever there are any.
        count = min(round(len(order) * opts.val_fraction), len(order) - 1)
        val = set(order[:count])
    train = set(stems) - test - val if opts.train is None else set(opts.train) - val
    return {
        stem: "test" if stem in test else "val" if stem in val else "train"
        for stem in stems
        if stem in test | val | train
    }


def shard_inputs(opts: Options) -> Summary:
    """Write the shards, commit records and index.json for ``opts``; see the module docstring."""
    sources = find_sources(opts.inputs)
    # The split's names first: a misspelt one is said before any label file is read.
    split = split_videos([s.stem for s in sources], opts)
    left_out = [s.stem for s in sources if s.stem not in split]
    if left_out:
        names = ", ".join(left_out[:3]) + (", ..." if len(left_out) > 3 else "")
        print(f"distseq shard: {len(left_out)} inputs in no split's list, left out: {names}")
    sources = [s for s in sources if s.stem in split]
    label_files = {s.stem: find_label_file(opts.labels, s) for s in sources}
    labels = {stem: read_labels(path) for stem, path in label_files.items()}
    classes = _vocabulary(labels, opts)
    with claim(opts.out, opts.settings(classes)):
        records = read_commits(opts.out)
        committed = {stem: rec for r in records for stem, rec in r["sources"].items()}
        for s in sources:
            if s.stem in committed:
                check_unchanged(s, label_files[s.stem], committed[s.stem], split[s.stem])
        todo = [s for s in sources if s.stem not in committed]
        log.info("%d of %d videos to encode into %s", len(todo), len(sources), opts.out)
        class_ids = {name: i for i, name in enumerate(classes)}
        class_ids |= dict.fromkeys(opts.unlabelled, UNLABELLED)
        jobs = [_job(s, labels[s.stem], class_ids, opts) for s in todo]
        packers = {
            sp: Packer(opts.out, sp, i, opts.max_shard_bytes, len(classes))
            for sp, i in next_indices(records).items()
        }
        work = opts.out / ".work"
        work.mkdir()
        try:
            _encode_and_pack(jobs, packers, split, label_files, opts.workers)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        index = (opts.out, classes, float(opts.fps), opts.size, opts.quality)
        write_index(*index, read_commits(opts.out))
    return Summary(
        videos=len(sources),
        skipped=len(sources) - len(todo),
        processed=len(todo),
        shards=sum(p.shards_written for p in packers.values()),
        frames=sum(p.frames_written for p in packers.values()),
    )


def _vocabulary(labels: dict[str, Labels], opts: Options) -> list[str]:
    """The class names in id order: --classes (every label must be one of them, or
    --unlabelled), or the names found, in Cholec80's order where they are its phases."""
    unlabelled = set(opts.unlabelled)
    if opts.classes is None:
        found = set().union(*(lab.names() for lab in labels.values()))
        return default_class_order(found - unlabelled)
    for lab in labels.values():
        unknown = sorted(lab.names() - set(opts.classes) - unlabelled)
        if unknown:
            raise DataError(f"{lab.path}: label {unknown[0]!r} is not one of {opts.classes}")
    return opts.classes


def _job(source: Source, labels: Labels, class_ids: dict[str, int], opts: Options) -> Job:
    """One video's encoding, into its own tar in --out's .work/."""
    return Job(
        source=source,
        labels=labels,
        class_ids=class_ids,
        tolerance=opts.tolerance,
        fps=opts.fps,
        folder_fps=opts.folder_fps,
        size=opts.size,
        quality=opts.quality,
        sample_frames=opts.sample_frames,
        stride=opts.stride,
        tar=opts.out / ".work" / f"{source.stem}.tar",
    )


def _encode_and_pack(
    jobs: list[Job],
    packers: dict[str, Packer],
    split: dict[str, str],
    label_files: dict[str, Path],
    workers: int,
) -> None:
    """Encode ``jobs`` on ``workers`` processes and pack each video into its split's shards as
    it comes, with a progress bar; whatever is not committed at the end is discarded."""
    results = encode_all(jobs, workers)
    try:
        with (
            contextlib.closing(results),
            tqdm(total=len(jobs), unit="video", disable=not jobs) as bar,
        ):
            for job, enc in zip(jobs, results, strict=True):
                s = job.source
                if enc.note:
                    bar.write(enc.note)
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
