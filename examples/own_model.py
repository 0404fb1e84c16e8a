"""Your own CNN and your own LSTM, trained end to end over a 500-frame video in a plain PyTorch
loop: the CNN runs in checkpointed chunks, so its activations for every frame never exist at
once, and the gradients are those of plain autograd.

    python examples/own_model.py                       # 500 frames of 64 x 64
    python examples/own_model.py --frames 2000 --check # compare with plain autograd too

It prints each step's loss, the peak memory of a step chunked and (with --check) of the same
step under plain autograd, and the largest gradient difference between the two.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

import distseq


def small_cnn(features: int = 64, norm: Callable[[int], nn.Module] = nn.BatchNorm2d) -> nn.Module:
    """Any per-frame module [N, 3, H, W] -> [N, F] will do; this one has BatchNorm, whose
    running statistics distseq keeps updated once per chunk, not again in recompute."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1),
        norm(32),
        nn.ReLU(),
        nn.Conv2d(32, features, 3, stride=2, padding=1),
        norm(features),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )


class LSTMHead(nn.Module):
    """(features [B, T, F], mask [B, T], state) -> (logits [B, T, K], state). Taking ``state``
    makes it a stateful head: a distseq.Carry can carry it from one window to the next."""

    def __init__(self, features: int, classes: int, hidden: int = 64) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.out = nn.Linear(hidden, classes)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, state: tuple[torch.Tensor, ...] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        y, state = self.lstm(x, state)
        return self.out(y), state


def make_model(classes: int, chunk: int, recompute: str) -> distseq.ChunkedModel:
    torch.manual_seed(0)
    return distseq.ChunkedModel(
        small_cnn(), LSTMHead(64, classes), chunk_frames=chunk, recompute=recompute
    )


def step(model: nn.Module, frames: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> float:
    loss = F.cross_entropy(model(frames, mask).flatten(0, 1), labels.flatten())
    loss.backward()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=500, help="T (default: 500)")
    parser.add_argument("--size", type=int, default=64, help="frames are size x size (64)")
    parser.add_argument("--chunk", type=int, default=16, help="frames a chunk (default: 16)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default: 3)")
    parser.add_argument("--check", action="store_true", help="compare with plain autograd")
    args = parser.parse_args()

    classes, device = 4, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(1)
    # One video of uint8 frames, as a decoder gives them; the model scales and normalises each
    # chunk (ImageNet's mean and std unless you say otherwise: normalize=...).
    frames = torch.randint(0, 256, (1, args.frames, 3, args.size, args.size), generator=g)
    frames = frames.to(torch.uint8).to(device)
    mask = torch.ones(1, args.frames, dtype=torch.bool, device=device)
    labels = (torch.arange(args.frames, device=device) * classes // args.frames)[None]

    model = make_model(classes, args.chunk, "torch").to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(args.steps):
        optimizer.zero_grad()
        print(f"step {i + 1}: loss {step(model, frames, mask, labels):.4f}")
        optimizer.step()

    if args.check:
        chunked = make_model(classes, args.chunk, "torch").to(device)
        # The reference: the same chunks without recompute, i.e. plain autograd; with
        # BatchNorm the chunks must match, as its batch statistics are a chunk's.
        plain = make_model(classes, args.chunk, "none").to(device)
        peak = distseq.peak_memory(lambda: step(chunked, frames, mask, labels), device)
        plain_peak = distseq.peak_memory(lambda: step(plain, frames, mask, labels), device)
        ref = {n: p.grad for n, p in plain.named_parameters() if p.grad is not None}
        got = {n: p.grad for n, p in chunked.named_parameters() if p.grad is not None}
        assert got.keys() == ref.keys() == dict(plain.named_parameters()).keys()
        error = max(float((got[n] - ref[n]).abs().max() / ref[n].abs().max()) for n in ref)
        mib = 2**20
        print(
            f"peak memory of a step: chunked {peak / mib:.1f} MiB, plain {plain_peak / mib:.1f} "
            f"MiB ({plain_peak / peak:.1f}x)"
        )
        print(f"largest relative gradient difference: {error:.2e}")


if __name__ == "__main__":
    main()
