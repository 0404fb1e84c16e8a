"""Encoding one video (in a worker process): decode with PyAV, resample to --fps, resize and
centre-crop, JPEG-encode, and write its samples into a temporary tar of its own.

Output frame j shows source frame ``floor(j * source_fps / fps)`` (frame index based: constant
frame rate is assumed); its label is that source frame's label.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import multiprocessing
import tarfile
from collections.abc import Generator, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import torch
from torchvision.io import ImageReadMode, decode_image, encode_jpeg
from torchvision.transforms.v2.functional import center_crop, resize

from distseq.errors import DataError
from distseq.shard.sources import Labels, Source, image_files, phase_names


@dataclass(frozen=True)
class Job:
    """One video's work for a worker process."""

    source: Source
    labels: Labels
    class_ids: dict[str, int]
    fps: Fraction
    folder_fps: Fraction
    size: int
    quality: int
    window: int
    stride: int
    tar: Path


@dataclass(frozen=True)
class Encoded:
    tar: Path
    sha256: str
    frames: int  # source frames
    fps: float  # source frame rate
    samples: int


def _repeats(k: int, rate: Fraction, fps: Fraction) -> int:
    """How many output frames show source frame k, when output frame j shows floor(j*rate/fps)."""
    return math.ceil((k + 1) * fps / rate) - math.ceil(k * fps / rate)


def _jpeg(img: torch.Tensor, size: int, quality: int) -> bytes:
    img = center_crop(resize(img, [size], antialias=True), [size, size])
    return bytes(encode_jpeg(img.contiguous(), quality=quality).numpy().tobytes())


def _sha256(source: Source) -> str:
    h = hashlib.sha256()
    files = image_files(source.path) if source.is_folder else [source.path]
    for path in files:
        if source.is_folder:
            h.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def source_bytes(source: Source) -> int:
    files = image_files(source.path) if source.is_folder else [source.path]
    return sum(p.stat().st_size for p in files)


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
    """The output frames of a folder of frame images at ``rate`` frames/s, as ``VideoFrames``."""

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
                    img = decode_image(str(image), mode=ImageReadMode.RGB)
                except (RuntimeError, OSError) as e:
                    raise DataError(
                        f"{image}: not a readable image: {str(e).splitlines()[0]}"
                    ) from None
                jpeg = _jpeg(img, self.size, self.quality)
                for _ in range(reps):
                    yield k, jpeg


def _decode(job: Job) -> tuple[list[bytes], list[int], int, Fraction]:
    """JPEGs of the output frames, the source frame each shows, source frames and rate."""
    source = job.source
    frames: VideoFrames | FolderFrames
    if source.is_folder:
        frames = FolderFrames(source.path, job.folder_fps, job.fps, job.size, job.quality)
    else:
        frames = VideoFrames(source.path, job.fps, job.size, job.quality)
    shown = list(frames)
    return [j for _, j in shown], [k for k, _ in shown], frames.source_frames, frames.rate


def window_starts(n: int, window: int, stride: int) -> list[int]:
    """Every stride frames, plus one window flush with the end so that the tail is covered."""
    if window == 0 or n <= window:
        return [0]
    starts = list(range(0, n - window + 1, stride))
    if starts[-1] + window < n:
        starts.append(n - window)
    return starts


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    # Fixed metadata, as in distseq.data.synthetic: the same input gives the same bytes.
    info.mode, info.mtime, info.uname, info.gname = 0o444, 0, "distseq", "distseq"
    tar.addfile(info, io.BytesIO(data))


def init_worker() -> None:
    torch.set_num_threads(1)  # the pool already runs one video per core


def encode(job: Job) -> Encoded:
    """Decode, resample, label and JPEG-encode one video into its temporary tar ``job.tar``."""
    jpegs, picks, n, rate = _decode(job)
    names = phase_names(job.labels, n, rate, job.source.path)
    labels = [job.class_ids[names[k]] for k in picks]
    starts = window_starts(len(jpegs), job.window, job.stride)
    length = job.window or len(jpegs)
    with tarfile.open(job.tar, "w", format=tarfile.USTAR_FORMAT) as tar:
        for start in starts:
            key = f"{job.source.stem}_w{start:06d}" if job.window else job.source.stem
            for t, data in enumerate(jpegs[start : start + length]):
                _add_member(tar, f"{key}.{t:06d}.jpg", data)
            doc = {"labels": labels[start : start + length]}
            _add_member(tar, f"{key}.labels.json", json.dumps(doc).encode())
    return Encoded(job.tar, _sha256(job.source), n, float(rate), len(starts))


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def encode_all(jobs: list[Job], workers: int) -> Generator[Encoded, None, None]:
    """Encoded videos in job order; up to ``workers`` encode at once."""
    if workers == 0:
        yield from map(encode, jobs)
        return
    # spawn, not fork: a forked child can hang in OpenMP state the parent's torch left behind.
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker)
    try:
        futures = [pool.submit(encode, job) for job in jobs]
        for job, future in zip(jobs, futures, strict=True):
            try:
                yield future.result()
            except BrokenProcessPool:
                raise DataError(
                    f"a worker process died (out of memory?) with {job.source.path} or a later "
                    "video unfinished; rerun to resume, maybe with fewer --workers"
                ) from None
    finally:
        pool.shutdown(cancel_futures=True)
