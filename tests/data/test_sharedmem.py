"""Shared-memory segments that each loader worker reuses (sharedmem.py)."""

from __future__ import annotations

from dataclasses import replace
from itertools import islice
from pathlib import Path

import torch

from distseq.data import sharedmem
from distseq.data.train_stream import train_batches
from streams import stream_config


def test_outside_a_worker_a_buffer_is_plain_memory() -> None:
    buffer, segment = sharedmem.uint8_buffer((2, 3))
    assert buffer.shape == (2, 3) and buffer.dtype == torch.uint8
    assert segment == (-1, -1) and not buffer.is_shared()


def test_a_worker_reuses_a_released_segment_of_its_size_and_lets_the_others_go() -> None:
    pools = sharedmem.Pools.for_workers(1)
    pool = sharedmem._Pool(pools.returns[0])
    first, storage = pool.take(64)
    second, _ = pool.take(64)  # the first is still held by the main process: a new one
    assert (first, second) == (0, 1) and storage.is_shared()
    pools.release(0, first)
    assert pool.take(64)[0] == first  # released: reused
    pools.release(0, second)
    third, _ = pool.take(32)  # none free of this size: the free one of another size goes
    sizes = {number: segment.nbytes() for number, segment in pool.segments.items()}
    assert sizes == {first: 64, third: 32} and not pool.free  # the held one stays


def test_workers_reuse_shared_memory_without_touching_held_batches(shards: Path) -> None:
    # Windows of 8 out of 9-14-frame videos: every batch has the same shape, so segments recur.
    cfg = stream_config(shards, window=8, num_workers=1)
    held = list(islice(train_batches(cfg, seed=3), 10))  # all kept while the worker goes on
    expected = list(islice(train_batches(replace(cfg, num_workers=0), seed=3), 10))
    for got, want in zip(held, expected, strict=True):
        assert got.keys == want.keys and torch.equal(got.frames, want.frames)
        assert got.frames.stride() == want.frames.stride()  # channels last, as decoded
    segments = {b.segment for b in held}
    assert all(worker == 0 for worker, _ in segments)
    assert len(segments) <= 4, segments  # prefetched batches in flight, then reuse
