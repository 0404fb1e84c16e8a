"""A memory budget turned into the least recompute that fits: ``memory.budget``.

A short probe measures the run's own model at its own batch, frame size and device, on a few
frames: a step's peak with every chunk recomputed at two lengths (2k and 4k frames), and at the
longer one with every frame held, the bytes autograd saves in those last two, and their times.
For any T:

    peak(T, held) = fixed + T * per_frame + max(recompute, held_base + held * activation)
    time(T, held) = T * (forward + backward) + (T - held) * forward

``per_frame`` grows with T whatever the recompute (the frames, features, the RNN's saved state,
the logits and their gradients); ``activation`` is one frame's CNN activations, held from
forward to backward. The held frames are the last chunks of the sequence: backward reaches them
first and frees them before the first recompute, so the peak is the larger of the two, not
their sum (measured, ResNet-18 at 32 px, k=8, T=128: 67.7 MB with nothing held and with 8
frames held, then 0.46 MB more per frame held, up to 118.9 MB with all 128). ``fixed`` is the
parameters and their optimizer state, which exist outside a step (AdamW: two fp32 moments a
parameter; this rank's shard under FSDP).

Time falls with every frame held, so the plan holds as many whole chunks as fit: a closed form
per T, cheap enough to recompute whenever T changes (the last window, length buckets). The chunk
size is the smallest k whose CNN throughput is within 10% of the best measured, so that small
chunks do not starve a GPU.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch
from torch import nn

from distseq.config import parse_budget
from distseq.errors import ConfigError
from distseq.memory.chunked import ChunkedModel
from distseq.memory.measure import StepCost, measure_step

CHUNKS = (1, 2, 4, 8, 16, 32)  # chunk sizes the probe times
THROUGHPUT_SLACK = 0.9  # the smallest k with at least 90% of the best frames/s
GB = 10**9


@dataclass(frozen=True)
class Probe:
    """What the probe measured; bytes and seconds."""

    chunk_frames: int
    fixed_bytes: int  # parameters and optimizer state (resident_bytes)
    per_frame_bytes: float
    recompute_bytes: float  # the rest of a step's peak with every chunk recomputed
    held_base_bytes: float  # the rest of a step's peak with frames held, but for those frames
    activation_bytes: float  # one held frame's CNN activations
    forward_seconds: float  # CNN forward, per frame
    backward_seconds: float  # the rest of a plain step, per frame

    def as_tensor(self) -> torch.Tensor:
        """The numbers as one float64 tensor, to agree on across ranks."""
        return torch.tensor([getattr(self, f.name) for f in fields(self)], dtype=torch.float64)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> Probe:
        numbers = dict(zip((f.name for f in fields(cls)), values.tolist(), strict=True))
        numbers["chunk_frames"] = int(numbers["chunk_frames"])
        numbers["fixed_bytes"] = int(numbers["fixed_bytes"])
        return cls(**numbers)


@dataclass(frozen=True)
class Plan:
    probe: Probe
    budget_bytes: int

    def held_frames(self, frames: int) -> int:
        """Frames at the end of a T-frame sequence that hold their activations: whole chunks
        (chunks start at frame 0, so the last one may be short), as many as the budget allows."""
        p, k = self.probe, self.probe.chunk_frames
        room = self.budget_bytes - p.fixed_bytes - frames * p.per_frame_bytes - p.held_base_bytes
        fits = frames if p.activation_bytes <= 0 else int(room // p.activation_bytes)
        fits = max(0, min(frames, fits))
        first = min(frames, math.ceil((frames - fits) / k) * k)  # the first held chunk's start
        return frames - first

    def peak_bytes(self, frames: int, held: int | None = None) -> float:
        p = self.probe
        held = self.held_frames(frames) if held is None else held
        rest = max(p.recompute_bytes, p.held_base_bytes + held * p.activation_bytes)
        return p.fixed_bytes + frames * p.per_frame_bytes + rest

    def step_seconds(self, frames: int) -> float:
        p = self.probe
        recomputed = frames - self.held_frames(frames)
        return frames * (p.forward_seconds + p.backward_seconds) + recomputed * p.forward_seconds

    def check(self, frames: int) -> None:
        """Refuse, in one line, a T whose floor (every chunk recomputed) does not fit, saying
        what would."""
        floor = self.peak_bytes(frames, held=0)
        if floor <= self.budget_bytes:
            return
        p = self.probe
        room = self.budget_bytes - (floor - frames * p.per_frame_bytes)  # for the T-long part
        largest = int(room // p.per_frame_bytes)
        window = f"data.window <= {largest}, " if largest >= 1 else ""
        raise ConfigError(
            f"config key memory.budget: {format_size(self.budget_bytes)} is below the "
            f"{format_size(floor)} that T={frames} needs with every chunk of {p.chunk_frames} "
            f"recomputed; fits: {window}a larger budget, or more ranks under FSDP "
            f"(parameters and optimizer state: {format_size(p.fixed_bytes)} here)"
        )

    def describe(self, frames: int) -> str:
        k = self.probe.chunk_frames
        chunks = math.ceil(frames / k)
        held = math.ceil(self.held_frames(frames) / k)
        recompute = 1 - self.held_frames(frames) / frames
        return (
            f"T={frames} chunk={k}: {held}/{chunks} chunks kept; predicted peak "
            f"{format_size(self.peak_bytes(frames))} of {format_size(self.budget_bytes)}, "
            f"recompute {recompute:.0%} of forward FLOPs"
        )


def format_size(nbytes: float) -> str:
    """Bytes for people: GB from 0.1 GB up, else MB."""
    return f"{nbytes / GB:.3g} GB" if nbytes >= GB / 10 else f"{nbytes / 10**6:.3g} MB"


def budget_bytes(text: str, device: torch.device) -> int:
    """``memory.budget`` in bytes; a fraction is of the device's total memory."""
    budget = parse_budget(text)
    if isinstance(budget, int):
        return budget
    if device.type != "cuda":
        raise ConfigError(
            f"config key memory.budget={text!r}: a fraction is of a GPU's memory, and this run "
            f"is on {device.type}; give bytes, e.g. 2GB"
        )
    return int(budget * torch.cuda.get_device_properties(device).total_memory)


def resident_bytes(model: nn.Module) -> int:
    """This rank's parameters (its shard under FSDP2) and AdamW's two fp32 moments for them:
    memory that exists before a step begins, so a step's measured peak does not count it."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * (local.element_size() + 2 * 4)
    return total


def _chunk_size(
    model: nn.Module, chunked: ChunkedModel, frames: Callable[[int], torch.Tensor], window: int
) -> int:
    """The smallest k in CHUNKS whose plain forward and backward reach 90% of the best frames/s
    (a k-frame sequence, held whole: no recompute). The probe then runs 4k frames: k is at most
    a quarter of the window, so that the probe never runs more frames than training does."""
    rates = {}
    for k in [k for k in CHUNKS if 4 * k <= window] or [min(CHUNKS)]:
        x = frames(k)
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        chunked.keep_frames = k
        for _ in range(2):  # the first run warms up (allocator, cuDNN autotuning)
            _sync(x.device)
            start = time.perf_counter()
            model(x, mask).float().sum().backward()
            _sync(x.device)
        rates[k] = x.shape[0] * k / (time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    best = max(rates.values())
    return min(k for k, rate in rates.items() if rate >= THROUGHPUT_SLACK * best)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def _left_as_it_was(
    model: nn.Module, chunked: ChunkedModel, device: torch.device
) -> Iterator[None]:
    """Put back what probing changes: BatchNorm buffers, the global RNG (dropout draws), the
    chunking, and the gradients."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        buffers = [b.detach().clone() for b in chunked.buffers()]
        saved = (chunked.chunk_frames, chunked.keep_frames, chunked.plan)
        chunked.plan = None
        try:
            yield
        finally:
            chunked.chunk_frames, chunked.keep_frames, chunked.plan = saved
            with torch.no_grad():
                for b, was in zip(chunked.buffers(), buffers, strict=True):
                    b.copy_(was)
            model.zero_grad(set_to_none=True)


def probe(
    model: nn.Module,
    chunked: ChunkedModel,
    batch_size: int,
    size: int,
    classes: int,
    window: int,
    device: torch.device,
    frames_on_host: bool = False,
) -> Probe:
    """Measure ``model`` (``chunked``, or it wrapped for FSDP/DDP) on random frames, and leave
    both as they were. ``frames_on_host``: memory.offload=frames, the frames stay in (pinned)
    host memory and cost the device nothing per frame."""
    g = torch.Generator().manual_seed(0)

    def frames(t: int) -> torch.Tensor:
        x = torch.randint(0, 256, (batch_size, t, 3, size, size), generator=g, dtype=torch.uint8)
        if frames_on_host:
            return x.pin_memory() if device.type == "cuda" else x
        return x.to(device)

    def step(t: int, keep: int) -> StepCost:
        chunked.keep_frames = keep
        x = frames(t)
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=device)
        labels = torch.randint(0, classes, x.shape[:2], generator=g).to(device)
        return measure_step(model, x, mask, labels)

    with _left_as_it_was(model, chunked, device):
        chunked.chunk_frames = max(CHUNKS)  # one chunk per timed sequence
        k = _chunk_size(model, chunked, frames, window)
        chunked.chunk_frames = k
        short, long = 2 * k, 4 * k
        recomputed_short = step(short, 0)
        recomputed = step(long, 0)
        plain = step(long, long)
    in_step = (recomputed.peak_bytes - recomputed_short.peak_bytes) / (long - short)
    # What autograd saves outside recompute, exactly: a held frame adds its CNN's saved tensors.
    activation = max(0.0, (plain.saved_bytes - recomputed.saved_bytes) / long)
    forward = max(0.0, (recomputed.seconds - plain.seconds) / long)
    return Probe(
        chunk_frames=k,
        fixed_bytes=resident_bytes(model),
        # The frames are on the device before a step begins, so its peak does not count them,
        # unless they are kept in host memory.
        per_frame_bytes=in_step + (0 if frames_on_host else batch_size * 3 * size * size),
        recompute_bytes=recomputed.peak_bytes - long * in_step,
        held_base_bytes=plain.peak_bytes - long * in_step - long * activation,
        activation_bytes=activation,
        forward_seconds=forward,
        backward_seconds=max(0.0, plain.seconds / long - forward),
    )
