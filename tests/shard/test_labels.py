"""Phase label files (labels.py): per-frame rows and time ranges; errors that name a line."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from distseq.data.sources import Source
from distseq.errors import DataError
from distseq.shard.labels import find_label_file, phase_names, read_labels


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_per_frame_rows_with_a_header_and_comments(tmp_path: Path) -> None:
    path = write(tmp_path / "v.txt", "Frame\tPhase\n# a note\n0\tPrep\n1\tPrep\n2\tCut\n")
    labels = read_labels(path)
    assert labels.per_frame == ["Prep", "Prep", "Cut"] and labels.names() == {"Prep", "Cut"}
    # Up to --label-tolerance frames of difference: the video's last frames are unlabelled
    # (None), or the labels' last are dropped, each said in one line.
    names, note = phase_names(labels, 4, Fraction(25), Path("v.mp4"), 1)
    assert names == ["Prep", "Prep", "Cut", None]
    assert note == f"{path}: 3 labelled frames, v.mp4 has 4: its last 1 unlabelled"
    names, note = phase_names(labels, 2, Fraction(25), Path("v.mp4"), 1)
    assert names == ["Prep", "Prep"] and note.endswith("v.mp4 has 2: the last 1 labels dropped")
    assert phase_names(labels, 3, Fraction(25), Path("v.mp4"), 0) == (["Prep", "Prep", "Cut"], "")
    assert phase_names(labels, 5, Fraction(25), Path("v.mp4"), 2)[0][3:] == [None, None]
    with pytest.raises(DataError, match=r"v\.txt: 3 labelled frames, but v\.mp4 has 5 \(--label-"):
        phase_names(labels, 5, Fraction(25), Path("v.mp4"), 1)


def test_time_ranges_label_each_frame_by_its_start_time(tmp_path: Path) -> None:
    labels = read_labels(write(tmp_path / "v.csv", "start,end,label\n0,1.5,a\n1.5,3,b\n"))
    # At 2 frames/s, frame k starts at k/2 s: 0, 0.5, 1.0 in a; 1.5, 2.0, 2.5 in b.
    assert phase_names(labels, 6, Fraction(2), Path("v.mp4"), 1) == (["a"] * 3 + ["b"] * 3, "")
    # 7 frames last 3.5 s: the last starts at 3 s, past the ranges: unlabelled, and said.
    names, note = phase_names(labels, 7, Fraction(2), Path("v.mp4"), 1)
    assert names[-2:] == ["b", None] and note.endswith("its last 1 unlabelled")
    with pytest.raises(DataError, match=r"ranges end at 3 s, but v\.mp4 lasts 5 s"):
        phase_names(labels, 10, Fraction(2), Path("v.mp4"), 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0\ta\n2\tb\n", r"frame 2 follows frame 0: one row per frame, in order from 0"),
        ("0,1,a\n0.5,2,b\n", r"line 2: range 0.5..2 s is empty, negative, out of order or over"),
        (
            "0\ta\tb\tc\n",
            r"line 1: expected rows 'frame<TAB>phase', one label, or 'start,end,label'",
        ),
        ("# only a comment\n", r"no labels"),
    ],
)
def test_a_bad_row_is_named_by_its_line(text: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=message):
        read_labels(write(tmp_path / "v.txt", text))


def test_the_label_file_of_a_video_and_of_a_frame_folder(tmp_path: Path) -> None:
    cholec = write(tmp_path / "video01-phase.txt", "0\ta\n")
    video = Source("video01", tmp_path / "video01.mp4", False)
    assert find_label_file(tmp_path, video) == cholec
    write(tmp_path / "video01.txt", "0\ta\n")
    with pytest.raises(DataError, match="more than one label file"):
        find_label_file(tmp_path, video)
    with pytest.raises(DataError, match=r"no label file for .*clip in .* \(tried clip\.txt"):
        find_label_file(tmp_path, Source("clip", tmp_path / "clip", True))
