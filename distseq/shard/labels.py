"""Phase labels of the inputs: per-frame or time-range phase files, one per video.

A label file is ``<stem>.txt|.csv|.tsv`` (or Cholec80's ``<stem>-phase.txt``) in the --labels
folder: rows ``frame<TAB>phase`` or one label per line (MS-TCN's ``groundTruth``), at the source
frame rate, or ``start_s,end_s,phase``. Windows line ends and byte-order marks read the same.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from distseq.data.label_text import fields, frame_labels, is_number, numbered_lines
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


def read_labels(path: Path) -> Labels:
    """Per-frame labels in any layout of ``data.label_text`` (rows ``frame<TAB>phase`` from 0,
    or one label per line, as MS-TCN's ``groundTruth``), or time ranges ``start,end,label``;
    header optional."""
    rows = [(number, fields(line)) for number, line in numbered_lines(path)]
    if rows and not is_number(rows[0][1][0]) and len(rows[0][1]) == 3:
        rows = rows[1:]  # a header "start,end,label"
    if not rows:
        raise DataError(f"{path}: no labels")
    if len(rows[0][1]) not in (1, 2, 3):
        raise DataError(
            f"{path} line {rows[0][0]}: expected rows 'frame<TAB>phase', one label, "
            "or 'start,end,label'"
        )
    if len(rows[0][1]) != 3:
        by_frame = frame_labels(path)
        for k, frame in enumerate(sorted(by_frame)):
            if frame != k:
                raise DataError(
                    f"{path}: frame {frame} follows frame {k - 1}: one row per frame, in order "
                    "from 0"
                )
        return Labels(path, [by_frame[k] for k in range(len(by_frame))], None)
    ranges: list[tuple[float, float, str]] = []
    for number, row in rows:
        if len(row) != 3 or not row[2]:
            raise DataError(f"{path} line {number}: expected 'start,end,label' like line 1")
        start, end, name = row
        if not (is_number(start) and is_number(end)):
            raise DataError(f"{path} line {number}: start and end must be seconds")
        a, b = float(start), float(end)
        if not 0 <= a < b or (ranges and a < ranges[-1][1]):
            raise DataError(
                f"{path} line {number}: range {a:g}..{b:g} s is empty, negative, out of order "
                "or overlaps the previous one"
            )
        ranges.append((a, b, name))
    return Labels(path, None, ranges)


def phase_names(
    labels: Labels, n: int, rate: Fraction, video: Path, tolerance: int
) -> tuple[list[str | None], str]:
    """One phase name per source frame (None: unlabelled), and a line saying where the labels
    and the video differ in length ("" where they do not). Up to ``tolerance`` frames of
    difference are taken: frames past the labels' end are unlabelled, labels past the video's
    end are dropped; more is refused."""
    if labels.per_frame is not None:
        given = len(labels.per_frame)
        excess = given - n
        if abs(excess) > tolerance:
            raise DataError(
                f"{labels.path}: {given} labelled frames, but {video} has {n} "
                f"(--label-tolerance {tolerance})"
            )
        names: list[str | None] = list(labels.per_frame[:n]) + [None] * max(0, -excess)
        return names, _difference(labels.path, video, excess, f"{given} labelled frames", n)
    assert labels.ranges is not None
    ranges = labels.ranges
    end = ranges[-1][1]
    duration = float(n / rate)
    if abs(end - duration) > float(tolerance / rate) + 1e-9:
        raise DataError(
            f"{labels.path}: ranges end at {end:g} s, but {video} lasts {duration:g} s "
            f"({n} frames at {float(rate):g} fps; --label-tolerance {tolerance})"
        )
    starts = [a for a, _, _ in ranges]
    names = []
    for k in range(n):
        t = float(k / rate)
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and t < ranges[i][1]:
            names.append(ranges[i][2])
        elif t >= end:  # within the tolerance checked above
            names.append(None)
        else:
            raise DataError(f"{labels.path}: no range covers {t:g} s (frame {k} of {video})")
    excess = round((end - duration) * rate) if end > duration else -names.count(None)
    return names, _difference(labels.path, video, excess, f"ranges to {end:g} s", n)


def _difference(path: Path, video: Path, excess: int, given: str, n: int) -> str:
    if excess < 0:
        return f"{path}: {given}, {video} has {n}: its last {-excess} unlabelled"
    if excess > 0:
        return f"{path}: {given}, {video} has {n}: the last {excess} labels dropped"
    return ""
