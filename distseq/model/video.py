"""The whole network: a CNN per frame, then the temporal head. Its state-dict keys are canonical.

The model knows nothing about chunking, checkpointing or sharding. ``distseq.memory`` subclasses
it to run the backbone over time in chunks and ``distseq.parallel`` shards it, neither renaming
a parameter: the keys of a trained model, an exported file and a plain :func:`build_model` are
the same (``backbone.conv1.weight``, ``head.rnn.weight_ih_l0``, ``head.classifier.weight``).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from distseq.config import ModelConfig
from distseq.model.backbone import IMAGENET_MEAN, IMAGENET_STD, build_backbone, frame_features
from distseq.model.head import Carry, TemporalHead, build_head


class VideoModel(nn.Module):
    """uint8 frames [B, T, 3, H, W] + mask [B, T] -> logits [B, T, K]."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, backbone: nn.Module, head: TemporalHead, feature_dim: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.feature_dim = feature_dim
        device = next(backbone.parameters()).device
        mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)
        self.register_buffer("mean", mean, persistent=False)
        self.register_buffer("std", std, persistent=False)

    def features(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-frame features [B, T, F]: the backbone over every real frame."""
        return frame_features(self.backbone, frames, mask, self.mean, self.std, self.feature_dim)

    def forward(
        self, frames: torch.Tensor, mask: torch.Tensor, carry: Carry | None = None
    ) -> torch.Tensor:
        return self.head(self.features(frames, mask), mask, carry)


class FeatureModel(nn.Module):
    """The temporal head alone, over features that a backbone made once (``data.features``):
    features [B, T, F] (float16 as stored) + mask [B, T] -> logits [B, T, K]. Its keys are the
    head's of a :class:`VideoModel` (``head.*``), so a warm start moves them either way."""

    def __init__(self, head: TemporalHead, feature_dim: int) -> None:
        super().__init__()
        self.head = head
        self.feature_dim = feature_dim

    def features(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The stored features in the head's dtype, zero where masked out (as a backbone's)."""
        dtype = next(self.head.parameters()).dtype
        return features.to(dtype).masked_fill(~mask[..., None], 0)

    def forward(
        self, features: torch.Tensor, mask: torch.Tensor, carry: Carry | None = None
    ) -> torch.Tensor:
        return self.head(self.features(features, mask), mask, carry)


def feature_size(cfg: ModelConfig) -> int:
    """The size of the features ``cfg.backbone`` makes per frame, without its weights: built on
    the meta device, which allocates nothing."""
    with torch.device("meta"):
        return build_backbone(replace(cfg.backbone, weights=""))[1]


def build_feature_model(cfg: ModelConfig, num_classes: int) -> FeatureModel:
    """The head of the model ``cfg`` describes, over the features its backbone makes
    (data.features)."""
    dim = feature_size(cfg)
    return FeatureModel(build_head(dim, cfg.head, num_classes), dim)


def build_model(cfg: ModelConfig, num_classes: int) -> VideoModel:
    backbone, feature_dim = build_backbone(cfg.backbone)
    return VideoModel(backbone, build_head(feature_dim, cfg.head, num_classes), feature_dim)
