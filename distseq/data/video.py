"""Frames from a video file or a folder of frame images, made as ``distseq shard`` makes the
training frames: resampled to a frame rate, resized, centre-cropped and JPEG-encoded. ``distseq
shard`` stores them; ``distseq predict`` makes a new video's frames the same way. PyAV decodes
videos; TorchCodec decodes frame images and encodes the JPEGs.

Output frame j shows source frame ``floor(j * source_fps / fps)`` (frame index based: constant
frame rate is assumed).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import torch
from torchcodec.decoders import decode_image
from torchcodec.encoders import JpegEncoder
from torchvision.transforms.v2.functional import center_crop, resize

from distseq.data.sources import Source, image_files
from distseq.errors import DataError


def _repeats(k: int, rate: Fraction, fps: Fraction) -> int:
    """How many output frames show source frame k, when output frame j shows floor(j*rate/fps)."""
    return math.ceil((k + 1) * fps / rate) - math.ceil(k * fps / rate)


def _jpeg(img: torch.Tensor, size: int, quality: int) -> bytes:
    img = center_crop(resize(img, [size], antialias=True), [size, size])
    # The encoder copies the frame into the channels-last rows libjpeg reads: no contiguous().
    return bytes(JpegEncoder(img).to_tensor(quality=quality).numpy().tobytes())


class VideoFrames:
    """The output frames of a video file, as ``distseq shard`` makes them: every source frame
    shown at ``fps`` (module doc), short side resized to ``size``, centre-cropped square, JPEG
    encoded at ``quality``; lazily, one source frame decoded at a time.

    Iterating yields (source frame number, JPEG); afterwards ``source_frames`` and ``rate``
    (the source frame rate) are known.
    """

    def __init__(self, path: Path, fps: Fraction, size: int, quality: int) -> None:
        self.path, self.fps, self.size, self.quality = path, fps, size, quality
        self.source_frames = 0
        self.rate = Fraction(0)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        path = self.path
        try:
            with av.open(str(path)) as container:
                if not container.streams.video:
                    raise DataError(f"{path}: no video stream")
                stream = container.streams.video[0]
                guess = stream.average_rate or stream.guessed_rate
                if not guess:
                    raise DataError(f"{path}: unknown frame rate")
                self.rate = Fraction(guess)
                for n, frame in enumerate(container.decode(stream)):
                    self.source_frames = n + 1
                    reps = _repeats(n, self.rate, self.fps)
                    if reps:
                        img = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1)
                        jpeg = _jpeg(img, self.size, self.quality)
                        for _ in range(reps):
                            yield n, jpeg
        except (av.FFmpegError, OSError) as e:
            reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
            raise DataError(f"{path}: cannot decode video: {reason}") from None
        if self.source_frames == 0:
            raise DataError(f"{path}: no frames decoded")


class FolderFrames:
    """The output frames of a folder of frame images at ``rate`` frames/s, as ``VideoFrames``.
    Each image is read as RGB (grey ones too), upright as its EXIF orientation says."""

    def __init__(
        self, folder: Path, rate: Fraction, fps: Fraction, size: int, quality: int
    ) -> None:
        self.images = image_files(folder)
        self.rate, self.fps, self.size, self.quality = rate, fps, size, quality
        self.source_frames = len(self.images)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        for k, image in enumerate(self.images):
            reps = _repeats(k, self.rate, self.fps)
            if reps:
                try:
                    img = decode_image(image, mode="RGB")
                except (RuntimeError, OSError, ValueError) as e:
                    raise DataError(
                        f"{image}: not a readable image: {str(e).splitlines()[0]}"
                    ) from None
                jpeg = _jpeg(img, self.size, self.quality)
                for _ in range(reps):
                    yield k, jpeg


def source_frames(
    source: Source, fps: Fraction, folder_fps: Fraction, size: int, quality: int
) -> VideoFrames | FolderFrames:
    """The output frames of ``source``; a frame folder's images are ``folder_fps`` frames/s."""
    if source.is_folder:
        return FolderFrames(source.path, folder_fps, fps, size, quality)
    return VideoFrames(source.path, fps, size, quality)
