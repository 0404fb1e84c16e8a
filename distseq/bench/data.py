"""``distseq bench data``: frames/s through the training loader against plain JPEG decoding.

The plain loop reads the same JPEG members out of the same tar files and decodes them with
TorchCodec's ``decode_jpeg``, the loader's decoder, and does nothing else: the most one loader
worker can deliver. The pipeline rows run ``train_batches`` (tar reading, shuffling, windowing,
decoding, augmentation, batching) with N DataLoader workers; N=0 runs in this process on one
thread, and its ratio to the plain loop is the pipeline's efficiency. A worker process delivers a
little less (its batches cross into the main process through shared memory), so the workers
needed for a model's frame rate come from the 1-worker rate.
"""

from __future__ import annotations

import json
import math
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import webdataset as wds

from distseq.config import AugmentConfig, DataConfig
from distseq.data.decode import decode_jpeg_rgb
from distseq.data.synthetic import write_synthetic
from distseq.data.train_stream import train_batches
from distseq.errors import DataError

AUGMENT = AugmentConfig(crop_scale=0.6, flip=True, brightness=0.2, contrast=0.2, saturation=0.2)
BATCH_SIZE = 2
WARMUP_FRAMES = 8
SYNTHETIC_SEQUENCES = 16
SEQUENCES_PER_SHARD = 2  # 8 shards: enough for 8 workers


@dataclass
class DataRecord:
    augment: bool
    workers: int  # DataLoader workers; 0: in this process, one thread: one worker's throughput
    size: int  # data.size; the shards' frame size, so that no resize is timed without augment
    window: int  # data.window
    frames: int  # real (unpadded) frames timed
    seconds: float
    fps: float  # frames / seconds through train_batches, all workers together
    plain_frames: int
    plain_seconds: float
    plain_fps: float  # TorchCodec's decode_jpeg alone on JPEG bytes read with tarfile, one thread
    ratio: float  # fps / plain_fps; at workers=0 the pipeline's efficiency
    model_fps: float  # frames/s the training step consumes
    workers_needed: int  # ceil(model_fps / fps at workers=1, else 0; same augment)


def _jpegs(paths: list[str]) -> Iterator[bytes]:
    """The JPEG members of the tar files, in stored order, over and over."""
    while True:
        for path in paths:
            with tarfile.open(path, "r|") as tar:
                for member in tar:
                    if member.name.endswith(".jpg"):
                        f = tar.extractfile(member)
                        assert f is not None
                        yield f.read()


def plain_decode(paths: list[str], count: int) -> tuple[int, float]:
    """Decode ``count`` JPEGs straight from the tars; return (frames, seconds)."""
    jpegs = _jpegs(paths)
    for _ in range(WARMUP_FRAMES):  # libjpeg's and the allocator's first calls
        decode_jpeg_rgb(next(jpegs))  # the loader's decode call
    start = time.perf_counter()
    for _ in range(count):
        decode_jpeg_rgb(next(jpegs))
    return count, time.perf_counter() - start


def pipeline(cfg: DataConfig, count: int) -> tuple[int, float]:
    """Take batches from ``train_batches`` until ``count`` real frames; return (frames, seconds)."""
    batches = train_batches(cfg, seed=0)
    # Warm-up: worker start-up and the shuffle buffer's first fill are not throughput.
    for _ in range(2 * max(1, cfg.num_workers)):
        next(batches)
    frames = 0
    start = time.perf_counter()
    while frames < count:
        frames += int(next(batches).mask.sum())
    return frames, time.perf_counter() - start


@dataclass(frozen=True)
class DataBench:
    """One ``bench data`` run: its options, as the command line gives them."""

    size: int
    window: int
    count: int
    workers: list[int]
    model_fps: float
    shards: str
    json: bool


def _bench(args: DataBench, pattern: str) -> list[DataRecord]:
    paths = wds.shardlists.expand_urls(pattern)
    for path in paths:
        if not Path(path).is_file():
            raise DataError(f"shard not found: {path} (bench data reads local tar files)")
    workers = sorted({0, *args.workers})
    records = []
    for augment in (False, True):
        plain_frames, plain_seconds = plain_decode(paths, args.count)
        plain_fps = plain_frames / plain_seconds
        runs = {}
        for n in workers:
            cfg = DataConfig(
                train=pattern,
                window=args.window,
                size=args.size,
                batch_size=BATCH_SIZE,
                num_workers=n,
                augment=AUGMENT if augment else AugmentConfig(),
            )
            runs[n] = pipeline(cfg, args.count)
        # A worker process delivers less than the same stream in this process: every batch goes
        # through fresh shared memory. So one worker's rate is the 1-worker row, when measured.
        one = runs[1] if 1 in runs else runs[0]
        per_worker = one[0] / one[1]
        for n, (frames, seconds) in runs.items():
            fps = frames / seconds
            rec = DataRecord(
                augment=augment,
                workers=n,
                size=args.size,
                window=args.window,
                frames=frames,
                seconds=seconds,
                fps=fps,
                plain_frames=plain_frames,
                plain_seconds=plain_seconds,
                plain_fps=plain_fps,
                ratio=fps / plain_fps,
                model_fps=args.model_fps,
                workers_needed=math.ceil(args.model_fps / per_worker),
            )
            records.append(rec)
            _print(rec, args.json)
    return records


def _print(rec: DataRecord, as_json: bool) -> None:
    if as_json:
        print(json.dumps(asdict(rec)), flush=True)
        return
    print(
        f"{'on' if rec.augment else 'off':>7} {rec.workers:>7} {rec.frames:>7} {rec.fps:>9.0f} "
        f"{rec.plain_fps:>9.0f} {rec.ratio:>7.3f} {rec.workers_needed:>8}",
        flush=True,
    )


def bench_data(args: DataBench) -> list[DataRecord]:
    if not args.json:
        print(
            f"{args.size}px, window {args.window}, batch {BATCH_SIZE}, {args.count} frames per "
            f"case, shards: {args.shards or 'synthetic'}; 'needed': workers for "
            f"{args.model_fps:g} frames/s"
        )
        print(
            f"{'augment':>7} {'workers':>7} {'frames':>7} {'frames/s':>9} {'plain/s':>9} "
            f"{'/plain':>7} {'needed':>8}"
        )
    # DataLoader workers run on one thread each; so do the in-process and plain rows, so that
    # they measure one worker.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if args.shards:
            return _bench(args, args.shards)
        with synthetic_shards(args.size, args.window) as pattern:
            return _bench(args, pattern)
    finally:
        torch.set_num_threads(threads)


@contextmanager
def synthetic_shards(size: int, window: int) -> Iterator[str]:
    """Train shards of random sequences of ``window`` frames at ``size`` px, in a temporary
    folder while the context lasts: their URL pattern."""
    with tempfile.TemporaryDirectory(prefix="distseq-bench-") as tmp:
        write_synthetic(
            Path(tmp),
            train_sequences=SYNTHETIC_SEQUENCES,
            val_sequences=0,
            min_frames=window,
            max_frames=window,
            size=size,
            phases=1,
            seed=0,
            sequences_per_shard=SEQUENCES_PER_SHARD,
        )
        last = SYNTHETIC_SEQUENCES // SEQUENCES_PER_SHARD - 1
        yield f"{tmp}/train-{{000000..{last:06d}}}.tar"
