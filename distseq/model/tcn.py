"""MS-TCN (Farha and Gall, CVPR 2019): stages of dilated temporal convolutions, each refining the
softmax of the stage before; with ``causal``, TeCNO's variant (Czempiel et al., MICCAI 2020), whose
convolutions are padded on the left only, so that no frame sees the future.

features [B, T, F] + mask [B, T] -> every stage's logits [S, B, T, K], the last the prediction
(the head contract's multi-stage form, model/head.py). Layer i of a stage has dilation 2^i and
kernel 3, so a stage of L layers sees 2^(L+1) - 1 frames (L = 10: 2,047).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DilatedResidual(nn.Module):
    """MS-TCN's layer: a dilated convolution, ReLU, a 1x1 convolution, dropout, and the input
    added back."""

    def __init__(self, dilation: int, channels: int, dropout: float, causal: bool) -> None:
        super().__init__()
        self.dilated = nn.Conv1d(channels, channels, 3, dilation=dilation)
        self.pointwise = nn.Conv1d(channels, channels, 1)
        self.dropout = nn.Dropout(dropout)
        self.padding = (2 * dilation, 0) if causal else (dilation, dilation)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.dilated(F.pad(x, self.padding)))
        return (x + self.dropout(self.pointwise(y))) * mask


class Stage(nn.Module):
    """One stage: a 1x1 convolution in, ``layers`` dilated residual layers, a 1x1 convolution to
    the classes."""

    def __init__(
        self,
        layers: int,
        channels: int,
        in_dim: int,
        num_classes: int,
        dropout: float,
        causal: bool,
    ) -> None:
        super().__init__()
        self.input = nn.Conv1d(in_dim, channels, 1)
        self.layers = nn.ModuleList(
            DilatedResidual(2**i, channels, dropout, causal) for i in range(layers)
        )
        self.output = nn.Conv1d(channels, num_classes, 1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # MS-TCN's code masks after each layer, not after the input convolution, so that the
        # padding of a batch's shorter video (its bias) reaches that video's last frames. Masked
        # here too, a video gives the same outputs in a padded batch as alone.
        y = self.input(x) * mask
        for layer in self.layers:
            y = layer(y, mask)
        return self.output(y) * mask


class MSTCN(nn.Module):
    """features [B, T, F] + mask [B, T] -> logits [S, B, T, K] of its S stages."""

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        *,
        stages: int,
        layers: int,
        channels: int,
        dropout: float,
        causal: bool,
    ) -> None:
        super().__init__()
        self.causal = causal
        self.stages = nn.ModuleList(
            Stage(layers, channels, in_dim if s == 0 else num_classes, num_classes, dropout, causal)
            for s in range(stages)
        )

    def forward(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask[:, None, :].to(feats.dtype)
        out = self.stages[0](feats.transpose(1, 2), m)
        outs = [out]
        for stage in self.stages[1:]:
            out = stage(F.softmax(out, dim=1) * m, m)
            outs.append(out)
        return torch.stack(outs).transpose(2, 3)
