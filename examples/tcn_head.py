"""A temporal head that is not an RNN, for ``distseq train`` by import path: a dilated temporal
convolution network over the per-frame features (MS-TCN's single stage, non-causal).

    PYTHONPATH=examples distseq train examples/tcn.yaml data.train=... data.val=...

distseq calls ``make_head(in_features=F, num_classes=K, **model.head.args)``; the module it
returns maps (features [B, T, F], mask [B, T]) to logits [B, T, K]. It takes no ``state``, so
distseq gives it whole sequences and never carries state (``data.ordered`` is refused).
"""

from __future__ import annotations

import torch
from torch import nn


class DilatedTCN(nn.Module):
    def __init__(self, in_features: int, num_classes: int, channels: int, layers: int) -> None:
        super().__init__()
        self.inp = nn.Conv1d(in_features, channels, 1)
        self.layers = nn.ModuleList(
            nn.Conv1d(channels, channels, 3, padding=2**i, dilation=2**i) for i in range(layers)
        )
        self.out = nn.Conv1d(channels, num_classes, 1)

    def forward(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = mask[:, None, :].to(feats.dtype)  # [B, 1, T]: padding never leaks into frames
        x = self.inp(feats.transpose(1, 2)) * keep
        for conv in self.layers:
            x = (x + torch.relu(conv(x))) * keep
        return self.out(x).transpose(1, 2)  # [B, T, K]


def make_head(in_features: int, num_classes: int, channels: int = 32, layers: int = 4) -> nn.Module:
    return DilatedTCN(in_features, num_classes, channels, layers)
