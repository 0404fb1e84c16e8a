"""How the frame encoder runs over time: chunks of k frames, each under activation checkpointing.

Only each chunk's input (a uint8 slice of the sequence, already in memory) and its features
outlive the chunk's forward; the CNN's inner activations are recomputed chunk by chunk in
backward. Gradients are those of the plain model: the RNN state is never detached unless
``tbptt_frames`` asks for it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from distseq.config import Backend, ConfigError, MemoryConfig
from distseq.model import VideoModel


@contextmanager
def frozen_bn_stats(bns: list[_BatchNorm]) -> Iterator[None]:
    """Run BatchNorm forwards without touching running stats, for the recompute pass.

    Recompute must save the same tensors as the first forward, so BN has to stay in training
    mode (``track_running_stats=False`` raises CheckpointError); momentum 0 keeps the update a
    no-op, and ``num_batches_tracked`` is put back afterwards.
    """
    saved = [
        (bn.momentum, None if bn.num_batches_tracked is None else bn.num_batches_tracked.clone())
        for bn in bns
    ]
    for bn in bns:
        bn.momentum = 0.0
    try:
        yield
    finally:
        for bn, (momentum, tracked) in zip(bns, saved, strict=True):
            bn.momentum = momentum
            if tracked is not None:
                assert bn.num_batches_tracked is not None
                bn.num_batches_tracked.copy_(tracked)


def _batchnorms(module: nn.Module) -> list[_BatchNorm]:
    return [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]


def _fairscale_checkpointed(encoder: nn.Module) -> nn.Module:
    from fairscale.nn.checkpoint.checkpoint_activations import (
        checkpoint_wrapper,
        is_recomputing,
    )

    # fairscale's own BN patch defers each chunk's stats update to its recompute, which runs in
    # reverse chunk order, so running stats come out wrong with more than one chunk. Update in
    # the first (forward-order) pass instead and freeze stats during recompute, as the torch
    # backend does. The hooks sit on the BN layers because fairscale recomputes by calling the
    # wrapped forward directly, past the wrapped module's own hooks.
    active: dict[int, AbstractContextManager[None]] = {}

    def enter(bn: nn.Module, args: Any) -> None:
        if is_recomputing():
            assert isinstance(bn, _BatchNorm)
            active[id(bn)] = ctx = frozen_bn_stats([bn])
            ctx.__enter__()

    def leave(bn: nn.Module, args: Any, output: Any) -> None:
        ctx = active.pop(id(bn), None)
        if ctx is not None:
            ctx.__exit__(None, None, None)

    # fairscale feeds its autograd function a dummy tensor that requires grad, so torch's
    # "None of the inputs have requires_grad=True" is false here; the trainer's first-step check
    # still catches a parameter that really gets no gradient.
    warnings.filterwarnings(
        "ignore", "None of the inputs have requires_grad", UserWarning, "fairscale"
    )
    for bn in _batchnorms(encoder):
        bn.disable_patch_batchnorm = True  # type: ignore[assignment]
        bn.register_forward_pre_hook(enter)
        bn.register_forward_hook(leave)
    return checkpoint_wrapper(encoder)


class ChunkedEncoder(nn.Module):
    """frames [B, T, ...] + mask [B, T] -> features [B, T, F], ``chunk_frames`` frames at a time.

    This module owns the chunk loop, so sharding it as one unit gathers the CNN's parameters once
    per step rather than once per chunk and recompute.
    """

    def __init__(self, encoder: nn.Module, chunk_frames: int, backend: Backend) -> None:
        super().__init__()
        self.chunk_frames = chunk_frames
        self.backend = backend
        self._bns = _batchnorms(encoder)
        self.encoder = _fairscale_checkpointed(encoder) if backend is Backend.fairscale else encoder

    def _contexts(self) -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
        return nullcontext(), frozen_bn_stats(self._bns)

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        feats = []
        for start in range(0, frames.shape[1], self.chunk_frames):
            chunk = (
                frames[:, start : start + self.chunk_frames],
                mask[:, start : start + self.chunk_frames],
            )
            if self.backend is Backend.torch and torch.is_grad_enabled():
                # Non-reentrant on purpose: reentrant checkpointing gives the CNN no gradients
                # (only a warning) when the frames do not require grad, which they never do.
                out = checkpoint(
                    self.encoder, *chunk, use_reentrant=False, context_fn=self._contexts
                )
            else:
                out = self.encoder(*chunk)
            feats.append(out)
        return torch.cat(feats, dim=1)


def apply_memory_policy(model: VideoModel, cfg: MemoryConfig) -> VideoModel:
    if cfg.tbptt_frames and model.head.bidirectional:
        raise ConfigError(
            "config key memory.tbptt_frames: truncated BPTT needs a causal head "
            "(model.head.bidirectional=false)"
        )
    model.encoder = ChunkedEncoder(model.encoder, cfg.chunk_frames, cfg.backend)
    model.head.tbptt_frames = cfg.tbptt_frames
    return model
