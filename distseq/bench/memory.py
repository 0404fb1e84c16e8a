"""``distseq bench memory``: activation memory and step time of one training step per recompute
backend.

Numbers, not pass/fail: compare rows of one run (chunked / none), since the machine is noisy.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch

from distseq.config import BackboneConfig, HeadConfig, MemoryConfig, ModelConfig, Norm, Recompute
from distseq.memory.chunked import ChunkedModel
from distseq.memory.measure import SavedTensorBytes, measure_step
from distseq.memory.policy import apply_memory_policy
from distseq.model.video import VideoModel, build_model
from distseq.units import MIB

CLASSES = 7


def _model_config(backbone: str) -> ModelConfig:
    return ModelConfig(
        backbone=BackboneConfig(name=backbone, norm=Norm.groupnorm), head=HeadConfig()
    )


def bench_model(
    backbone: str, recompute: Recompute, chunk: int, device: torch.device
) -> ChunkedModel:
    """``backbone`` + LSTM as the benchmarks run it, the same parameters every time."""
    torch.manual_seed(0)
    memory = MemoryConfig(recompute=recompute, chunk_frames=chunk)
    return apply_memory_policy(build_model(_model_config(backbone), CLASSES), memory).to(device)


def random_sequence(
    frames: int, size: int, device: torch.device, classes: int = CLASSES
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence of random frames, its mask and labels, the same every time."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (1, frames, 3, size, size), generator=g, dtype=torch.uint8).to(device)
    mask = torch.ones(1, frames, dtype=torch.bool, device=device)
    return x, mask, torch.randint(0, classes, (1, frames), generator=g).to(device)


def floor_bytes(
    backbone: str, model: VideoModel, frames: torch.Tensor, mask: torch.Tensor, chunk: int
) -> int:
    """What chunking cannot avoid, measured: the features and the RNN's saved state over all
    T frames, plus the saved activations of one chunk through the plain, unchunked CNN."""
    with torch.no_grad():
        feats = model.features(frames, mask)
    feats.requires_grad_(True)
    with SavedTensorBytes(exclude=model.parameters()) as head:
        model.temporal(feats, mask)
    plain = build_model(_model_config(backbone), CLASSES).to(frames.device)
    with SavedTensorBytes(exclude=plain.parameters()) as one_chunk:
        plain.features(frames[:, :chunk], mask[:, :chunk])
    return feats.numel() * feats.element_size() + head.bytes + one_chunk.bytes


@dataclass
class MemoryRecord:
    backbone: str
    recompute: str
    frames: int
    size: int
    chunk: int
    peak_bytes: int  # tensor memory over the whole step, above what was allocated before it
    saved_bytes: int  # activations autograd keeps for backward, outside recompute; no parameters
    floor_bytes: int  # T x (features + RNN saved state) + one chunk's full CNN activations
    step_seconds: float
    device: str


def bench_case(
    backbone: str, recompute: Recompute, frames: int, size: int, chunk: int, device: torch.device
) -> MemoryRecord:
    model = bench_model(backbone, recompute, chunk, device)
    x, mask, labels = random_sequence(frames, size, device)
    cost = measure_step(model, x, mask, labels)
    floor = floor_bytes(backbone, model, x, mask, chunk)
    return MemoryRecord(
        backbone,
        recompute.value,
        frames,
        size,
        chunk,
        cost.peak_bytes,
        cost.saved_bytes,
        floor,
        cost.seconds,
        str(device),
    )


@dataclass(frozen=True)
class MemoryBench:
    """One ``bench memory`` run: its options, as the command line gives them."""

    backbone: str
    frames: list[int]
    size: int
    chunk: int
    recompute: list[str]
    json: bool


def bench_memory(args: MemoryBench) -> list[MemoryRecord]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    records = []
    if not args.json:
        print(f"{args.backbone}+LSTM, {args.size}px, chunk {args.chunk}, one sequence, {device}")
        print(
            f"{'T':>6} {'recompute':>10} {'peak MiB':>10} {'saved MiB':>10} {'floor MiB':>10} "
            f"{'step s':>8} {'peak/first':>10} {'time/first':>10}"
        )
    for frames in args.frames:
        first: MemoryRecord | None = None
        for name in args.recompute:
            rec = bench_case(args.backbone, Recompute(name), frames, args.size, args.chunk, device)
            records.append(rec)
            if args.json:
                print(json.dumps(asdict(rec)), flush=True)
                continue
            first = first or rec
            print(
                f"{frames:>6} {name:>10} {rec.peak_bytes / MIB:>10.1f} "
                f"{rec.saved_bytes / MIB:>10.1f} {rec.floor_bytes / MIB:>10.1f} "
                f"{rec.step_seconds:>8.2f} {rec.peak_bytes / first.peak_bytes:>10.3f} "
                f"{rec.step_seconds / first.step_seconds:>10.2f}",
                flush=True,
            )
    return records
