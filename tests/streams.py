"""Small synthetic shards for the data stream tests, with the sequences they hold."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import webdataset as wds

from distseq.config import DataConfig
from distseq.data.synthetic import sequences, write_synthetic

SYN = dict(min_frames=9, max_frames=14, size=32, phases=3, seed=1)
N_TRAIN, N_VAL, PER_SHARD = 12, 5, 3

Samples = list[dict[str, bytes | str]]


def write_stream_shards(out: Path) -> Path:
    """N_TRAIN train and N_VAL val sequences of SYN, PER_SHARD to a shard, in ``out``."""
    write_synthetic(
        out,
        train_sequences=N_TRAIN,
        val_sequences=N_VAL,
        sequences_per_shard=PER_SHARD,
        **SYN,
    )
    return out


def stream_config(root: Path, **kw: object) -> DataConfig:
    args: dict[str, object] = dict(
        train=str(root / "train-{000000..000003}.tar"),
        val=str(root / "val-{000000..000001}.tar"),
        size=32,
        window=12,
        batch_size=2,
        num_workers=0,
        shuffle_buffer=4,
    )
    args.update(kw)
    return DataConfig(**args)  # type: ignore[arg-type]


def sequences_of(split: str, count: int) -> dict[str, tuple[torch.Tensor, list[int]]]:
    """The sequences of ``write_stream_shards`` before JPEG, by key."""
    return {key: (x, y) for key, x, y in sequences(split, count, **SYN)}


def label_counts_of(split: str, count: int) -> dict[str, list[int]]:
    """Frames of each class in each of ``write_stream_shards``' shards of ``split``, worked out
    from the labels of ``sequences_of``."""
    counts: dict[str, list[int]] = {}
    for i, (_, labels) in enumerate(sequences_of(split, count).values()):
        shard = counts.setdefault(f"{split}-{i // PER_SHARD:06d}.tar", [0] * int(SYN["phases"]))
        for label in labels:
            shard[label] += 1
    return counts


def write_shards(root: Path, shards: list[Samples]) -> DataConfig:
    """bad-000000.tar, bad-000001.tar, ..., used for train and val alike, with their index.json."""
    root.mkdir(parents=True, exist_ok=True)
    infos = {}
    for i, samples in enumerate(shards):
        name = f"bad-{i:06d}.tar"
        with wds.TarWriter(str(root / name), encoder=False) as sink:
            for sample in samples:
                sink.write(sample)
        infos[name] = {"split": "train", "samples": len(samples), "frames": 0}
    index = {"format": 1, "classes": ["c0", "c1", "c2"], "shards": infos}
    (root / "index.json").write_text(json.dumps(index))
    urls = str(root / f"bad-{{000000..{len(shards) - 1:06d}}}.tar")
    return stream_config(root, train=urls, val=urls, batch_size=1)
