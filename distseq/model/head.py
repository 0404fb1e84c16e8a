"""The temporal head: features [B, T, F] -> LSTM/GRU (or nothing) -> per-frame logits [B, T, K]."""

from __future__ import annotations

import torch
from torch import nn

from distseq.config import HeadConfig, Temporal

RNNState = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # GRU: h; LSTM: (h, c)


def detach_state(state: RNNState, dtype: torch.dtype | None = None) -> RNNState:
    if isinstance(state, tuple):
        return (state[0].detach().to(dtype), state[1].detach().to(dtype))
    return state.detach().to(dtype)


class Carry:
    """The RNN state that one window of a video hands to the next (``data.ordered``).

    The head starts from ``state`` and replaces it with its state after the window, detached:
    the gradient stops at window boundaries, and memory stays that of one window. Rows are the
    batch's lanes; :meth:`reset` zeroes the rows where a new video starts. A row that ends in
    padding ends its video, so the state it hands on is always reset before use.
    """

    def __init__(self) -> None:
        self.state: RNNState | None = None

    def reset(self, starts: torch.Tensor) -> None:
        if self.state is None:
            return
        parts = self.state if isinstance(self.state, tuple) else (self.state,)
        if parts[0].shape[1] != starts.shape[0]:
            raise ValueError(f"carried state has {parts[0].shape[1]} rows, batch {len(starts)}")
        keep = (~starts).to(parts[0].dtype)[None, :, None]  # over [layers, B, hidden]
        kept = tuple(p * keep for p in parts)
        self.state = (kept[0], kept[1]) if len(kept) == 2 else kept[0]


class TemporalHead(nn.Module):
    """features [B, T, F] -> logits [B, T, K]; causal unless the RNN is bidirectional."""

    def __init__(self, rnn: nn.LSTM | nn.GRU | None, classifier: nn.Linear, dropout: float) -> None:
        super().__init__()
        self.rnn = rnn
        self.dropout = nn.Dropout(dropout)
        self.classifier = classifier

    @property
    def bidirectional(self) -> bool:
        return self.rnn is not None and self.rnn.bidirectional

    def run_causal(self, x: torch.Tensor, state: RNNState | None) -> tuple[torch.Tensor, RNNState]:
        """The causal RNN over all of ``x`` from ``state``: outputs and the state after."""
        assert self.rnn is not None
        return self.rnn(x, state)

    def _run_rnn(self, x: torch.Tensor, mask: torch.Tensor, carry: Carry | None) -> torch.Tensor:
        assert self.rnn is not None
        if self.bidirectional:
            # The backward direction must start at each sequence's last real frame, not at padding.
            lengths = mask.sum(1).clamp(min=1).cpu()
            packed = nn.utils.rnn.pack_padded_sequence(
                x, lengths, batch_first=True, enforce_sorted=False
            )
            out, _ = self.rnn(packed)
            return nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[
                0
            ]
        # Mixed precision runs the RNN in the parameters' dtype; a carried state may be fp32.
        state = None if carry is None or carry.state is None else detach_state(carry.state, x.dtype)
        out, after = self.run_causal(x, state)
        if carry is not None:
            carry.state = detach_state(after)
        return out

    def forward(
        self, feats: torch.Tensor, mask: torch.Tensor, carry: Carry | None = None
    ) -> torch.Tensor:
        x = feats if self.rnn is None else self._run_rnn(feats, mask, carry)
        return self.classifier(self.dropout(x))


def build_head(in_dim: int, cfg: HeadConfig, num_classes: int) -> TemporalHead:
    rnn: nn.LSTM | nn.GRU | None = None
    out_dim = in_dim
    if cfg.kind is not Temporal.none:
        rnn_cls = nn.LSTM if cfg.kind is Temporal.lstm else nn.GRU
        rnn = rnn_cls(
            in_dim,
            cfg.hidden,
            num_layers=cfg.layers,
            batch_first=True,
            dropout=cfg.dropout if cfg.layers > 1 else 0.0,
            bidirectional=cfg.bidirectional,
        )
        out_dim = cfg.hidden * (2 if cfg.bidirectional else 1)
        if cfg.chrono_frames:
            _chrono(rnn, cfg.chrono_frames)
    return TemporalHead(rnn, nn.Linear(out_dim, num_classes), cfg.dropout)


def _chrono(rnn: nn.LSTM | nn.GRU, frames: int) -> None:
    """Biases log(U(1, frames - 1)) on the gate that keeps the state, so that each unit starts
    with a memory of up to ``frames`` steps: the LSTM's forget gate (PyTorch's order i, f, g, o)
    or the GRU's update gate (r, z, n), second in both. Chrono's input-gate biases, the forget
    biases' negative, are left at 0: closed that far, they kept a 12-frame cue out."""
    h = rnn.hidden_size
    with torch.no_grad():
        for name, bias in rnn.named_parameters():
            if name.startswith("bias_ih"):
                bias[h : 2 * h] = torch.log(torch.empty(h).uniform_(1, frames - 1))
            elif name.startswith("bias_hh"):
                bias[h : 2 * h] = 0
