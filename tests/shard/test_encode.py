"""One video encoded into its temporary tar (encode.py): windows, members, labels."""

from __future__ import annotations

import json
import tarfile
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from torchcodec.encoders import PngEncoder

from distseq.data.sources import Source
from distseq.shard.encode import Job, encode, sample_starts
from distseq.shard.labels import read_labels


@pytest.mark.parametrize(
    ("n", "window", "stride", "starts"),
    [
        (10, 0, 0, [0]),  # no window: the whole video
        (3, 4, 4, [0]),  # shorter than a window: one sample of all of it
        (10, 4, 4, [0, 4, 6]),  # 0-3, 4-7, and 6-9 flush with the end
        (10, 4, 3, [0, 3, 6]),  # 6-9 ends flush already
    ],
)
def test_windows_cover_the_whole_video(n: int, window: int, stride: int, starts: list[int]) -> None:
    assert sample_starts(n, window, stride) == starts


def test_a_frame_folder_becomes_labelled_samples(tmp_path: Path) -> None:
    folder = tmp_path / "clip"
    folder.mkdir()
    for k in range(6):
        PngEncoder(torch.full((3, 8, 8), 30 * k, dtype=torch.uint8)).to_file(folder / f"{k}.png")
    (tmp_path / "clip.txt").write_text("".join(f"{k}\t{'ab'[k // 3]}\n" for k in range(6)))
    job = Job(
        source=Source("clip", folder, True),
        labels=read_labels(tmp_path / "clip.txt"),
        class_ids={"b": 0, "a": 1},
        tolerance=1,
        fps=Fraction(1),
        folder_fps=Fraction(2),  # every other image: 0, 2, 4
        size=8,
        quality=90,
        sample_frames=2,
        stride=2,
        tar=tmp_path / "clip.tar",
    )
    encoded = encode(job)
    assert (encoded.frames, encoded.fps, encoded.samples) == (6, 2.0, 2)
    with tarfile.open(job.tar) as tar:
        names = tar.getnames()
        labels = {
            name: json.loads(tar.extractfile(name).read())["labels"]  # type: ignore[union-attr]
            for name in names
            if name.endswith("labels.json")
        }
    # Windows at 0 and 1 (flush with the end) of the 3 output frames.
    assert names == [
        "clip_w000000.000000.jpg",
        "clip_w000000.000001.jpg",
        "clip_w000000.labels.json",
        "clip_w000001.000000.jpg",
        "clip_w000001.000001.jpg",
        "clip_w000001.labels.json",
    ]
    # Images 0, 2, 4 are phases a, a, b: ids 1, 1, 0.
    assert labels == {"clip_w000000.labels.json": [1, 1], "clip_w000001.labels.json": [1, 0]}
