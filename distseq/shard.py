"""``distseq shard``: videos or frame folders plus phase labels -> shards in format v1 (data.py).

Each input becomes one sample, or with ``--window T`` one sample per window of T frames every
``--stride`` frames. Output frame j shows source frame ``floor(j * source_fps / fps)`` (frame
index based: constant frame rate is assumed), resized so its short side is ``--size`` and centre
cropped to a square, then JPEG encoded. Its label is that source frame's label.

Layout of ``--out``::

    train-000000.tar, val-000000.tar, ...  finished shards; only ever created by os.replace
    index.json                              the manifest of data.py plus "fps", "size", "sources"
    .done/options.json                      the options that fix what a sample holds
    .done/<first shard>.json                commit records: a group of shards and their videos
    .work/                                  one temporary tar per video, made by the workers

Resume and atomicity. Workers encode whole videos into ``.work/<stem>.tar``; the main process
packs them, in sorted stem order, into ``NAME.tar.tmp`` and renames each shard when it is full.
Shards hold whole videos (a new shard starts when the next video would push the open one past
``--max-shard-bytes``), except that a video larger than that fills shards of its own, split
between samples. Whenever a shard closes at a video boundary, one record in ``.done`` commits the
shards closed since the last record together with the videos they hold, so a shard never holds
part of an uncommitted video. A re-run skips committed videos, deletes what a killed run left
(``*.tmp``, ``.work``, final-named shards that no record lists) and numbers new shards after the
committed ones. Videos in the shard that was open when a run died are encoded again. index.json
is rebuilt from all commit records, so it also lists videos committed by earlier runs.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import fcntl
import hashlib
import io
import json
import logging
import math
import multiprocessing
import os
import random
import re
import shutil
import tarfile
from collections.abc import Generator, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import torch
from torchvision.io import ImageReadMode, decode_image, encode_jpeg
from torchvision.transforms.v2.functional import center_crop, resize
from tqdm import tqdm

from distseq.config import ConfigError
from distseq.data import FORMAT, DataError, ShardInfo

log = logging.getLogger(__name__)

VIDEO_SUFFIXES = (".avi", ".mkv", ".mov", ".mp4")
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
# "-phase.txt" is how Cholec80 names its phase annotations.
LABEL_SUFFIXES = (".txt", ".csv", ".tsv", "-phase.txt")
_SHARD_RE = re.compile(r"(train|val)-(\d{6})\.tar")
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
class Source:
    stem: str  # sample key: the file or folder name without suffix, made safe for webdataset
    path: Path
    is_folder: bool  # a folder of frame images, not a video file


@dataclass(frozen=True)
class Labels:
    path: Path
    per_frame: list[str] | None  # one phase name per source frame
    ranges: list[tuple[float, float, str]] | None  # (start s, end s, name), in order, disjoint

    def names(self) -> set[str]:
        if self.per_frame is not None:
            return set(self.per_frame)
        return {name for _, _, name in self.ranges or []}


@dataclass(frozen=True)
class Job:
    """One video's work for a worker process."""

    source: Source
    labels: Labels
    class_ids: dict[str, int]
    fps: Fraction
    folder_fps: Fraction
    size: int
    quality: int
    window: int
    stride: int
    tar: Path


@dataclass(frozen=True)
class Encoded:
    tar: Path
    sha256: str
    frames: int  # source frames
    fps: float  # source frame rate
    samples: int


@dataclass(frozen=True)
class Summary:
    videos: int  # inputs found
    skipped: int  # already committed by an earlier run
    processed: int
    shards: int  # written by this run
    frames: int  # written by this run


def add_parser(sub: argparse._SubParsersAction) -> None:
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
        val=None if val is None else [_safe_stem(stem) for stem in val],
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


# ---- inputs and labels ----------------------------------------------------------------------


def _safe_stem(stem: str) -> str:
    # webdataset splits member names at the first dot; keep keys to a portable alphabet.
    return re.sub(r"[^0-9A-Za-z_-]", "_", stem)


def _natural(path: Path) -> list[int | str]:
    """Sort key under which frame_2.png comes before frame_10.png."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _images(folder: Path) -> list[Path]:
    found = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    return sorted(found, key=_natural)


def _is_video(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in VIDEO_SUFFIXES


def find_sources(inputs: list[Path]) -> list[Source]:
    found: list[Source] = []
    for path in inputs:
        if path.is_file():
            if not _is_video(path):
                raise DataError(f"{path}: not a video ({', '.join(VIDEO_SUFFIXES)})")
            found.append(Source(_safe_stem(path.stem), path, False))
        elif path.is_dir():
            if _images(path):
                found.append(Source(_safe_stem(path.name), path, True))
                continue
            inner = [
                c for c in sorted(path.iterdir()) if _is_video(c) or (c.is_dir() and _images(c))
            ]
            if not inner:
                raise DataError(f"{path}: holds no videos, frame images or frame folders")
            for c in inner:
                found.append(Source(_safe_stem(c.stem if c.is_file() else c.name), c, c.is_dir()))
        else:
            raise DataError(f"input not found: {path}")
    by_stem: dict[str, Path] = {}
    for s in found:
        if s.stem in by_stem:
            raise DataError(f"inputs {by_stem[s.stem]} and {s.path} both give sample key {s.stem}")
        by_stem[s.stem] = s.path
    return sorted(found, key=lambda s: s.stem)


def find_label_file(folder: Path, source: Source) -> Path:
    name = source.path.name if source.is_folder else source.path.stem
    found = [folder / (name + suffix) for suffix in LABEL_SUFFIXES]
    found = [p for p in found if p.is_file()]
    if not found:
        tried = ", ".join(name + suffix for suffix in LABEL_SUFFIXES)
        raise DataError(f"no label file for {source.path} in {folder} (tried {tried})")
    if len(found) > 1:
        raise DataError(f"{source.path}: more than one label file: {', '.join(map(str, found))}")
    return found[0]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_labels(path: Path) -> Labels:
    """Per-frame rows ``frame<TAB>phase`` or time ranges ``start,end,label``; header optional."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read: {e}") from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            fields = [f.strip() for f in line.split("\t" if "\t" in line else ",")]
            rows.append((number, fields))
    if rows and not _is_number(rows[0][1][0]):
        rows = rows[1:]
    if not rows:
        raise DataError(f"{path}: no labels")
    width = len(rows[0][1])
    for number, fields in rows:
        if width not in (2, 3) or len(fields) != width or not fields[-1]:
            raise DataError(
                f"{path} line {number}: expected rows 'frame<TAB>phase' or 'start,end,label'"
            )
    if width == 2:
        per_frame: list[str] = []
        for number, (index, name) in rows:
            if index != str(len(per_frame)):
                raise DataError(
                    f"{path} line {number}: frame {index!r}, expected {len(per_frame)} "
                    "(one row per frame, in order from 0)"
                )
            per_frame.append(name)
        return Labels(path, per_frame, None)
    ranges: list[tuple[float, float, str]] = []
    for number, (start, end, name) in rows:
        if not (_is_number(start) and _is_number(end)):
            raise DataError(f"{path} line {number}: start and end must be seconds")
        a, b = float(start), float(end)
        if not 0 <= a < b or (ranges and a < ranges[-1][1]):
            raise DataError(
                f"{path} line {number}: range {a:g}..{b:g} s is empty, negative, out of order "
                "or overlaps the previous one"
            )
        ranges.append((a, b, name))
    return Labels(path, None, ranges)


def phase_names(labels: Labels, n: int, rate: Fraction, video: Path) -> list[str]:
    """One phase name per source frame; one frame of rounding at the end is tolerated."""
    if labels.per_frame is not None:
        names = labels.per_frame
        if abs(len(names) - n) > 1:
            raise DataError(f"{labels.path}: {len(names)} labelled frames, but {video} has {n}")
        return names[:n] + names[-1:] * (n - len(names))
    assert labels.ranges is not None
    ranges = labels.ranges
    end = ranges[-1][1]
    duration = float(n / rate)
    if abs(end - duration) > float(1 / rate) + 1e-9:
        raise DataError(
            f"{labels.path}: ranges end at {end:g} s, but {video} lasts {duration:g} s "
            f"({n} frames at {float(rate):g} fps)"
        )
    starts = [a for a, _, _ in ranges]
    names = []
    for k in range(n):
        t = float(k / rate)
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and t < ranges[i][1]:
            names.append(ranges[i][2])
        elif t >= end:  # within the one-frame tolerance checked above
            names.append(ranges[-1][2])
        else:
            raise DataError(f"{labels.path}: no range covers {t:g} s (frame {k} of {video})")
    return names


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


# ---- encoding (runs in worker processes) ----------------------------------------------------


def _repeats(k: int, rate: Fraction, fps: Fraction) -> int:
    """How many output frames show source frame k, when output frame j shows floor(j*rate/fps)."""
    return math.ceil((k + 1) * fps / rate) - math.ceil(k * fps / rate)


def _jpeg(img: torch.Tensor, size: int, quality: int) -> bytes:
    img = center_crop(resize(img, [size], antialias=True), [size, size])
    return bytes(encode_jpeg(img.contiguous(), quality=quality).numpy().tobytes())


def _sha256(source: Source) -> str:
    h = hashlib.sha256()
    files = _images(source.path) if source.is_folder else [source.path]
    for path in files:
        if source.is_folder:
            h.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def _source_bytes(source: Source) -> int:
    files = _images(source.path) if source.is_folder else [source.path]
    return sum(p.stat().st_size for p in files)


def _decode_video(job: Job) -> tuple[list[bytes], list[int], int, Fraction]:
    """JPEGs of the output frames, the source frame each shows, source frames and rate."""
    path = job.source.path
    jpegs: list[bytes] = []
    picks: list[int] = []
    n = 0
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise DataError(f"{path}: no video stream")
            stream = container.streams.video[0]
            guess = stream.average_rate or stream.guessed_rate
            if not guess:
                raise DataError(f"{path}: unknown frame rate")
            rate = Fraction(guess)
            for frame in container.decode(stream):
                reps = _repeats(n, rate, job.fps)
                if reps:
                    img = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1)
                    jpegs += [_jpeg(img, job.size, job.quality)] * reps
                    picks += [n] * reps
                n += 1
    except (av.FFmpegError, OSError) as e:
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise DataError(f"{path}: cannot decode video: {reason}") from None
    if n == 0:
        raise DataError(f"{path}: no frames decoded")
    return jpegs, picks, n, rate


def _decode_folder(job: Job) -> tuple[list[bytes], list[int], int, Fraction]:
    images = _images(job.source.path)
    jpegs: list[bytes] = []
    picks: list[int] = []
    for k, image in enumerate(images):
        reps = _repeats(k, job.folder_fps, job.fps)
        if reps:
            try:
                img = decode_image(str(image), mode=ImageReadMode.RGB)
            except (RuntimeError, OSError) as e:
                raise DataError(
                    f"{image}: not a readable image: {str(e).splitlines()[0]}"
                ) from None
            jpegs += [_jpeg(img, job.size, job.quality)] * reps
            picks += [k] * reps
    return jpegs, picks, len(images), job.folder_fps


def window_starts(n: int, window: int, stride: int) -> list[int]:
    """Every stride frames, plus one window flush with the end so that the tail is covered."""
    if window == 0 or n <= window:
        return [0]
    starts = list(range(0, n - window + 1, stride))
    if starts[-1] + window < n:
        starts.append(n - window)
    return starts


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    # Fixed metadata, as in distseq.synthetic: the same input gives the same bytes.
    info.mode, info.mtime, info.uname, info.gname = 0o444, 0, "distseq", "distseq"
    tar.addfile(info, io.BytesIO(data))


def _init_worker() -> None:
    torch.set_num_threads(1)  # the pool already runs one video per core


def encode(job: Job) -> Encoded:
    """Decode, resample, label and JPEG-encode one video into its temporary tar ``job.tar``."""
    decode = _decode_folder if job.source.is_folder else _decode_video
    jpegs, picks, n, rate = decode(job)
    names = phase_names(job.labels, n, rate, job.source.path)
    labels = [job.class_ids[names[k]] for k in picks]
    starts = window_starts(len(jpegs), job.window, job.stride)
    length = job.window or len(jpegs)
    with tarfile.open(job.tar, "w", format=tarfile.USTAR_FORMAT) as tar:
        for start in starts:
            key = f"{job.source.stem}_w{start:06d}" if job.window else job.source.stem
            for t, data in enumerate(jpegs[start : start + length]):
                _add_member(tar, f"{key}.{t:06d}.jpg", data)
            doc = {"labels": labels[start : start + length]}
            _add_member(tar, f"{key}.labels.json", json.dumps(doc).encode())
    return Encoded(job.tar, _sha256(job.source), n, float(rate), len(starts))


# ---- packing, commit records, resume --------------------------------------------------------


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _span(m: tarfile.TarInfo) -> int:
    """Bytes a member takes in a tar: header(s) plus data padded to 512-byte blocks."""
    return m.offset_data - m.offset + -(-m.size // 512) * 512


def _samples(tar: tarfile.TarFile) -> list[list[tarfile.TarInfo]]:
    samples: list[list[tarfile.TarInfo]] = []
    key = None
    for m in tar.getmembers():
        if m.name.split(".", 1)[0] != key:
            key = m.name.split(".", 1)[0]
            samples.append([])
        samples[-1].append(m)
    return samples


class _Packer:
    """Packs whole videos into one split's shards and commits them in groups (module docstring)."""

    def __init__(self, out: Path, split: str, index: int, max_bytes: float) -> None:
        self.out, self.split, self.index, self.max_bytes = out, split, index, max_bytes
        self.file: io.BufferedWriter | None = None
        self.tar: tarfile.TarFile | None = None
        self.info = ShardInfo(split, 0, 0)
        self.bytes = 0
        self.group: dict[str, ShardInfo] = {}  # shards closed since the last commit
        self.sources: dict[str, dict[str, Any]] = {}  # videos held by the group and the open shard
        self.shards_written = 0
        self.frames_written = 0

    def _name(self) -> str:
        return f"{self.split}-{self.index:06d}.tar"

    def add(self, tar_path: Path, stem: str, source: dict[str, Any]) -> None:
        with tarfile.open(tar_path) as src:
            samples = _samples(src)
            sizes = [sum(_span(m) for m in members) for members in samples]
            if self.tar is not None and self.bytes + sum(sizes) > self.max_bytes:
                self._close_shard()
                self._commit()
            for members, size in zip(samples, sizes, strict=True):
                if self.tar is not None and self.bytes + size > self.max_bytes:
                    self._close_shard()  # this video alone fills shards: commit after its end
                tar = self.tar or self._open_shard()
                for m in members:
                    tar.addfile(m, src.extractfile(m))
                self.bytes += size
                self.info.samples += 1
                self.info.frames += len(members) - 1  # all but labels.json
        self.sources[stem] = source
        tar_path.unlink()

    def _open_shard(self) -> tarfile.TarFile:
        # Stays open across calls of add(): closed by _close_shard() or discard().
        self.file = open(self.out / (self._name() + ".tmp"), "wb")  # noqa: SIM115
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.USTAR_FORMAT)  # noqa: SIM115
        return self.tar

    def _close_shard(self) -> None:
        assert self.tar is not None and self.file is not None
        self.tar.close()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        name = self._name()
        os.replace(self.out / (name + ".tmp"), self.out / name)
        self.group[name] = self.info
        self.shards_written += 1
        self.frames_written += self.info.frames
        self.tar, self.file = None, None
        self.info, self.bytes, self.index = ShardInfo(self.split, 0, 0), 0, self.index + 1

    def _commit(self) -> None:
        if not self.group:
            return
        record = {
            "shards": {name: vars(info) for name, info in self.group.items()},
            "sources": self.sources,
        }
        _write_atomic(self.out / ".done" / f"{min(self.group)}.json", json.dumps(record, indent=1))
        self.group, self.sources = {}, {}

    def close(self) -> None:
        if self.tar is not None:
            self._close_shard()
        self._commit()

    def discard(self) -> None:
        """After a failure: drop the open shard; its videos are redone by the next run."""
        if self.tar is not None and self.file is not None:
            self.tar.close()
            self.file.close()
            (self.out / (self._name() + ".tmp")).unlink()
            self.tar = None


def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
        shards = {name: ShardInfo(**info) for name, info in record["shards"].items()}
        sources = dict(record["sources"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise DataError(f"{path}: bad commit record ({e}); delete it to redo its videos") from None
    return {"shards": shards, "sources": sources}


@contextlib.contextmanager
def _claim(out: Path, settings: dict[str, Any]) -> Iterator[None]:
    """Hold --out for this run: refuse another writer, foreign shards and changed options."""
    out.mkdir(parents=True, exist_ok=True)
    done = out / ".done"
    options = done / "options.json"
    if not options.is_file() and (
        (out / "index.json").exists() or any(_SHARD_RE.fullmatch(p.name) for p in out.iterdir())
    ):
        raise ConfigError(
            f"{out} holds shards that distseq shard did not write there (no .done/options.json): "
            "choose an empty --out"
        )
    done.mkdir(exist_ok=True)
    with open(done / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{out}: another distseq shard is writing there") from None
        # Options may change until something is committed under them.
        if options.is_file() and any(done.glob("*.tar.json")):
            old = json.loads(options.read_text())
            for key, value in settings.items():
                if old.get(key) != value:
                    raise ConfigError(
                        f"{out} was written with {key}={old.get(key)!r}, not {value!r}: "
                        "rerun with the original options, or choose a new --out"
                    )
        else:
            _write_atomic(options, json.dumps(settings, indent=1))
        yield


def _committed(out: Path) -> list[dict[str, Any]]:
    """The valid commit records of --out; deletes whatever a killed run left besides them."""
    done = out / ".done"
    records = []
    for path in sorted(done.glob("*.tar.json")):
        record = _read_record(path)
        missing = [name for name in record["shards"] if not (out / name).is_file()]
        if missing:
            log.warning("%s is missing: redoing the videos of %s", out / missing[0], path)
            path.unlink()
            continue
        records.append(record)
    keep = {name for record in records for name in record["shards"]}
    for folder in (out, done):
        for path in folder.iterdir():
            stale = _SHARD_RE.fullmatch(path.name) and path.name not in keep
            if path.is_file() and (stale or path.name.endswith(".tmp")):
                path.unlink()
    shutil.rmtree(out / ".work", ignore_errors=True)
    return records


def _check_unchanged(source: Source, label_file: Path, record: dict[str, Any], split: str) -> None:
    """A committed video must still be what its shards hold: sharding it again would duplicate."""
    if record["split"] != split:
        raise ConfigError(
            f"{source.stem} was written to {record['split']}, this run puts it in {split}: "
            "rerun with the original inputs, --val and --seed, or choose a new --out"
        )
    what = "since it was sharded; restore it or choose a new --out"
    if record["bytes"] != _source_bytes(source):
        raise DataError(f"{source.path}: changed {what}")
    if record["labels_sha256"] != _file_sha256(label_file):
        raise DataError(f"{label_file}: changed {what}")


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _results(jobs: list[Job], workers: int) -> Generator[Encoded, None, None]:
    """Encoded videos in job order; up to ``workers`` encode at once."""
    if workers == 0:
        yield from map(encode, jobs)
        return
    # spawn, not fork: a forked child can hang in OpenMP state the parent's torch left behind.
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker)
    try:
        futures = [pool.submit(encode, job) for job in jobs]
        for job, future in zip(jobs, futures, strict=True):
            try:
                yield future.result()
            except BrokenProcessPool:
                raise DataError(
                    f"a worker process died (out of memory?) with {job.source.path} or a later "
                    "video unfinished; rerun to resume, maybe with fewer --workers"
                ) from None
    finally:
        pool.shutdown(cancel_futures=True)


def _next_index(records: list[dict[str, Any]]) -> dict[str, int]:
    """Per split, the number after the highest committed shard."""
    next_index = {"train": 0, "val": 0}
    for record in records:
        for name in record["shards"]:
            match = _SHARD_RE.fullmatch(name)
            if match is None:
                raise DataError(f"{name}: not a shard name in a commit record of distseq shard")
            next_index[match[1]] = max(next_index[match[1]], int(match[2]) + 1)
    return next_index


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

    with _claim(out, opts.settings(classes)):
        records = _committed(out)
        committed = {stem: rec for r in records for stem, rec in r["sources"].items()}
        for s in sources:
            if s.stem in committed:
                _check_unchanged(s, label_files[s.stem], committed[s.stem], split[s.stem])
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
        next_index = _next_index(records)
        packers = {
            sp: _Packer(out, sp, next_index[sp], opts.max_shard_bytes) for sp in ("train", "val")
        }
        results = _results(jobs, opts.workers)
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
                        "bytes": _source_bytes(s),
                        "frames": enc.frames,
                        "fps": enc.fps,
                        "samples": enc.samples,
                        "labels": label_files[s.stem].name,
                        "labels_sha256": _file_sha256(label_files[s.stem]),
                    }
                    packers[split[s.stem]].add(enc.tar, s.stem, source)
                    bar.update()
            for packer in packers.values():
                packer.close()
        finally:
            for packer in packers.values():
                packer.discard()
            shutil.rmtree(work, ignore_errors=True)
        _write_index(out, classes, opts, _committed(out))
    return Summary(
        videos=len(sources),
        skipped=len(sources) - len(todo),
        processed=len(todo),
        shards=sum(p.shards_written for p in packers.values()),
        frames=sum(p.frames_written for p in packers.values()),
    )


def _write_index(
    out: Path, classes: list[str], opts: Options, records: list[dict[str, Any]]
) -> None:
    shards = {name: vars(info) for r in records for name, info in r["shards"].items()}
    sources = {stem: rec for r in records for stem, rec in r["sources"].items()}
    doc = {
        "format": FORMAT,
        "classes": classes,
        "shards": dict(sorted(shards.items())),
        "fps": float(opts.fps),
        "size": opts.size,
        "sources": dict(sorted(sources.items())),
    }
    _write_atomic(out / "index.json", json.dumps(doc, indent=1) + "\n")
