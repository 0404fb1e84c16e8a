"""Encoding one video (in a worker process): its frames as ``data.video`` makes them, each
labelled with the phase of the source frame it shows, written as samples into a temporary tar of
its own."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import tarfile
from collections.abc import Generator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import torch

from distseq.data.decode import UNLABELLED
from distseq.data.manifest import LABELS_MEMBER, frame_member
from distseq.data.sources import Source, image_files
from distseq.data.tar import add_member
from distseq.data.video import source_frames
from distseq.errors import DataError
from distseq.shard.labels import Labels, phase_names


@dataclass(frozen=True)
class Job:
    """One video's work for a worker process."""

    source: Source
    labels: Labels
    class_ids: dict[str, int]  # by label name; UNLABELLED for the --unlabelled names
    tolerance: int  # frames of length difference between labels and video taken (labels.py)
    fps: Fraction
    folder_fps: Fraction
    size: int
    quality: int
    sample_frames: int
    stride: int
    tar: Path


@dataclass(frozen=True)
class Encoded:
    tar: Path
    sha256: str
    frames: int  # source frames
    fps: float  # source frame rate
    samples: int
    note: str  # where the labels and the video differ in length, one line; "" if they do not


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


def _decode(job: Job) -> tuple[list[bytes], list[int], int, Fraction]:
    """JPEGs of the output frames, the source frame each shows, source frames and rate."""
    frames = source_frames(job.source, job.fps, job.folder_fps, job.size, job.quality)
    shown = list(frames)
    return [j for _, j in shown], [k for k, _ in shown], frames.source_frames, frames.rate


def sample_starts(n: int, length: int, stride: int) -> list[int]:
    """Every stride frames, plus one sample flush with the end so that the tail is covered."""
    if length == 0 or n <= length:
        return [0]
    starts = list(range(0, n - length + 1, stride))
    if starts[-1] + length < n:
        starts.append(n - length)
    return starts


def init_worker() -> None:
    torch.set_num_threads(1)  # the pool already runs one video per core


def encode(job: Job) -> Encoded:
    """Decode, resample, label and JPEG-encode one video into its temporary tar ``job.tar``."""
    jpegs, picks, n, rate = _decode(job)
    names, note = phase_names(job.labels, n, rate, job.source.path, job.tolerance)
    labels = [UNLABELLED if (name := names[k]) is None else job.class_ids[name] for k in picks]
    starts = sample_starts(len(jpegs), job.sample_frames, job.stride)
    length = job.sample_frames or len(jpegs)
    with tarfile.open(job.tar, "w", format=tarfile.USTAR_FORMAT) as tar:
        for start in starts:
            key = f"{job.source.stem}_w{start:06d}" if job.sample_frames else job.source.stem
            for t, data in enumerate(jpegs[start : start + length]):
                add_member(tar, f"{key}.{frame_member(t)}", data)
            doc = {"labels": labels[start : start + length]}
            add_member(tar, f"{key}.{LABELS_MEMBER}", json.dumps(doc).encode())
    return Encoded(job.tar, _sha256(job.source), n, float(rate), len(starts), note)


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
