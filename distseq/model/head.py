"""The temporal head: features [B, T, F] -> per-frame logits [B, T, K] (or [S, B, T, K], below);
the contract every head
meets (``head_logits``), the state a stateful one carries, and distseq's own heads: an LSTM or GRU
(or nothing) here, MS-TCN (model/tcn.py) and a local-attention transformer
(model/transformer.py).

A multi-stage head (MS-TCN) returns every stage's logits, [S, B, T, K]: the loss is summed over
the stages, and :func:`last_stage` is the prediction."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from distseq.config import HeadConfig, Temporal
from distseq.errors import ModelError
from distseq.model.tcn import MSTCN
from distseq.model.transformer import LocalTransformer

# What a stateful head carries from one window to the next: a tensor, or a tuple of them (an
# LSTM's (h, c)), each with the batch in dim 1 as torch's RNNs keep it: [layers, B, hidden].
RNNState = torch.Tensor | tuple[torch.Tensor, ...]


def map_state(fn: Callable[[torch.Tensor], torch.Tensor], state: RNNState) -> RNNState:
    """``fn`` applied to each tensor of ``state``, its structure kept."""
    return tuple(fn(t) for t in state) if isinstance(state, tuple) else fn(state)


def detach_state(state: RNNState, dtype: torch.dtype | None = None) -> RNNState:
    return map_state(lambda t: t.detach().to(dtype), state)


def is_stateful(head: nn.Module) -> bool:
    """Whether ``head`` carries state: its ``forward`` takes a parameter named ``state``
    (``forward(features, mask, state) -> (logits, state)``)."""
    # A compiled head's forward takes (*args, **kwargs): ask the module it compiled.
    forward = getattr(head, "_orig_mod", head).forward
    return "state" in inspect.signature(forward).parameters


class Carry:
    """The state that one window of a video hands to the next (``data.ordered``, or windows of a
    video in a loop of your own).

    A stateful head starts from ``state`` and it is replaced by the head's state after the
    window, detached: the gradient stops at window boundaries, and memory stays that of one
    window. Rows are the batch's lanes; :meth:`reset` zeroes the rows where a new video starts.
    A row that ends in padding ends its video, so the state it hands on is always reset before
    use.
    """

    def __init__(self) -> None:
        self.state: RNNState | None = None

    def reset(self, starts: torch.Tensor) -> None:
        """Zero the state of the rows where ``starts`` [B] is True (a new video begins)."""
        if self.state is None:
            return
        first = self.state[0] if isinstance(self.state, tuple) else self.state
        if first.dim() < 2 or first.shape[1] != starts.shape[0]:
            raise ModelError(
                f"carried state of shape {list(first.shape)} for a batch of {len(starts)}: a "
                "head's state keeps the batch in dim 1, as torch's RNNs do ([layers, B, hidden])"
            )

        def keep(t: torch.Tensor) -> torch.Tensor:
            rows = (~starts).to(t.dtype).view(1, -1, *([1] * (t.dim() - 2)))
            return t * rows

        self.state = map_state(keep, self.state)


def head_logits(
    head: nn.Module,
    stateful: bool,
    feats: torch.Tensor,
    mask: torch.Tensor,
    carry: Carry | None,
) -> torch.Tensor:
    """``head`` over features [B, T, F]: logits [B, T, K] (or [S, B, T, K]), checked. A stateful
    head starts from
    ``carry``'s state (None: its own start) and leaves its state after in ``carry``, detached."""
    if stateful:
        # Mixed precision runs the head in the features' dtype; a carried state may be fp32.
        state = None if carry is None or carry.state is None else detach_state(carry.state)
        if state is not None and feats.is_floating_point():
            state = map_state(lambda t: t.to(feats.dtype) if t.is_floating_point() else t, state)
        out = head(feats, mask, state)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise ModelError(
                f"the head's forward takes state, so it must return (logits, state); it "
                f"returned {_described(out)}"
            )
        logits, after = out
        if carry is not None:
            carry.state = None if after is None else detach_state(after)
    else:
        if carry is not None:
            raise ModelError(
                "a Carry was given, but the head carries no state: its forward takes no "
                "parameter named state"
            )
        logits = head(feats, mask)
    b, t = feats.shape[:2]
    ok = isinstance(logits, torch.Tensor) and (
        (logits.dim() == 3 and logits.shape[:2] == (b, t))
        or (logits.dim() == 4 and logits.shape[1:3] == (b, t))
    )
    if not ok:
        raise ModelError(
            f"the head returned {_described(logits)} for features of shape {list(feats.shape)}: "
            f"a temporal head returns logits [B, T, K] = [{b}, {t}, K] (or [S, {b}, {t}, K], "
            "one per stage)"
        )
    return logits


def last_stage(logits: torch.Tensor) -> torch.Tensor:
    """The prediction's logits [B, T, K]: a multi-stage head's last stage, or ``logits``."""
    return logits[-1] if logits.dim() == 4 else logits


def _described(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return f"a {type(value).__name__}"


class TemporalHead(nn.Module):
    """features [B, T, F] -> logits [B, T, K] through an LSTM, a GRU or nothing; causal unless
    the RNN is bidirectional. Stateful: the causal RNN's state is carried (:class:`Carry`)."""

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

    def forward(
        self, feats: torch.Tensor, mask: torch.Tensor, state: RNNState | None = None
    ) -> tuple[torch.Tensor, RNNState | None]:
        after: RNNState | None = None
        if self.rnn is None:
            x = feats
        elif self.bidirectional:
            # The backward direction must start at each sequence's last real frame, not at padding.
            lengths = mask.sum(1).clamp(min=1).cpu()
            packed = nn.utils.rnn.pack_padded_sequence(
                feats, lengths, batch_first=True, enforce_sorted=False
            )
            out, _ = self.rnn(packed)
            x = nn.utils.rnn.pad_packed_sequence(
                out, batch_first=True, total_length=feats.shape[1]
            )[0]
        else:
            x, after = self.run_causal(feats, state)
        return self.classifier(self.dropout(x)), after


def _mstcn(in_dim: int, cfg: HeadConfig, num_classes: int) -> nn.Module:
    return MSTCN(
        in_dim,
        num_classes,
        stages=cfg.stages,
        layers=cfg.layers,
        channels=cfg.hidden,
        dropout=cfg.dropout,
        causal=cfg.causal,
    )


def _transformer(in_dim: int, cfg: HeadConfig, num_classes: int) -> nn.Module:
    return LocalTransformer(
        in_dim,
        num_classes,
        width=cfg.hidden,
        layers=cfg.layers,
        heads=cfg.attention_heads,
        span=cfg.span,
        causal=cfg.causal,
        dropout=cfg.dropout,
    )


def _recurrent(in_dim: int, cfg: HeadConfig, num_classes: int) -> nn.Module:
    """An LSTM or GRU and the classifier, or (``none``) the classifier alone."""
    kind = Temporal(cfg.kind)
    if kind is Temporal.none:
        return TemporalHead(None, nn.Linear(in_dim, num_classes), cfg.dropout)
    rnn = (nn.LSTM if kind is Temporal.lstm else nn.GRU)(
        in_dim,
        cfg.hidden,
        num_layers=cfg.layers,
        batch_first=True,
        dropout=cfg.dropout if cfg.layers > 1 else 0.0,
        bidirectional=cfg.bidirectional,
    )
    if cfg.chrono_frames:
        _chrono(rnn, cfg.chrono_frames)
    out_dim = cfg.hidden * (2 if cfg.bidirectional else 1)
    return TemporalHead(rnn, nn.Linear(out_dim, num_classes), cfg.dropout)


# model.head.kind -> its builder (in_features, the head's config, classes): every kind distseq
# has, which Temporal names.
HEADS: dict[Temporal, Callable[[int, HeadConfig, int], nn.Module]] = {
    Temporal.lstm: _recurrent,
    Temporal.gru: _recurrent,
    Temporal.none: _recurrent,
    Temporal.mstcn: _mstcn,
    Temporal.transformer: _transformer,
}


def build_head(in_dim: int, cfg: HeadConfig, num_classes: int) -> nn.Module:
    """distseq's head of kind ``cfg.kind`` (a value of Temporal; an import path is
    model.imported's) over ``in_dim`` features a frame."""
    return HEADS[Temporal(cfg.kind)](in_dim, cfg, num_classes)


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
