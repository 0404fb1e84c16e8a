"""Truncated BPTT (tbptt.py): the RNN state detached every N frames, and nothing else changed."""

from __future__ import annotations

import torch

from conftest import random_batch, tiny_model
from distseq.config import MemoryConfig
from distseq.memory.policy import apply_memory_policy
from distseq.memory.tbptt import TruncatedHead


def test_truncated_bptt_cuts_gradient_only_when_asked() -> None:
    batch = random_batch(1, 12)
    full = tiny_model("torch", chunk=4)
    cut = apply_memory_policy(tiny_model(), MemoryConfig(chunk_frames=4, tbptt_frames=4))
    for model in (full, cut):
        feats = model.features(batch.frames, batch.mask).detach().requires_grad_(True)
        model.temporal(feats, batch.mask)[0, -1].sum().backward()
        early = feats.grad[0, :8].abs().sum()
        if model is full:
            assert early > 0  # the last frame's loss reaches the first frames
        else:
            assert early == 0


def test_the_forward_is_the_whole_sequence_s_and_the_gradient_stops_at_each_cut() -> None:
    torch.manual_seed(0)
    head = tiny_model(chunk=4).head
    cut = TruncatedHead(head.rnn, head.classifier, 0.0, frames=3)
    feats = torch.randn(1, 10, head.rnn.input_size, requires_grad=True)
    mask = torch.ones(1, 10, dtype=torch.bool)
    # The same modules on the same frames: detaching changes no value, only the gradient. To the
    # last bits: the LSTM's kernel over 3-frame segments rounds apart from its run over all 10
    # (up to 1.8e-7 on this CPU, with the code before the library API too).
    torch.testing.assert_close(cut(feats, mask)[0], head(feats, mask)[0], rtol=0, atol=1e-6)
    cut(feats, mask)[0][0, 7].sum().backward()  # frame 7 is in the segment of frames 6-8
    assert feats.grad is not None
    reached = [bool(feats.grad[0, t].abs().sum() > 0) for t in range(10)]
    assert reached == [False] * 6 + [True, True] + [False] * 2
