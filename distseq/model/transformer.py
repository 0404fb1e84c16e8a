"""A transformer encoder over frame features whose attention is local, so that it scales to
whole videos: a frame attends to the frames less than ``span`` away (earlier ones only when
``causal``), in blocks of ``span`` frames that each see their neighbour blocks. Memory and time
grow as T x span, not T^2; ``layers`` blocks see ``layers x (span - 1)`` frames each way.

features [B, T, F] + mask [B, T] -> logits [B, T, K]. Positions enter as ALiBi's biases (Press et
al., 2022): head h adds -m_h x |i - j| to the score of frame i for frame j, so that what a frame
sees depends on distances only, never on where a training window began: a model trained on
windows cut anywhere in a video sees whole videos alike. Padding is never attended to, so a
video gives the same outputs in a padded batch as alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _blocks(x: torch.Tensor, span: int, causal: bool) -> torch.Tensor:
    """[..., n * span, E] -> each block of ``span`` with the one before (and after, unless
    ``causal``), zero beyond the ends: [..., n, 2 or 3 x span, E]."""
    b = x.unflatten(-2, (x.shape[-2] // span, span))  # [..., n, W, E]
    parts = [F.pad(b, (0, 0, 0, 0, 1, 0))[..., :-1, :, :], b]
    if not causal:
        parts.append(F.pad(b, (0, 0, 0, 0, 0, 1))[..., 1:, :, :])
    return torch.cat(parts, dim=-2)


def alibi_slopes(heads: int) -> torch.Tensor:
    """ALiBi's slope of each head: the geometric sequence 2^(-8 / heads), 2^(-16 / heads), ..."""
    return torch.exp2(-8.0 * torch.arange(1, heads + 1, dtype=torch.float32) / heads)


class LocalAttention(nn.Module):
    slopes: torch.Tensor

    def __init__(self, width: int, heads: int, span: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.span, self.causal = heads, span, causal
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.register_buffer("slopes", alibi_slopes(heads), persistent=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        w = self.span
        pad = -t % w
        n = (t + pad) // w
        # [B, T, 3D] -> q, k, v [B, H, n, W, d/H], the padded frames zero.
        q, k, v = (
            F.pad(part, (0, 0, 0, pad)).unflatten(-1, (self.heads, -1)).transpose(1, 2)
            for part in self.qkv(x).chunk(3, dim=-1)
        )
        keys, values = _blocks(k, w, self.causal), _blocks(v, w, self.causal)
        queries = q.unflatten(-2, (n, w))
        real = _blocks(F.pad(mask, (0, pad)).to(x.dtype)[..., None], w, self.causal)[..., 0] > 0
        real = real[:, None, :, None, :]  # [B, 1, n, 1, keys]
        frame = torch.arange(n * w, device=x.device)
        # Each key's frame; -1 beyond the ends, where the blocks' zero padding is no frame.
        key_frame = _blocks(frame[:, None] + 1, w, self.causal)[..., 0] - 1  # [n, keys]
        frame = frame.view(n, w)
        offset = frame[:, :, None] - key_frame[:, None, :]  # [n, W, keys]: query minus key
        near = (offset >= 0) & (offset < w) if self.causal else offset.abs() < w
        # A padded frame attends to itself alone: no row is empty, and no real frame sees it.
        allowed = (near & real) | (offset == 0)  # [B, 1, n, W, keys]
        distance = offset.abs().to(x.dtype)  # [n, W, keys]
        bias = -self.slopes.to(x.dtype)[:, None, None, None] * distance  # [H, n, W, keys]
        bias = bias.masked_fill(~allowed, float("-inf"))  # [B, H, n, W, keys]
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias)
        out = out.flatten(2, 3)[:, :, :t].transpose(1, 2).flatten(2)
        return self.proj(out)


class Block(nn.Module):
    """Pre-norm: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, width: int, heads: int, span: int, causal: bool, dropout: float) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = LocalAttention(width, heads, span, causal)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attention(self.norm1(x), mask))
        return x + self.dropout(self.mlp(self.norm2(x)))


class LocalTransformer(nn.Module):
    """features [B, T, F] + mask [B, T] -> logits [B, T, K]."""

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        *,
        width: int,
        layers: int,
        heads: int,
        span: int,
        causal: bool,
        dropout: float,
    ) -> None:
        super().__init__()
        self.causal = causal
        self.input = nn.Linear(in_dim, width)
        self.blocks = nn.ModuleList(
            Block(width, heads, span, causal, dropout) for _ in range(layers)
        )
        self.norm = nn.LayerNorm(width)
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.input(feats)
        for block in self.blocks:
            x = block(x, mask)
        return self.classifier(self.norm(x))
