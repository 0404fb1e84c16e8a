"""The training step's loss: the mean over labelled frames; padding and unlabelled frames are
left out."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import random_batch, tiny_model
from distseq.data.batch import IGNORE_INDEX
from distseq.train.step import train_step


def test_the_loss_is_the_mean_over_labelled_frames() -> None:
    batch = random_batch(2, 6, lengths=[6, 4])
    batch.labels[0, 1:4] = IGNORE_INDEX  # stored as -1: seen by the model, not scored
    model = tiny_model("torch", chunk=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss, frames = train_step(model, opt, [batch], world=1)
    assert frames == 10  # real frames, labelled or not
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = tiny_model("none", chunk=6)
    logits = plain(batch.frames, batch.mask)
    labelled = batch.labels >= 0
    assert labelled.sum() == 7
    expected = F.cross_entropy(logits[labelled], batch.labels[labelled])
    expected.backward()
    assert loss == pytest.approx(expected.item(), rel=1e-6)  # float64 sum against float32 mean
    for name, p in plain.named_parameters():
        assert p.grad is not None
        err = (got[name] - p.grad).abs().max() / p.grad.abs().max()
        assert err < 1e-5, (name, float(err))


def test_a_step_with_no_labelled_frame_changes_nothing() -> None:
    batch = random_batch(1, 4)
    batch.labels[:] = IGNORE_INDEX
    model = tiny_model("torch", chunk=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss, frames = train_step(model, opt, [batch], world=1)
    assert (loss, frames) == (0.0, 4)
    for name, p in model.named_parameters():
        assert p.grad is None or not p.grad.any(), name
