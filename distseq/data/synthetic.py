"""The embedded demo dataset: a synthetic "procedure" that only a temporal model can follow.

Every sequence walks through ``phases`` ordered phases 0, 1, ..., P-1. Each frame is a smooth,
slowly drifting colour field plus fine texture, drawn from the same stationary distribution in every
phase, so a single frame says nothing about its phase. The only signal is a brief marker at each
transition: on the first ``MARKER_FRAMES`` frames of phases 1..P-1 a large white square with a
black rim sits in the middle of the image (labelled with the new phase). A per-frame classifier
therefore stays near the class prior (~1/P); a CNN+RNN that detects markers and counts them gets
~100 %. (The demo's task, ``distseq.demo.task``, has a cue of its own, to be recalled.)

Shards use the format that ``distseq.data.manifest`` describes: one sample per
sequence with members ``<key>.<frame:06d>.jpg`` and ``<key>.labels.json``, plus ``index.json``.
Output is a pure function of the arguments: per-sequence RNGs are seeded from (seed, split, index),
tar headers carry a fixed mtime/owner, and JPEG encoding (TorchCodec's libjpeg-turbo) is
deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import webdataset as wds
from torchcodec.encoders import JpegEncoder

from distseq.data.manifest import (
    JPEG_QUALITY,
    LABELS_MEMBER,
    Manifest,
    ShardInfo,
    count_labels,
    frame_member,
    write_manifest,
)

MARKER_FRAMES = 2
# Background values stay below this, so the pure-white marker is never mimicked by the background.
_BG_MAX = 0.7
_GRID = 4  # the colour field is a GRID x GRID lattice upsampled to the frame size
_RHO = 0.97  # per-frame AR(1) coefficient of the drift: slow, but visible over tens of frames


def _split_id(split: str) -> int:
    return {"train": 0, "val": 1}[split]


def _durations(rng: np.random.Generator, length: int, phases: int) -> np.ndarray:
    """Phase lengths summing to ``length``, each > MARKER_FRAMES; symmetric so the prior is ~1/P."""
    floor = MARKER_FRAMES + 1
    spare = length - floor * phases
    # A concentrated symmetric Dirichlet keeps the phases roughly equal but not identical.
    weights = rng.dirichlet(np.full(phases, 8.0))
    extra = np.floor(weights * spare).astype(np.int64)
    extra[rng.integers(phases)] += spare - int(extra.sum())  # rounding leftovers to a random phase
    return extra + floor


def make_sequence(
    rng: np.random.Generator, *, length: int, size: int, phases: int
) -> tuple[torch.Tensor, list[int]]:
    """One sequence: frames uint8 [T, 3, size, size] and per-frame phase labels."""
    durations = _durations(rng, length, phases)
    labels = np.repeat(np.arange(phases), durations)

    # Stationary AR(1) colour field: started from its stationary law, so every frame's marginal
    # is the same whatever its time (and hence phase) in the sequence.
    mean = rng.uniform(0.2, 0.5, size=(3, 1, 1))
    sigma = 0.12
    field = np.empty((length, 3, _GRID, _GRID))
    field[0] = mean + sigma * rng.standard_normal((3, _GRID, _GRID))
    innov = sigma * np.sqrt(1.0 - _RHO**2)
    for t in range(1, length):
        eps = rng.standard_normal((3, _GRID, _GRID))
        field[t] = mean + _RHO * (field[t - 1] - mean) + innov * eps
    smooth = F.interpolate(
        torch.from_numpy(field).float(), size=(size, size), mode="bilinear", align_corners=False
    )
    # Mild fixed texture plus sensor-like flicker, in luminance only: JPEG subsamples chroma, so
    # per-pixel colour noise would mostly turn into reconstruction error.
    texture = torch.from_numpy(0.03 * rng.standard_normal((1, 1, size, size))).float()
    flicker = torch.from_numpy(0.01 * rng.standard_normal((length, 1, size, size))).float()
    img = (smooth + texture + flicker).clamp(0.0, _BG_MAX)

    lo, hi = size // 4, size - size // 4
    rim = max(1, size // 16)
    starts = np.cumsum(durations)[:-1]  # first frame of phases 1..P-1
    for s in starts:
        for t in range(int(s), int(s) + MARKER_FRAMES):
            img[t, :, lo - rim : hi + rim, lo - rim : hi + rim] = 0.0
            img[t, :, lo:hi, lo:hi] = 1.0
    frames = (img * 255.0).round().to(torch.uint8)
    return frames, [int(x) for x in labels]


def sequences(
    split: str,
    count: int,
    *,
    min_frames: int,
    max_frames: int,
    size: int,
    phases: int,
    seed: int,
) -> Iterator[tuple[str, torch.Tensor, list[int]]]:
    """Yield (key, frames, labels) for one split; what ``write_synthetic`` writes, before JPEG."""
    if phases < 1:
        raise ValueError(f"phases={phases}: must be >= 1")
    if min_frames < (MARKER_FRAMES + 1) * phases or max_frames < min_frames:
        raise ValueError(
            f"min_frames={min_frames}, max_frames={max_frames}: need "
            f"{(MARKER_FRAMES + 1) * phases} <= min_frames <= max_frames for {phases} phases"
        )
    for i in range(count):
        rng = np.random.default_rng([seed, _split_id(split), i])
        length = int(rng.integers(min_frames, max_frames + 1))
        frames, labels = make_sequence(rng, length=length, size=size, phases=phases)
        # Keys must not contain dots: webdataset splits member names at the first dot.
        yield f"{split}-{i:06d}", frames, labels


def encode_sample(key: str, frames: torch.Tensor, labels: list[int]) -> dict[str, bytes | str]:
    """A webdataset sample dict in the shard format (``distseq shard`` writes the same)."""
    sample: dict[str, bytes | str] = {"__key__": key}
    for t in range(frames.shape[0]):
        jpeg = JpegEncoder(frames[t]).to_tensor(quality=JPEG_QUALITY)
        sample[frame_member(t)] = jpeg.numpy().tobytes()
    sample[LABELS_MEMBER] = json.dumps({"labels": labels}).encode()
    return sample


def write_shards(
    out_dir: Path,
    splits: Mapping[str, Iterable[tuple[str, torch.Tensor, list[int]]]],
    classes: list[str],
    sequences_per_shard: int,
    fps: float | None = None,
) -> Manifest:
    """Write each split's (key, frames, labels) as ``<split>-NNNNNN.tar`` and ``index.json``,
    which records ``fps``, the frames' rate, where there is one."""
    if sequences_per_shard < 1:
        raise ValueError(f"sequences_per_shard={sequences_per_shard}: must be >= 1")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards: dict[str, ShardInfo] = {}
    counts: list[int] = []  # the open shard's frames of each class
    for split, seqs in splits.items():
        writer: wds.TarWriter | None = None
        name = ""
        for i, (key, frames, labels) in enumerate(seqs):
            if i % sequences_per_shard == 0:
                if writer is not None:
                    writer.close()
                name = f"{split}-{i // sequences_per_shard:06d}.tar"
                counts = [0] * len(classes)
                shards[name] = ShardInfo(split, samples=0, frames=0, labels=counts)
                # Fixed mtime and owner make the tar bytes reproducible; an integer mtime also
                # spares every member a PAX header, which costs as much to parse as the member.
                writer = wds.TarWriter(
                    str(out_dir / name), encoder=False, mtime=0, user="distseq", group="distseq"
                )
            assert writer is not None
            writer.write(encode_sample(key, frames, labels))
            shards[name].samples += 1
            shards[name].frames += len(labels)
            count_labels(labels, counts)
        if writer is not None:
            writer.close()
    manifest = Manifest(classes=classes, shards=shards, fps=fps)
    write_manifest(out_dir / "index.json", manifest, **({} if fps is None else {"fps": fps}))
    return manifest


def write_synthetic(
    out_dir: Path,
    *,
    train_sequences: int,
    val_sequences: int,
    min_frames: int,
    max_frames: int,
    size: int,
    phases: int,
    seed: int,
    sequences_per_shard: int,
) -> Manifest:
    """Write ``train-NNNNNN.tar``, ``val-NNNNNN.tar`` and ``index.json`` into ``out_dir``."""
    make = dict(min_frames=min_frames, max_frames=max_frames, size=size, phases=phases, seed=seed)
    splits = {
        split: sequences(split, count, **make)
        for split, count in (("train", train_sequences), ("val", val_sequences))
    }
    classes = [f"phase{p}" for p in range(phases)]
    return write_shards(out_dir, splits, classes, sequences_per_shard)
