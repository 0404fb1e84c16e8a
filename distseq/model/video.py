"""The whole network: a CNN per frame, then the temporal head. Its state-dict keys are canonical.

Any per-frame module and any temporal module fit (the contract is :class:`VideoModel`'s). The
model knows nothing about chunking, checkpointing or sharding. ``distseq.memory`` subclasses
it to run the backbone over time in chunks and ``distseq.parallel`` shards it, neither renaming
a parameter: the keys of a trained model, an exported file and a plain :func:`build_model` are
the same (``backbone.conv1.weight``, ``head.rnn.weight_ih_l0``, ``head.classifier.weight``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace

import torch
from torch import nn

from distseq.config import ModelConfig, is_import_path
from distseq.errors import ModelError
from distseq.model.backbone import build_backbone, checked_feature_dim, frame_features
from distseq.model.frames import FrameInput, Normalize
from distseq.model.head import Carry, build_head, head_logits, is_stateful
from distseq.model.imported import build_imported


class VideoModel(nn.Module):
    """Frames [B, T, C, H, W] + mask [B, T] -> logits [B, T, K] (a multi-stage head's
    [S, B, T, K]): ``backbone`` on every real frame ([N, C, H, W] -> [N, F]), then ``head`` over
    the sequence ((features [B, T, F], mask [B, T]) -> [B, T, K]; a head whose forward takes
    ``state`` returns (logits, state) and carries it in a :class:`Carry`). ``frames`` and
    ``normalize`` say what the frames are (model/frames.py). ``backbone_frozen``: the backbone
    runs without autograd, so a step keeps none of its activations and runs no backward
    through it (optim.groups' ``frozen_until`` sets it while the whole backbone is frozen)."""

    mean: torch.Tensor | None
    std: torch.Tensor | None

    def __init__(
        self,
        backbone: nn.Module,
        head: nn.Module,
        feature_dim: int | None = None,
        *,
        frames: str = "uint8",
        normalize: Normalize = "imagenet",
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.feature_dim = feature_dim  # None: learnt from the first frames the backbone sees
        self.stateful = is_stateful(head)
        self.backbone_frozen = False
        # Under a sequence split (parallelize(..., sequence=S)): runs this rank's slice of the
        # frames through features and returns every slice's; set by distseq.parallel alone.
        self.split: Callable[[VideoModel, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        self.input = FrameInput.of(frames, normalize)
        param = next(backbone.parameters(), None)
        if param is None:
            raise ModelError("the backbone has no parameters: there is nothing to train in it")
        device = param.device
        mean, std = self.input.buffers(device)
        self.register_buffer("mean", mean, persistent=False)
        self.register_buffer("std", std, persistent=False)

    def features(
        self, frames: torch.Tensor, mask: torch.Tensor, of: int | None = None
    ) -> torch.Tensor:
        """Per-frame features [B, T, F]: the backbone over every real frame. ``of``: these frames
        are a slice of an ``of``-frame sequence (a sequence split), which a memory plan sizes the
        step by (``ChunkedModel``); the features are the slice's alone either way."""
        feats = frame_features(
            self.backbone, frames, mask, self.input, self.mean, self.std, self.feature_dim
        )
        self.feature_dim = checked_feature_dim(self.feature_dim, feats)
        return feats

    @contextmanager
    def unsplit(self) -> Iterator[None]:
        """Every frame on this rank while inside, as without a sequence split: what the memory
        probe measures, and a plan then puts the slices together from."""
        split, self.split = self.split, None
        try:
            yield
        finally:
            self.split = split

    def temporal(
        self, feats: torch.Tensor, mask: torch.Tensor, carry: Carry | None = None
    ) -> torch.Tensor:
        """The head over features [B, T, F]: logits [B, T, K] or [S, B, T, K], checked."""
        return head_logits(self.head, self.stateful, feats, mask, carry)

    def forward(
        self, frames: torch.Tensor, mask: torch.Tensor, carry: Carry | None = None
    ) -> torch.Tensor:
        split = self.split
        if split is None:  # a split checks its slice's frames itself
            self.input.check(frames, mask)
        # A backbone of which nothing trains (requires_grad off throughout) runs the same way:
        # a checkpoint with nothing to recompute for fails in fairscale's backward.
        still = self.backbone_frozen or not any(p.requires_grad for p in self.backbone.parameters())
        with torch.no_grad() if still else nullcontext():
            feats = self.features(frames, mask) if split is None else split(self, frames, mask)
        return self.temporal(feats, mask, carry)


class FeatureModel(nn.Module):
    """The temporal head alone, over features that a backbone made once (``data.features``):
    features [B, T, F] (float16 as stored) + mask [B, T] -> logits [B, T, K] (or a multi-stage
    head's [S, B, T, K]). Its keys are the
    head's of a :class:`VideoModel` (``head.*``), so a warm start moves them either way."""

    def __init__(self, head: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.head = head
        self.feature_dim = feature_dim
        self.stateful = is_stateful(head)

    def features(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The stored features in the head's dtype, zero where masked out (as a backbone's)."""
        dtype = next(self.head.parameters()).dtype
        return features.to(dtype).masked_fill(~mask[..., None], 0)

    def temporal(
        self, feats: torch.Tensor, mask: torch.Tensor, carry: Carry | None = None
    ) -> torch.Tensor:
        return head_logits(self.head, self.stateful, feats, mask, carry)

    def forward(
        self, features: torch.Tensor, mask: torch.Tensor, carry: Carry | None = None
    ) -> torch.Tensor:
        return self.temporal(self.features(features, mask), mask, carry)


def feature_size(cfg: ModelConfig) -> int:
    """The size of the features ``cfg.backbone`` makes per frame, without its weights: built on
    the meta device, which allocates nothing."""
    with torch.device("meta"):
        return build_backbone(replace(cfg.backbone, weights=""))[1]


def _head(in_dim: int, cfg: ModelConfig, num_classes: int) -> nn.Module:
    """distseq's head, or the one ``model.head.kind``'s factory makes."""
    if not is_import_path(cfg.head.kind):
        return build_head(in_dim, cfg.head, num_classes)
    return build_imported(
        cfg.head.kind, "model.head.kind", cfg.head.args, in_features=in_dim, num_classes=num_classes
    )


def build_feature_model(cfg: ModelConfig, num_classes: int) -> FeatureModel:
    """The head of the model ``cfg`` describes, over the features its backbone makes
    (data.features)."""
    dim = feature_size(cfg)
    return FeatureModel(_head(dim, cfg, num_classes), dim)


def build_model(cfg: ModelConfig, num_classes: int) -> VideoModel:
    backbone, feature_dim, given = build_backbone(cfg.backbone)
    return VideoModel(
        backbone,
        _head(feature_dim, cfg, num_classes),
        feature_dim,
        frames=given.dtype,
        normalize=given.normalize,
    )
