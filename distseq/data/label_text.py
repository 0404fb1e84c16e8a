"""Label text files as the field distributes them, read the same whether written on Linux or on
Windows (CRLF line ends, a UTF-8 byte-order mark): per-frame label files in their four layouts,
MS-TCN's ``mapping.txt`` and its split lists (``*.bundle``).

Per-frame layouts, told apart by their first line:

- ``frame,time_s,phase,...``: ``distseq predict``'s and ``eval``'s CSVs;
- ``### Frame level recognition: ###`` then the labels separated by spaces: MS-TCN's predictions;
- ``Frame<TAB>Phase`` rows (header optional; Cholec80's annotations and most prediction files
  made for its MATLAB evaluation), frame numbers in any steps (25 fps truth, 1 fps predictions);
- one label per line: MS-TCN's ``groundTruth/<video>.txt``.
"""

from __future__ import annotations

import csv
from pathlib import Path

from distseq.errors import DataError

MSTCN_HEADER = "###"  # MS-TCN's predictions begin "### Frame level recognition: ###"


def read_text(path: Path) -> str:
    """The file's text; ``utf-8-sig`` drops a byte-order mark, splitlines() takes CRLF."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read: {e}") from None


def numbered_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, stripped text) of the lines that are neither blank nor ``#`` comments."""
    return [
        (number, line.strip())
        for number, line in enumerate(read_text(path).splitlines(), 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]


def fields(line: str) -> list[str]:
    """A row's fields: split at tabs, else at commas, else at runs of spaces."""
    parts = line.split("\t") if "\t" in line else line.split(",") if "," in line else line.split()
    return [part.strip() for part in parts]


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def frame_labels(path: Path) -> dict[int, str]:
    """A per-frame label file in any layout of the module docstring: label by frame number."""
    return labelled_frames(path)[0]


def labelled_frames(path: Path) -> tuple[dict[int, str], bool]:
    """:func:`frame_labels`, and whether the file numbers its frames (a CSV, ``Frame<TAB>Phase``
    rows) or only lists them in order (MS-TCN's layouts), where its n labels are frames 0..n-1
    only by convention: a file cut short cannot be told from one at another rate."""
    text = read_text(path)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.startswith(MSTCN_HEADER):
        body = text.split("\n", 1)[1] if "\n" in text else ""
        return dict(enumerate(body.split())), False
    if first.lower().startswith("frame,"):
        records = list(csv.DictReader(text.splitlines()))
        if not records or "phase" not in records[0]:
            raise DataError(f"{path}: a CSV needs the columns frame and phase")
        out: dict[int, str] = {}
        for number, record in enumerate(records, 2):
            frame, phase = record["frame"] or "", record["phase"] or ""
            if not frame.isdigit() or not phase:
                raise DataError(f"{path} line {number}: expected a frame number and a phase")
            out[int(frame)] = phase
        return out, True
    rows = [(n, fields(line)) for n, line in numbered_lines(path)]
    if not rows:
        raise DataError(f"{path}: no labels")
    if len(rows[0][1]) == 2 and not rows[0][1][0].isdigit():
        rows = rows[1:]  # a header, as Cholec80's "Frame<TAB>Phase"
    width = len(rows[0][1]) if rows else 1
    if width == 1:
        return {k: row[0] for k, (_, row) in enumerate(rows)}, False
    labels: dict[int, str] = {}
    for number, row in rows:
        if len(row) != 2 or not row[0].isdigit() or not row[1]:
            raise DataError(
                f"{path} line {number}: expected 'frame<TAB>label' like the lines above"
            )
        if int(row[0]) in labels:
            raise DataError(f"{path} line {number}: frame {row[0]} again")
        labels[int(row[0])] = row[1]
    return labels, True


def read_mapping(path: Path) -> list[str]:
    """MS-TCN's ``mapping.txt``: lines ``<id> <name>``, ids 0..n-1; the names in id order."""
    names: dict[int, str] = {}
    for number, line in numbered_lines(path):
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or not parts[0].isdigit():
            raise DataError(f"{path} line {number}: expected '<id> <name>'")
        if int(parts[0]) in names or parts[1] in names.values():
            raise DataError(f"{path} line {number}: id {parts[0]} or name {parts[1]!r} again")
        names[int(parts[0])] = parts[1]
    if sorted(names) != list(range(len(names))):
        raise DataError(f"{path}: ids must be 0..{len(names) - 1}, each once")
    if not names:
        raise DataError(f"{path}: no classes")
    return [names[i] for i in range(len(names))]


def read_video_list(path: Path) -> list[str]:
    """A split list (MS-TCN's ``*.bundle``): one video file name per line; their stems."""
    stems = []
    for _, line in numbered_lines(path):
        name = Path(line.replace("\\", "/")).name
        stems.append(name.split(".", 1)[0] if "." in name else name)
    if not stems:
        raise DataError(f"{path}: lists no videos")
    return stems


def csv_classes(path: Path) -> list[str] | None:
    """The class names of a ``frame,time_s,phase,...`` CSV's header, in order; None for files of
    the other layouts."""
    first = next((line for line in read_text(path).splitlines() if line.strip()), "")
    header = next(csv.reader([first]))
    if [name.strip().lower() for name in header[:3]] != ["frame", "time_s", "phase"]:
        return None
    return header[3:] or None
