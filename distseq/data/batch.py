"""Batches of whole or windowed sequences: uint8 frames (or a feature shard's features), labels,
a mask; padded to the longest."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from distseq.data import sharedmem

# The label of a padding frame, and of a frame stored as unlabelled (-1): the loss and the
# metrics leave it out; the frame itself still goes through the model.
IGNORE_INDEX = -100


def _unset_starts() -> torch.Tensor:
    return torch.ones(0, dtype=torch.bool)


def slices(length: int, unit: int, size: int) -> list[tuple[int, int]]:
    """The frames [start, stop) of each of ``size`` ranks for a ``length``-frame sequence run in
    chunks of ``unit`` frames: contiguous, cut on chunk boundaries, their chunk counts differing
    by one at most."""
    chunks = -(-length // unit)
    cuts = [i * chunks // size * unit for i in range(size + 1)]
    return [(min(a, length), min(b, length)) for a, b in itertools.pairwise(cuts)]


@dataclass(frozen=True)
class Part:
    """Under a sequence split (parallel.sequence): the frames of every sequence that this rank
    holds and decodes, slice ``index`` of ``size`` in chunks of ``unit`` frames (:func:`slices`);
    a batch's labels and mask stay whole."""

    index: int
    size: int
    unit: int

    def held(self, length: int) -> slice:
        return slice(*slices(length, self.unit, self.size)[self.index])


@dataclass
class Batch:
    # uint8 [B, T, 3, H, W], stored channels last, normalised per chunk; with data.features,
    # float16 features [B, T, F]: what the model takes, either way. Under a sequence split
    # (Part), only this rank's slice of the T frames.
    frames: torch.Tensor
    labels: torch.Tensor  # int64 [B, T]; IGNORE_INDEX where padded
    mask: torch.Tensor  # bool [B, T]; True on real frames
    keys: list[str] = field(default_factory=list)  # sample keys; "" for padding rows
    # "<shard file name>/<sample key>" of the samples this worker skipped since its previous
    # batch (on_error=skip)
    skipped: list[str] = field(default_factory=list)
    # bool [B]: True where the row's window is the first of its video, so an RNN that carries its
    # state from batch to batch must reset it. Left out: all True, as outside ordered mode.
    starts: torch.Tensor = field(default_factory=_unset_starts)
    worker: int = 0  # the worker stream that made it; train batch i comes from worker i % workers
    segment: tuple[int, int] = (-1, -1)  # (loader worker, shared-memory segment) frames are in
    # A train batch: its worker's stream position after it (train_stream.Resume takes it back).
    position: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.starts.numel() == 0:
            self.starts = torch.ones(self.frames.shape[0], dtype=torch.bool)

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        return replace(
            self,
            frames=fn(self.frames),
            labels=fn(self.labels),
            mask=fn(self.mask),
            starts=fn(self.starts),
        )

    def to(
        self, device: torch.device, non_blocking: bool = False, frames_on_host: bool = False
    ) -> Batch:
        """On ``device``; with ``frames_on_host`` (memory.offload=frames) the frames stay in host
        memory, pinned for fast copies when the device is a GPU."""
        moved = self._map(lambda t: t.to(device, non_blocking=non_blocking))
        if frames_on_host:
            on_host = self.frames.pin_memory() if device.type == "cuda" else self.frames
            moved = replace(moved, frames=on_host)
        return moved

    def pin_memory(self) -> Batch:  # called by DataLoader(pin_memory=True)
        return self._map(torch.Tensor.pin_memory)


# key, frames ([T, 3, S, S] or T of [3, S, S]; features [T, F]), labels, starts a video
Row = tuple[str, torch.Tensor | list[torch.Tensor], list[int], bool]


def collate(
    rows: list[Row],
    size: int,
    skipped: list[str],
    worker: int,
    feature_dim: int | None = None,
    part: Part | None = None,
) -> Batch:
    """Pad to the longest sequence in the batch; padding is masked out and ignored by the loss.
    With no rows, a batch that only carries skipped ids home from a worker; never yielded.
    ``feature_dim``: the rows hold features of that size, not frames of ``size``. ``part``: the
    rows hold that part of their frames alone (``part.held(T)``), and so does the batch."""
    t = max((len(y) for _, _, y, _ in rows), default=1)
    held = part.held(t) if part else slice(0, t)
    frame_count = held.stop - held.start
    segment = (-1, -1)
    if feature_dim is not None:  # small (2 bytes a feature): no shared-memory segment
        frames = torch.empty((len(rows), frame_count, feature_dim), dtype=torch.float16)
    else:
        # Channels last like the decoded frames; in a worker, in a shared-memory segment it
        # reuses.
        hwc, segment = sharedmem.uint8_buffer((len(rows), frame_count, size, size, 3))
        frames = hwc.permute(0, 1, 4, 2, 3)
    labels = torch.full((len(rows), t), IGNORE_INDEX, dtype=torch.int64)
    mask = torch.zeros((len(rows), t), dtype=torch.bool)
    for b, (_, x, y, _) in enumerate(rows):
        if isinstance(x, torch.Tensor):
            frames[b, : len(x)] = x
        else:
            for i, frame in enumerate(x):
                frames[b, i] = frame
        frames[b, len(x) :] = 0
        given = torch.tensor(y, dtype=torch.int64)
        labels[b, : len(y)] = given.masked_fill_(given < 0, IGNORE_INDEX)
        mask[b, : len(y)] = True
    starts = torch.tensor([start for *_, start in rows], dtype=torch.bool)
    keys = [row[0] for row in rows]
    return Batch(frames, labels, mask, keys, skipped, starts, worker, segment)


def empty_batch(size: int, feature_dim: int | None = None, part: Part | None = None) -> Batch:
    """One fully masked frame (of ``feature_dim`` features, if given): keeps a rank in lockstep
    with ranks that still have data. ``part``: this rank's part of it, which may be no frame."""
    held = part.held(1) if part else slice(0, 1)
    frames = (
        torch.zeros((1, held.stop - held.start, 3, size, size), dtype=torch.uint8)
        if feature_dim is None
        else torch.zeros((1, 1, feature_dim), dtype=torch.float16)
    )
    return Batch(
        frames,
        torch.full((1, 1), IGNORE_INDEX, dtype=torch.int64),
        torch.zeros((1, 1), dtype=torch.bool),
        [""],
    )
