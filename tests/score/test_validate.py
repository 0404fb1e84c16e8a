"""Validation leaves out the frames a shard marks unlabelled, and videos with none labelled."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from distseq.data.batch import IGNORE_INDEX, Batch
from distseq.score.validate import validate


class Predicts(nn.Module):
    """A model that answers fixed phases, whatever the frames."""

    def __init__(self, phases: list[list[int]]) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.nn.functional.one_hot(torch.tensor(phases), 2).float())

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.logits


def test_unlabelled_frames_and_videos_are_left_out() -> None:
    u = IGNORE_INDEX
    labels = torch.tensor([[0, u, u, 1, 1], [u, u, u, u, u]])
    batch = Batch(
        frames=torch.zeros(2, 5, 3, 4, 4, dtype=torch.uint8),
        labels=labels,
        mask=torch.ones(2, 5, dtype=torch.bool),
        keys=["a", "b"],
    )
    # Video a: 3 labelled frames, 2 right; its 2 unlabelled frames are predicted "wrong" on
    # purpose. Video b has no labelled frame: no video to score.
    model = Predicts([[0, 1, 1, 1, 0], [0, 0, 0, 0, 0]])
    report = validate(model, [batch], torch.device("cpu"), ["p0", "p1"])
    assert report["videos"] == 1
    assert report["frame_level"]["accuracy"] == pytest.approx(2 / 3)  # type: ignore[index]
    # Labelled frames 0, 3, 4: truth 0, 1, 1, predicted 0, 1, 0.
    # p0: predicted twice, right once (precision 1/2), found its 1 frame (recall 1);
    # p1: predicted once, right (precision 1), found 1 of its 2 frames (recall 1/2).
    assert report["precision"]["mean"] == pytest.approx((1 / 2 + 1) / 2)  # type: ignore[index]
    assert report["recall"]["mean"] == pytest.approx((1 + 1 / 2) / 2)  # type: ignore[index]
