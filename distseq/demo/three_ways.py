"""The recall task (``task.py``) trained three ways, one table: what ``distseq demo`` runs.

- ``per_frame``: a CNN alone, no RNN (``model.head.kind=none``);
- ``tbptt``: the CNN+GRU with truncated BPTT at 64 frames (``memory.tbptt_frames=64``), the
  state carried but detached, as published surgical-video models train;
- ``end_to_end``: the same CNN+GRU with distseq's exact gradients through all 512 frames.

The names are ``bench recipes``' for the same recipes.

Each row: the validation accuracy that training logs, the time of one training step and its peak
memory, measured as ``bench memory`` measures them, beside plain autograd's peak for the same
step. Every labelled frame of the task is a memory frame (its label is the colour of a cue 200+
frames back), so the accuracy on the memory frames and on all labelled frames are one number:
labelling the cue's own frames as well let truncated BPTT learn the recall on one seed of two,
through the state the untrained GRU keeps anyway.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from importlib.resources import files
from pathlib import Path

import torch

from distseq.config import Config, MemoryConfig, Recompute, load_config
from distseq.data.manifest import Manifest, find_manifest
from distseq.data.train_stream import train_batches
from distseq.demo.task import CLASSES, write_task
from distseq.memory.measure import measure_step
from distseq.memory.policy import apply_memory_policy
from distseq.model.video import build_model
from distseq.train.loop import train
from distseq.units import MIB

MODELS = {
    "per_frame": ["model.head.kind=none", "model.head.chrono_frames=0"],
    "tbptt": ["memory.tbptt_frames=64"],
    "end_to_end": [],
}
LENGTH, SIZE, PER_SHARD = 512, 16, 16


@dataclass
class DemoRecord:
    model: str
    memory_accuracy: float  # on the frames whose label is the cue's colour
    accuracy: float  # on all labelled frames: the same frames in this task
    step_seconds: float
    peak_bytes: int  # one training step as configured
    plain_peak_bytes: int  # the same step without checkpointing or chunks
    train_seconds: float


def demo_config_path() -> Path:
    return Path(str(files("distseq.demo") / "demo.yaml"))


def _step_cost(cfg: Config, num_classes: int) -> tuple[float, int, int]:
    """(seconds, peak bytes) of one step of ``cfg``'s model on a real batch, and plain's peak."""
    batch = next(train_batches(replace(cfg.data, num_workers=0), seed=0))
    costs = []
    plain = MemoryConfig(
        Recompute.none, chunk_frames=cfg.data.window, tbptt_frames=cfg.memory.tbptt_frames
    )
    for memory in (cfg.memory, plain):
        torch.manual_seed(0)
        model = apply_memory_policy(build_model(cfg.model, num_classes), memory)
        costs.append(measure_step(model, batch.frames, batch.mask, batch.labels))
    return costs[0].seconds, costs[0].peak_bytes, costs[1].peak_bytes


def _sequences(manifest: Manifest) -> tuple[int, int]:
    """(train, val) sequence counts."""
    train = sum(s.samples for s in manifest.shards.values() if s.split == "train")
    return train, sum(s.samples for s in manifest.shards.values()) - train


def task_shards(data: Path, train: int, val: int) -> list[str]:
    """The ``data.train`` and ``data.val`` overrides for the task's shards in ``data``, written
    unless a previous demo left them there with the same numbers of sequences."""
    index = data / "index.json"
    manifest = find_manifest("", str(index), "data") if index.is_file() else None
    if manifest is None or _sequences(manifest) != (train, val):
        print(f"writing the recall task's shards to {data} ...", flush=True)
        manifest = write_task(data, train, val, LENGTH, SIZE, seed=0, per_shard=PER_SHARD)
    shards = []
    for split in ("train", "val"):
        count = sum(info.split == split for info in manifest.shards.values())
        shards.append(f"data.{split}={data}/{split}-{{000000..{count - 1:06d}}}.tar")
    return shards


def run_demo(
    out_dir: str, overrides: list[str], train_seqs: int, val_seqs: int
) -> list[DemoRecord]:
    out = Path(out_dir)
    shards = task_shards(out / "data", train_seqs, val_seqs)
    records = []
    for name, extra in MODELS.items():
        print(f"\n== {name}", flush=True)
        cfg = load_config(
            demo_config_path(), [*shards, f"train.out_dir={out / name}", *extra, *overrides]
        )
        start = time.perf_counter()
        accuracy = train(cfg)["val_accuracy"]
        seconds = time.perf_counter() - start
        step, peak, plain = _step_cost(cfg, len(CLASSES))
        records.append(DemoRecord(name, accuracy, accuracy, step, peak, plain, seconds))
    return records


def table(records: list[DemoRecord], val: int) -> str:
    lines = [
        f"recall a cue 200+ frames back: {val} validation sequences of {LENGTH} frames, "
        f"chance {1 / len(CLASSES):.2f} on the memory frames",
        f"{'model':10} {'memory acc':>10} {'all acc':>8} {'step s':>7} {'peak MiB':>9} "
        f"{'plain MiB':>9} {'train s':>8}",
    ]
    for r in records:
        lines.append(
            f"{r.model:10} {r.memory_accuracy:>10.3f} {r.accuracy:>8.3f} {r.step_seconds:>7.2f} "
            f"{r.peak_bytes / MIB:>9.1f} {r.plain_peak_bytes / MIB:>9.1f} {r.train_seconds:>8.0f}"
        )
    return "\n".join(lines)
