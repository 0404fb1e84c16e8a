"""The demo's task, which only a gradient through the whole sequence can learn: recall a cue.

Every frame is grey noise, drawn afresh from one distribution, but for a cue: 12 consecutive
frames tinted red or blue, early in the sequence. The answer, the cue's colour, is the label of
the frames from 200 to 240 frames after the cue to the end (the memory frames); every other
frame, the cue's own included, is unlabelled (-1). So:

- no single labelled frame says anything about its label: it is noise;
- the evidence and its first labelled frame are at least ``MIN_DELAY`` (200) frames apart, so no
  window of 64 frames holds both, and truncated BPTT at 64 frames never sends a gradient from a
  label to its cue: it cannot learn to see the cue, nor to keep it;
- the cue is visual: the CNN must learn to tell the tints apart, through the long gradient, for
  the RNN to have anything to remember.

The cue's frames are not labelled ``cue`` either: with that label the CNN learns to see the tint
from the cue's own frames, and truncated BPTT then read the colour 200 frames later out of the
state an untrained GRU keeps anyway (1.0 accuracy on one seed of two).

Positions are drawn per sequence (seeded from seed, split and index), so the output is a pure
function of the arguments, written as real shards in the format of ``distseq.data.manifest``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from distseq.data.decode import UNLABELLED
from distseq.data.manifest import Manifest
from distseq.data.synthetic import write_shards

CLASSES = ["red", "blue"]  # chance is 1/2
# The frame rate index.json records, so that distseq predict can make a video's frames as these
# were made: 1 frame/s, the rate surgical phase recognition is labelled and trained at.
FPS = 1.0
CUE_FRAMES = 12
LATEST_CUE = 48  # the cue starts in frames 0..LATEST_CUE
MIN_DELAY, MAX_DELAY = 200, 240  # from the cue's end to the first labelled frame
_TINT = 48  # grey levels added to the cue's channel and taken from the others


def make_sequence(
    rng: np.random.Generator, length: int, size: int
) -> tuple[torch.Tensor, list[int], int, int]:
    """frames uint8 [T, 3, size, size], labels, the cue's first frame, the first labelled frame."""
    shortest = LATEST_CUE + CUE_FRAMES + MAX_DELAY + 1
    if length < shortest:
        raise ValueError(f"length={length}: a sequence needs at least {shortest} frames")
    answer = int(rng.integers(len(CLASSES)))
    cue = int(rng.integers(LATEST_CUE + 1))
    first = cue + CUE_FRAMES + int(rng.integers(MIN_DELAY, MAX_DELAY + 1))
    grey = rng.integers(64, 192, size=(length, 1, size, size))
    frames = np.repeat(grey, 3, axis=1)
    tint = np.full(3, -_TINT // 2)
    tint[0 if CLASSES[answer] == "red" else 2] = _TINT
    frames[cue : cue + CUE_FRAMES] += tint[None, :, None, None]
    labels = [UNLABELLED] * first + [answer] * (length - first)
    return torch.from_numpy(frames.clip(0, 255).astype(np.uint8)), labels, cue, first


def sequences(
    split: str, count: int, length: int, size: int, seed: int
) -> Iterator[tuple[str, torch.Tensor, list[int]]]:
    for i in range(count):
        rng = np.random.default_rng([seed, {"train": 0, "val": 1, "test": 2}[split], i])
        frames, labels, _, _ = make_sequence(rng, length, size)
        yield f"{split}-{i:06d}", frames, labels


def write_task(
    out_dir: Path,
    train: int,
    val: int,
    length: int,
    size: int,
    seed: int,
    per_shard: int,
    test: int = 0,
) -> Manifest:
    """``train``, ``val`` and ``test`` sequences of ``length`` frames as shards in ``out_dir``."""
    counts = {"train": train, "val": val, "test": test}
    splits = {split: sequences(split, count, length, size, seed) for split, count in counts.items()}
    return write_shards(out_dir, splits, CLASSES, per_shard, fps=FPS)
