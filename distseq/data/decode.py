"""From a sample's bytes to frames: validation against the shard format, then JPEG decoding.

Validating reads only the member names and ``labels.json``; decoding uses TorchCodec's JPEG
decoder (the libjpeg-turbo its wheel ships) and nothing else: shard data is never unpickled.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from PIL import ExifTags, Image
from torchcodec.decoders import decode_jpeg

from distseq.data.manifest import FEATURES_MEMBER, FRAME_MEMBER_RE, LABELS_MEMBER
from distseq.data.tar import Sample
from distseq.errors import DataError, first_line

UNLABELLED = -1  # in labels.json: a frame that the loss and the metrics leave out
_TRANSPOSED = {5, 6, 7, 8}  # EXIF orientations whose upright image swaps height and width


@dataclass
class Video:
    """A valid sample, every ``frame_stride``-th frame of it: its JPEGs, or a feature shard's
    features."""

    key: str
    id: str
    where: str
    jpegs: list[tuple[int, bytes]]  # (stored frame number, JPEG); none in a feature shard
    labels: list[int]
    features: torch.Tensor | None = None  # a feature shard's: float16 [T, F]
    source: tuple[str, int] = ("", 0)  # its sample's shard URL and byte offset there


def check_sample(
    sample: Sample, num_classes: int, stride: int, feature_dim: int | None = None
) -> Video:
    """Validate a sample (cheap: nothing is decoded) and keep every ``stride``-th frame; with
    ``feature_dim`` (a feature shard's feature size), read its features."""
    if sample.cut:
        raise DataError(sample.cut)
    if feature_dim is not None:
        return _check_features(sample, num_classes, stride, feature_dim)
    key, where = sample.key, sample.where
    jpegs: dict[int, bytes] = {}
    for name, value in sample.members.items():
        if name == LABELS_MEMBER:
            continue
        match = FRAME_MEMBER_RE.fullmatch(name)
        if match is None:
            raise DataError(
                f"{where}: member {key}.{name} is not allowed (only NNNNNN.jpg and labels.json)"
            )
        jpegs[int(match[1])] = value
    n = len(jpegs)
    if n == 0 or max(jpegs) != n - 1:
        raise DataError(f"{where}: frames must be numbered 000000..{n - 1:06d} without gaps")
    labels = _labels(sample, n, num_classes)
    kept = range(0, n, stride)
    frames = [(i, jpegs[i]) for i in kept]
    return Video(
        key, sample.id, where, frames, labels[::stride], source=(sample.url, sample.offset)
    )


def _check_features(sample: Sample, num_classes: int, stride: int, size: int) -> Video:
    """A feature shard's sample, validated and read: ``size`` features a frame, float16, every
    ``stride``-th frame. The array is read as plain ``.npy``; pickled objects are refused."""
    key, where = sample.key, sample.where
    extra = set(sample.members) - {LABELS_MEMBER, FEATURES_MEMBER}
    if extra:
        raise DataError(
            f"{where}: member {key}.{sorted(extra)[0]} is not allowed in a feature shard "
            "(only features.npy and labels.json)"
        )
    data = sample.members.get(FEATURES_MEMBER)
    if data is None:
        raise DataError(f"{where}: missing member {key}.{FEATURES_MEMBER}")
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(
            f"{where}: {key}.{FEATURES_MEMBER} is not a .npy array: {npy_error(e)}"
        ) from None
    if array.dtype != np.float16 or array.ndim != 2 or array.shape[1] != size:
        raise DataError(
            f"{where}: {key}.{FEATURES_MEMBER} is {array.dtype} {array.shape}, not float16 "
            f"(frames, {size}) as index.json says"
        )
    labels = _labels(sample, len(array), num_classes)
    features = torch.from_numpy(array[::stride].copy())
    return Video(key, sample.id, where, [], labels[::stride], features, (sample.url, sample.offset))


def _labels(sample: Sample, frames: int, num_classes: int) -> list[int]:
    """The sample's ``labels.json``: one class id (or UNLABELLED) per frame."""
    key, where = sample.key, sample.where
    labels_json = sample.members.get(LABELS_MEMBER)
    if labels_json is None:
        raise DataError(f"{where}: missing member {key}.labels.json")
    try:
        labels = json.loads(labels_json)["labels"]
    except (ValueError, TypeError, KeyError) as e:
        raise DataError(f"{where}: {key}.labels.json is not {{'labels': [...]}}: {e}") from None
    if not isinstance(labels, list) or not all(type(x) is int for x in labels):
        raise DataError(f"{where}: {key}.labels.json 'labels' must be a list of integers")
    if len(labels) != frames:
        raise DataError(f"{where}: {len(labels)} labels for {frames} frames")
    bad = [x for x in labels if not (0 <= x < num_classes or x == UNLABELLED)]
    if bad:
        raise DataError(f"{where}: label {bad[0]} outside the {num_classes} manifest classes")
    return labels


def npy_error(error: Exception) -> str:
    """Why numpy could not load a .npy, without its advice to load pickled data with
    ``allow_pickle``: distseq never unpickles data, and does not tell users to."""
    text = first_line(error)
    return (
        "it holds pickled Python objects, which distseq never loads" if "pickle" in text else text
    )


def bad_jpeg(where: str, number: int, error: Exception) -> DataError:
    # TorchCodec prefixes libjpeg's message with its C++ function and source location; drop that.
    reason = re.sub(r"^.*\.cpp:\d+, ", "", first_line(error))
    return DataError(f"{where}: frame {number:06d}.jpg is not a valid JPEG: {reason}")


def decode_jpeg_rgb(data: bytes) -> torch.Tensor:
    """One JPEG as uint8 [3, H, W], upright by its EXIF orientation if it has one, channels last
    in memory where that does not turn it; RuntimeError or ValueError when ``data`` is not a
    valid JPEG (``bad_jpeg`` makes that the one-line DataError)."""
    return cast(torch.Tensor, decode_jpeg(data, mode="RGB"))  # a list only for a list of sources


def jpeg_size(where: str, jpeg: tuple[int, bytes]) -> tuple[int, int]:
    """(height, width) from the JPEG header alone, as decoded: upright by its EXIF orientation,
    which the decoder applies."""
    number, data = jpeg
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.getexif().get(ExifTags.Base.Orientation) in _TRANSPOSED:
                return img.width, img.height
            return img.height, img.width
    except (OSError, SyntaxError, ValueError) as e:
        raise bad_jpeg(where, number, e) from None


def decode(
    jpegs: list[tuple[int, bytes]], where: str, size: int | None = None
) -> list[torch.Tensor]:
    """Frames as uint8 [3, H, W] each: resized to ``size`` x ``size``, or, with no size, all at
    the stored size of the first, which the others must share.

    Channels last in memory, as libjpeg writes them: copying into channels-first costs more
    than half the decode, and resizing is 3x faster this way. Not stacked: where nothing else
    changes them, the frames are copied once, straight into the batch.
    """
    out: list[torch.Tensor] = []
    for number, data in jpegs:
        try:
            img = decode_jpeg_rgb(data)
        except (RuntimeError, ValueError) as e:
            raise bad_jpeg(where, number, e) from None
        if size is not None and img.shape[-2:] != (size, size):
            # Imported here: importing torchvision costs a process 1.2 s of its start (its ops
            # import torch._dynamo), and shards written at the model's size never resize.
            from torchvision.transforms.v2.functional import resize

            img = resize(img, [size, size], antialias=True)
        if out and img.shape != out[0].shape:
            raise DataError(
                f"{where}: frame {number:06d}.jpg is {img.shape[1]}x{img.shape[2]}, frame "
                f"{jpegs[0][0]:06d}.jpg {out[0].shape[1]}x{out[0].shape[2]}"
            )
        out.append(img)
    return out


def stack(frames: list[torch.Tensor]) -> torch.Tensor:
    """[T, 3, H, W], channels last in memory like the frames."""
    hwc = torch.empty((len(frames), *frames[0].shape[1:], 3), dtype=torch.uint8)
    out = hwc.permute(0, 3, 1, 2)
    for i, frame in enumerate(frames):
        out[i] = frame
    return out
