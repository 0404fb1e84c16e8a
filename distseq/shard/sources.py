"""Inputs and their labels: video files or frame folders, and per-frame or time-range phase files.

A label file is ``<stem>.txt|.csv|.tsv`` (or Cholec80's ``<stem>-phase.txt``) in the --labels
folder: rows ``frame<TAB>phase`` at the source frame rate, or ``start_s,end_s,phase``.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from distseq.errors import DataError

VIDEO_SUFFIXES = (".avi", ".mkv", ".mov", ".mp4")
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
# "-phase.txt" is how Cholec80 names its phase annotations.
LABEL_SUFFIXES = (".txt", ".csv", ".tsv", "-phase.txt")


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


def safe_stem(stem: str) -> str:
    # webdataset splits member names at the first dot; keep keys to a portable alphabet.
    return re.sub(r"[^0-9A-Za-z_-]", "_", stem)


def _natural(path: Path) -> list[int | str]:
    """Sort key under which frame_2.png comes before frame_10.png."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def image_files(folder: Path) -> list[Path]:
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
            found.append(Source(safe_stem(path.stem), path, False))
        elif path.is_dir():
            if image_files(path):
                found.append(Source(safe_stem(path.name), path, True))
                continue
            inner = [
                c for c in sorted(path.iterdir()) if _is_video(c) or (c.is_dir() and image_files(c))
            ]
            if not inner:
                raise DataError(f"{path}: holds no videos, frame images or frame folders")
            for c in inner:
                found.append(Source(safe_stem(c.stem if c.is_file() else c.name), c, c.is_dir()))
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
