"""Running a trained model over whole videos of any length: per-frame phase probabilities.

A causal head streams: frames go through the model a chunk at a time with the RNN state
carried, so device memory stays that of one chunk whatever the length of the video. A
bidirectional head cannot stream: the backbone runs a chunk at a time and keeps only the
features, and the head then sees them all, so memory grows with T by the features (8 KB a frame
for ResNet-50 in fp32), not by the frames.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from distseq.model.head import Carry
from distseq.model.video import VideoModel


def _chunks(frames: Iterable[torch.Tensor], size: int) -> Iterator[torch.Tensor]:
    """uint8 frames [3, H, W] in order -> stacks [1, n <= size, 3, H, W]."""
    batch: list[torch.Tensor] = []
    for frame in frames:
        batch.append(frame)
        if len(batch) == size:
            yield torch.stack(batch)[None]
            batch = []
    if batch:
        yield torch.stack(batch)[None]


@torch.no_grad()
def video_probabilities(
    model: VideoModel, frames: Iterable[torch.Tensor], chunk: int, device: torch.device
) -> torch.Tensor:
    """Per-frame probabilities [T, K] (on the CPU) of one video given frame by frame."""
    model.eval()
    if model.head.bidirectional:
        feats = [
            model.features(x.to(device), torch.ones(x.shape[:2], dtype=torch.bool, device=device))
            for x in _chunks(frames, chunk)
        ]
        if not feats:
            return torch.zeros((0, model.head.classifier.out_features))
        all_feats = torch.cat(feats, dim=1)
        mask = torch.ones(all_feats.shape[:2], dtype=torch.bool, device=device)
        return model.head(all_feats, mask)[0].float().softmax(-1).cpu()
    carry = Carry()
    probs = []
    for x in _chunks(frames, chunk):
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=device)
        probs.append(model(x.to(device), mask, carry)[0].float().softmax(-1).cpu())
    if not probs:
        return torch.zeros((0, model.head.classifier.out_features))
    return torch.cat(probs)
