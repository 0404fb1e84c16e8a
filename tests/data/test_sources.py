"""Inputs as distseq shard and predict take them (sources.py): videos, frame folders, folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from distseq.data.sources import Source, find_sources, image_files, safe_stem
from distseq.errors import DataError


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_videos_frame_folders_and_folders_of_either(tmp_path: Path) -> None:
    video = touch(tmp_path / "a.b.mp4")  # a dot: webdataset would split the key there
    folder = tmp_path / "frames"
    for name in ("f_10.png", "f_2.png", "f_1.jpg", "notes.txt"):
        touch(folder / name)
    inner = tmp_path / "many"
    touch(inner / "c.MKV")
    touch(inner / "d" / "0.jpeg")
    touch(inner / "readme.md")  # neither a video nor a frame folder: passed over
    found = find_sources([video, folder, inner])
    assert found == [
        Source("a_b", video, False),
        Source("c", inner / "c.MKV", False),
        Source("d", inner / "d", True),
        Source("frames", folder, True),
    ]
    # Natural order: frame 2 before frame 10; only images.
    assert [p.name for p in image_files(folder)] == ["f_1.jpg", "f_2.png", "f_10.png"]


def test_a_key_is_kept_to_a_portable_alphabet() -> None:
    assert safe_stem("video 01.part-2") == "video_01_part-2"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: [touch(root / "x.txt")], "x.txt: not a video"),
        (lambda root: [root / "gone.mp4"], "input not found: "),
        (lambda root: [touch(root / "empty" / "notes.txt").parent], "holds no videos"),
        (
            lambda root: [touch(root / "a b.mp4"), touch(root / "a_b.avi")],
            "both give sample key a_b",
        ),
    ],
)
def test_bad_inputs_name_the_culprit(make, message: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DataError, match=message):
        find_sources(make(tmp_path))
