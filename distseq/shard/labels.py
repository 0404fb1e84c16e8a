"""Phase labels of the inputs: per-frame or time-range phase files, one per video.

A label file is ``<stem>.txt|.csv|.tsv`` (or Cholec80's ``<stem>-phase.txt``) in the --labels
folder: rows ``frame<TAB>phase`` at the source frame rate, or ``start_s,end_s,phase``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from distseq.data.sources import Source
from distseq.errors import DataError

# "-phase.txt" is how Cholec80 names its phase annotations.
LABEL_SUFFIXES = (".txt", ".csv", ".tsv", "-phase.txt")


@dataclass(frozen=True)
class Labels:
    path: Path
    per_frame: list[str] | None  # one phase name per source frame
    ranges: list[tuple[float, float, str]] | None  # (start s, end s, name), in order, disjoint

    def names(self) -> set[str]:
        if self.per_frame is not None:
            return set(self.per_frame)
        return {name for _, _, name in self.ranges or []}


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
