"""The whole network: a CNN per frame, then the temporal head. Its state-dict keys are canonical.

The model knows nothing about chunking, checkpointing or sharding. ``distseq.memory`` subclasses
it to run the backbone over time in chunks and ``distseq.parallel`` shards it, neither renaming
a parameter: the keys of a trained model, an exported file and a plain :func:`build_model` are
the same (``backbone.conv1.weight``, ``head.rnn.weight_ih_l0``, ``head.classifier.weight``).
"""

from __future__ import annotations

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


def build_model(cfg: ModelConfig, num_classes: int) -> VideoModel:
    backbone, feature_dim = build_backbone(cfg.backbone)
    return VideoModel(backbone, build_head(feature_dim, cfg.head, num_classes), feature_dim)
