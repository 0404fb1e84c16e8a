"""A video's or frame folder's frames as distseq shard makes them (video.py): resampled to a
frame rate, squared, JPEG-encoded."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import torch
from torchcodec.encoders import PngEncoder

from distseq.data.decode import decode_jpeg_rgb
from distseq.data.sources import Source
from distseq.data.video import _repeats, source_frames
from distseq.errors import DataError


@pytest.mark.parametrize(
    ("rate", "fps", "shown"),
    [
        # Output frame j shows source frame floor(j * rate / fps).
        (Fraction(2), Fraction(1), [1, 0, 1, 0, 1, 0]),  # every other frame, from the first
        (Fraction(1), Fraction(2), [2, 2, 2]),  # each frame twice
        (Fraction(3), Fraction(2), [1, 1, 0, 1, 1, 0]),  # j=0,1,2,3 -> 0,1,3,4
    ],
)
def test_each_source_frame_is_shown_as_often_as_the_rates_say(
    rate: Fraction, fps: Fraction, shown: list[int]
) -> None:
    assert [_repeats(k, rate, fps) for k in range(len(shown))] == shown


def test_a_frame_folder_is_resampled_and_squared(tmp_path: Path) -> None:
    folder = tmp_path / "clip"
    folder.mkdir()
    for k in range(4):  # 40 x 20 frames, each one grey level brighter
        PngEncoder(torch.full((3, 20, 40), 40 * k, dtype=torch.uint8)).to_file(folder / f"{k}.png")
    frames = source_frames(Source("clip", folder, True), Fraction(1), Fraction(2), 16, 95)
    made = [(k, decode_jpeg_rgb(j)) for k, j in frames]
    assert [k for k, _ in made] == [0, 2]  # 2 frames/s shown at 1
    for k, image in made:
        assert image.shape == (3, 16, 16)  # short side 16, centre-cropped square
        assert abs(image.float().mean() - 40 * k) < 2


def test_a_file_that_is_no_video_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"\0" * 4096)
    frames = source_frames(Source("bad", bad, False), Fraction(1), Fraction(1), 16, 90)
    with pytest.raises(DataError, match=r"bad\.mp4: cannot decode video"):
        list(frames)
