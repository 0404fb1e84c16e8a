"""JPEG through TorchCodec: the loader's decoder against an independent one (Pillow), its errors
as the project's one-line errors, the writers' encoder, and no deprecated torchvision codec."""

from __future__ import annotations

import io
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchcodec.encoders import JpegEncoder, PngEncoder

from distseq.data.decode import decode, decode_jpeg_rgb, jpeg_size
from distseq.data.manifest import JPEG_QUALITY
from distseq.data.sources import Source
from distseq.data.synthetic import encode_sample, sequences
from distseq.data.video import source_frames
from distseq.errors import DataError

WHERE = "train-000000.tar sample clip"


def _demo_frames() -> torch.Tensor:
    demo = sequences("train", 1, min_frames=6, max_frames=6, size=48, phases=2, seed=0)
    _, frames, _ = next(iter(demo))
    return frames


def _pillow(data: bytes) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as img:
        return torch.from_numpy(np.array(img.convert("RGB"))).permute(2, 0, 1)


def _exif_jpeg(orientation: int) -> bytes:
    """40 wide, 20 high, dark left half, bright right half; upright, per its EXIF orientation."""
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, 20:] = 255
    img = Image.fromarray(pixels)
    exif = img.getexif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    img.save(out, "JPEG", quality=95, exif=exif)
    return out.getvalue()


def test_decoded_pixels_are_pillows_and_channels_last() -> None:
    sample = encode_sample("clip", _demo_frames(), [0] * 6)
    jpegs = [v for k, v in sample.items() if k.endswith(".jpg")]
    assert len(jpegs) == 6
    for data in jpegs:
        assert isinstance(data, bytes)
        img = decode_jpeg_rgb(data)
        assert img.dtype == torch.uint8 and img.shape == (3, 48, 48)
        assert img.permute(1, 2, 0).is_contiguous()  # as libjpeg writes it; stack() relies on it
        # Another libjpeg-turbo build, same standard decode: a swapped channel or a transposed
        # frame would be off by up to 255.
        assert (img.int() - _pillow(data).int()).abs().max() <= 1


def test_encoding_is_deterministic_and_near_the_frames() -> None:
    frames = _demo_frames()
    once, again = encode_sample("clip", frames, [0] * 6), encode_sample("clip", frames, [0] * 6)
    assert once == again
    for t in range(6):
        data = once[f"{t:06d}.jpg"]
        assert isinstance(data, bytes)
        err = (decode_jpeg_rgb(data).float() - frames[t].float()).abs().mean()
        assert err < 4, t  # JPEG loss at quality JPEG_QUALITY
    low = JpegEncoder(frames[0]).to_tensor(quality=20).numel()
    assert low < len(once["000000.jpg"])  # the quality asked for is the quality written
    assert JPEG_QUALITY == 90


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"this is not a jpeg", "Not a JPEG file: starts with 0x74 0x68"),
        (b"", "both buffer length (0) and count (-1) must not be 0"),
        ("cut", "Image is incomplete or truncated."),  # cut in the entropy-coded data
    ],
)
def test_a_bad_jpeg_is_one_line_naming_shard_sample_and_member(
    data: bytes | str, reason: str
) -> None:
    good = JpegEncoder(_demo_frames()[0]).to_tensor(quality=90).numpy().tobytes()
    bad = good[: len(good) // 2] if data == "cut" else data
    assert isinstance(bad, bytes)
    with pytest.raises(DataError) as info:
        decode([(0, good), (3, bad)], WHERE)
    # The decoder's C++ function and source file are cut off: libjpeg's reason alone remains.
    assert str(info.value) == f"{WHERE}: frame 000003.jpg is not a valid JPEG: {reason}"


@pytest.mark.parametrize(("orientation", "shape"), [(1, (20, 40)), (6, (40, 20)), (8, (40, 20))])
def test_exif_orientation_is_applied_and_the_header_size_agrees(
    orientation: int, shape: tuple[int, int]
) -> None:
    data = _exif_jpeg(orientation)
    img = decode_jpeg_rgb(data)
    assert tuple(img.shape[1:]) == shape == jpeg_size(WHERE, (0, data))
    dark_first = orientation in (1, 6)  # 6 turns the dark left half to the top, 8 to the bottom
    assert (img[0, 0, 0] < 128) == dark_first and (img[0, -1, -1] > 128) == dark_first


def test_a_frame_folder_image_is_decoded_upright_and_grey_becomes_rgb(tmp_path: Path) -> None:
    folder = tmp_path / "clip"
    folder.mkdir()
    (folder / "0.jpg").write_bytes(_exif_jpeg(6))  # upright: 20 wide, 40 high, dark on top
    PngEncoder(torch.full((1, 40, 20), 200, dtype=torch.uint8)).to_file(folder / "1.png")
    frames = source_frames(Source("clip", folder, True), Fraction(1), Fraction(1), 16, 95)
    upright, grey = (decode_jpeg_rgb(j) for _, j in frames)
    assert upright.shape == grey.shape == (3, 16, 16)
    assert upright[:, :6].float().mean() < 40 and upright[:, -6:].float().mean() > 215
    assert (grey.int() - 200).abs().max() <= 2


def test_an_unreadable_folder_image_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "clip"
    folder.mkdir()
    (folder / "0.png").write_bytes(b"no image at all")
    frames = source_frames(Source("clip", folder, True), Fraction(1), Fraction(1), 16, 90)
    with pytest.raises(DataError) as info:
        list(frames)
    assert str(info.value).startswith(f"{folder / '0.png'}: not a readable image: ")
    assert "\n" not in str(info.value)


def test_no_deprecated_torchvision_codec_is_called(tmp_path: Path) -> None:
    """torchvision's image codecs warn on every call since 0.29 and will be removed."""
    folder = tmp_path / "clip"
    folder.mkdir()
    PngEncoder(torch.zeros((3, 20, 20), dtype=torch.uint8)).to_file(folder / "0.png")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        sample = encode_sample("clip", _demo_frames(), [0] * 6)
        jpegs = [(t, sample[f"{t:06d}.jpg"]) for t in range(6)]
        decode([(t, j) for t, j in jpegs if isinstance(j, bytes)], WHERE, size=32)
        list(source_frames(Source("clip", folder, True), Fraction(1), Fraction(1), 16, 90))
