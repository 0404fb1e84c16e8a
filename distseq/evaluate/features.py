"""A trained model's per-frame features, once, as ``distseq features`` writes them: every
video's backbone output as ``<video>.npy`` of shape (features, frames), float32, the layout
that action-segmentation code (MS-TCN and its successors) reads.

Videos, frame folders or shards are read as ``predict`` reads them (``predict.videos``) and go
through the backbone a chunk at a time, so device memory is one chunk's whatever the length;
the host keeps the video's features only (8 KB a frame for ResNet-50). Each file is written
beside its final name and renamed when complete, and a file already there is skipped, so a
killed run leaves no half-written file and a rerun does only what is left. Under torchrun the
videos are split across the ranks.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from distseq.checkpoint.export import Loaded
from distseq.evaluate.predict import FrameRecipe, chunks, videos
from distseq.parallel import DistInfo, all_reduce_sum


@dataclass(frozen=True)
class Extracted:
    videos: int  # written by all ranks
    skipped: int  # already there
    frames: int
    seconds: float  # rank 0's time in the backbone


@torch.no_grad()
def write_features(
    loaded: Loaded, inputs: list[str], how: FrameRecipe, chunk: int, out: Path, info: DistInfo
) -> Extracted:
    """This rank's share of the videos of ``inputs`` (every world-th), one ``<video>.npy`` each
    in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    model = loaded.model.to(info.device).eval()
    done = skipped = frames = 0
    seconds = 0.0
    bar = tqdm(unit="video", disable=not info.is_main, desc="features")
    for i, (name, video) in enumerate(videos(inputs, loaded, how)):
        if i % info.world != info.rank:
            continue
        path = out / f"{name}.npy"
        if path.exists():
            skipped += 1
            continue
        parts = []
        for x in chunks(video, chunk):
            start = time.perf_counter()
            mask = torch.ones(x.shape[:2], dtype=torch.bool, device=info.device)
            parts.append(model.features(x.to(info.device), mask)[0].float().cpu())
            seconds += time.perf_counter() - start
        feats = torch.cat(parts) if parts else torch.zeros((0, model.feature_dim))
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.save(f, feats.T.contiguous().numpy())  # (features, frames)
        os.replace(tmp, path)
        done += 1
        frames += len(feats)
        bar.update()
    bar.close()
    counts = [float(done), float(skipped), float(frames)]
    totals = all_reduce_sum(torch.tensor(counts, dtype=torch.float64, device=info.device))
    return Extracted(int(totals[0]), int(totals[1]), int(totals[2]), seconds)
