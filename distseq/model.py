"""The network: a torchvision CNN per frame, then an LSTM/GRU over time, then per-frame logits.

The model knows nothing about chunking, checkpointing or sharding; ``memory.py`` and
``parallel.py`` wrap the parts named ``encoder`` and ``head``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torchvision
from torch import nn
from torchvision.ops import FrozenBatchNorm2d

from distseq.config import BackboneConfig, ConfigError, HeadConfig, ModelConfig, Norm, Temporal

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _set_module(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _convert_norm(cnn: nn.Module, norm: Norm) -> None:
    """Swap BatchNorm2d for a norm whose output for a frame does not depend on its chunk-mates."""
    if norm is Norm.batchnorm:
        return
    for name, bn in list(cnn.named_modules()):
        if not isinstance(bn, nn.BatchNorm2d):
            continue
        new: nn.Module
        if norm is Norm.frozen_bn:
            new = FrozenBatchNorm2d(bn.num_features, eps=bn.eps)
            for key in ("weight", "bias", "running_mean", "running_var"):
                getattr(new, key).copy_(getattr(bn, key).detach())
        else:
            # gcd keeps every group the same size for widths like 40 or 112 (EfficientNet).
            new = nn.GroupNorm(math.gcd(32, bn.num_features), bn.num_features, eps=bn.eps)
            with torch.no_grad():
                new.weight.copy_(bn.weight)
                new.bias.copy_(bn.bias)
        _set_module(cnn, name, new)


def _load_weights(cnn: nn.Module, path: str) -> None:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config key model.backbone.weights: file not found: {file}")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(
            f"model.backbone.weights {file}: not a loadable state_dict ({e})"
        ) from None
    if not isinstance(state, dict):
        raise ConfigError(
            f"model.backbone.weights {file}: expected a state_dict, got {type(state)}"
        )
    try:
        result = cnn.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches; the first line names the first offender
        detail = [line.strip() for line in str(e).splitlines() if line.strip()][1:2]
        raise ConfigError(
            f"model.backbone.weights {file}: does not fit the model: {detail}"
        ) from None
    if result.missing_keys or result.unexpected_keys:
        bad = (result.missing_keys + result.unexpected_keys)[:3]
        raise ConfigError(f"model.backbone.weights {file}: keys do not match the model, e.g. {bad}")


class FrameEncoder(nn.Module):
    """uint8 frames [B, T, 3, H, W] + mask [B, T] -> features [B, T, F].

    Only masked-in frames go through the CNN: padding costs no compute and never reaches
    BatchNorm statistics.
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, cnn: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.cnn = cnn
        self.feature_dim = feature_dim
        # Normalising here, per call, keeps the whole sequence in memory as uint8 (4x smaller).
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # Under a mixed-precision policy the parameters seen here are already the low-precision
        # copies, so this is the compute dtype whatever wraps the model.
        dtype = next(self.cnn.parameters()).dtype
        if not bool(mask.any()):
            return frames.new_zeros((*mask.shape, self.feature_dim), dtype=dtype)
        x = (frames[mask].float().div_(255.0) - self.mean) / self.std
        feats = self.cnn(x.to(dtype))
        out = feats.new_zeros((*mask.shape, feats.shape[-1]))
        out[mask] = feats
        return out


def build_backbone(cfg: BackboneConfig) -> FrameEncoder:
    if cfg.name not in torchvision.models.list_models(module=torchvision.models):
        raise ConfigError(f"config key model.backbone.name={cfg.name!r}: not a torchvision model")
    cnn = torchvision.models.get_model(cfg.name, weights=None)
    if cfg.weights:
        _load_weights(cnn, cfg.weights)
    _convert_norm(cnn, cfg.norm)
    # The classifier is the last Linear in every torchvision CNN we support; what feeds it
    # is the per-frame feature vector.
    linears = [(n, m) for n, m in cnn.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ConfigError(f"config key model.backbone.name={cfg.name!r}: no final nn.Linear")
    name, fc = linears[-1]
    _set_module(cnn, name, nn.Identity())
    return FrameEncoder(cnn, fc.in_features)


RNNState = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # GRU: h; LSTM: (h, c)


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


def _detach(state: RNNState, dtype: torch.dtype | None = None) -> RNNState:
    if isinstance(state, tuple):
        return (state[0].detach().to(dtype), state[1].detach().to(dtype))
    return state.detach().to(dtype)


class TemporalHead(nn.Module):
    """features [B, T, F] -> logits [B, T, K]; causal unless ``bidirectional``."""

    def __init__(self, in_dim: int, cfg: HeadConfig, num_classes: int) -> None:
        super().__init__()
        self.rnn: nn.LSTM | nn.GRU | None = None
        out_dim = in_dim
        if cfg.kind is not Temporal.none:
            rnn_cls = nn.LSTM if cfg.kind is Temporal.lstm else nn.GRU
            self.rnn = rnn_cls(
                in_dim,
                cfg.hidden,
                num_layers=cfg.layers,
                batch_first=True,
                dropout=cfg.dropout if cfg.layers > 1 else 0.0,
                bidirectional=cfg.bidirectional,
            )
            out_dim = cfg.hidden * (2 if cfg.bidirectional else 1)
        self.bidirectional = cfg.bidirectional
        self.dropout = nn.Dropout(cfg.dropout)
        self.classifier = nn.Linear(out_dim, num_classes)
        # Set by the memory policy; 0 keeps the whole sequence in one graph.
        self.tbptt_frames = 0

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
        state = None if carry is None or carry.state is None else _detach(carry.state, x.dtype)
        step = self.tbptt_frames or x.shape[1]
        outs = []
        for start in range(0, x.shape[1], step):
            out, after = self.rnn(x[:, start : start + step], state)
            outs.append(out)
            state = _detach(after) if start + step < x.shape[1] else after  # truncated BPTT
        if carry is not None:
            carry.state = _detach(after)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def forward(
        self, feats: torch.Tensor, mask: torch.Tensor, carry: Carry | None = None
    ) -> torch.Tensor:
        x = feats if self.rnn is None else self._run_rnn(feats, mask, carry)
        return self.classifier(self.dropout(x))


class VideoModel(nn.Module):
    def __init__(self, encoder: nn.Module, head: TemporalHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(
        self, frames: torch.Tensor, mask: torch.Tensor, carry: Carry | None = None
    ) -> torch.Tensor:
        return self.head(self.encoder(frames, mask), mask, carry)


def build_model(cfg: ModelConfig, num_classes: int) -> VideoModel:
    encoder = build_backbone(cfg.backbone)
    return VideoModel(encoder, TemporalHead(encoder.feature_dim, cfg.head, num_classes))
