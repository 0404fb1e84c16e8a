"""Streams in DataLoader workers and the error policy for bad samples (loader.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from distseq.data.batch import Batch
from distseq.data.loader import Stream, loader, on_error, worker_slot
from distseq.errors import DataError


class Numbered(Stream):
    """Three one-frame batches per worker, labelled with the worker's id; or a bad sample."""

    def __init__(self, bad: bool = False) -> None:
        self.bad = bad

    def __iter__(self) -> Iterator[Batch]:
        worker = worker_slot()[0]
        if self.bad:
            raise DataError("shard-000000.tar/x: frame 000001.jpg is not a valid JPEG")
        for _ in range(3):
            frames = torch.zeros(1, 1, 3, 2, 2, dtype=torch.uint8)
            yield Batch(frames, torch.full((1, 1), worker), torch.ones(1, 1, dtype=torch.bool))


@pytest.mark.parametrize("workers", [0, 2])
def test_every_worker_s_batches_come_through(workers: int) -> None:
    labels = [int(b.labels) for b in loader(Numbered(), workers)]
    assert sorted(labels) == sorted([w for w in range(max(1, workers)) for _ in range(3)])


@pytest.mark.parametrize("workers", [0, 1])
def test_a_worker_s_bad_sample_is_one_line(workers: int) -> None:
    with pytest.raises(DataError) as error:
        list(loader(Numbered(bad=True), workers))
    assert str(error.value) == "shard-000000.tar/x: frame 000001.jpg is not a valid JPEG"


def test_the_policy_raises_or_notes_the_sample() -> None:
    error, skipped = DataError("bad"), ["earlier"]
    with pytest.raises(DataError):
        on_error("raise", error, "shard/a", skipped)
    on_error("skip", error, "shard/a", skipped)
    assert skipped == ["earlier", "shard/a"]
