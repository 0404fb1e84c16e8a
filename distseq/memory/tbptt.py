"""Truncated BPTT, the published baseline for long videos: the RNN state is detached every N
frames, so no gradient crosses a segment boundary. Gradients are then not the full sequence's;
distseq offers it only as an explicit choice (``memory.tbptt_frames``)."""

from __future__ import annotations

import torch
from torch import nn

from distseq.model.head import RNNState, TemporalHead, detach_state


class TruncatedHead(TemporalHead):
    """A causal :class:`TemporalHead` whose gradient reaches back at most ``frames`` frames;
    the same modules under the same names."""

    def __init__(
        self, rnn: nn.LSTM | nn.GRU | None, classifier: nn.Linear, dropout: float, frames: int
    ) -> None:
        super().__init__(rnn, classifier, dropout)
        self.frames = frames

    def run_causal(self, x: torch.Tensor, state: RNNState | None) -> tuple[torch.Tensor, RNNState]:
        assert self.rnn is not None
        outs = []
        for start in range(0, x.shape[1], self.frames):
            if state is not None and start > 0:
                state = detach_state(state)
            out, state = self.rnn(x[:, start : start + self.frames], state)
            outs.append(out)
        assert state is not None
        return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)), state
