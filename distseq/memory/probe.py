"""The probe behind ``memory.budget``: the run's own model measured on a few random frames.

At the run's own batch, frame size and device (a :class:`RunShape`), it measures a step's peak
with every chunk recomputed at two lengths (2k and 4k frames), with every frame held, and with
each stage split (memory.stages) holding its late stages, at both lengths; the bytes autograd
saves; and the CNN's forward time a frame up to each stage's start, timed within the same
forwards. What it measured is a :class:`memory.plan.Probe`, all the plan works from.

It measures at the chunk size it is given: no timing decides k, so that the same config plans
the same chunks whatever the machine's load (the chunk size is part of the model under
BatchNorm, whose statistics are per chunk).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch
from torch import nn

from distseq.config import Recompute
from distseq.memory.chunked import NOTHING, WHOLE, ChunkedModel, Hold
from distseq.memory.measure import StepCost, measure_step, synchronize
from distseq.memory.stages import stage_starts
from distseq.model.frames import FrameInput, frame_hw

TIMINGS = 3  # timed runs of the forward, after a warm-up


CHUNKS = (1, 2, 4, 8, 16, 32)  # the chunk sizes a plan falls back to when the floor is too high
_STAGE_FIELDS = ("stage_bytes", "stage_seconds", "stage_recompute_bytes")


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
    # The part of per_frame_bytes that is the batch's frames on the device: under a sequence
    # split a rank holds its slice's alone (0 in a plan recorded before splits: all T-long).
    frame_bytes: float = 0.0
    # Per stage split h = 1 .. stages: the held bytes and recomputed seconds of a frame whose
    # stages from h on are held, and the rest of that step's peak beyond the held bytes of the
    # chunks not yet recomputed, the recomputing one's included.
    stage_bytes: tuple[float, ...] = ()
    stage_seconds: tuple[float, ...] = ()
    stage_recompute_bytes: tuple[float, ...] = ()

    def as_tensor(self) -> torch.Tensor:
        """The numbers as one float64 tensor, to agree on across ranks."""
        scalars = [getattr(self, f.name) for f in fields(self) if f.name not in _STAGE_FIELDS]
        staged = [x for name in _STAGE_FIELDS for x in getattr(self, name)]
        return torch.tensor(scalars + staged, dtype=torch.float64)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> Probe:
        names = [f.name for f in fields(cls) if f.name not in _STAGE_FIELDS]
        numbers = values.tolist()
        scalars: dict[str, float | int | tuple[float, ...]] = dict(
            zip(names, numbers[: len(names)], strict=True)
        )
        scalars["chunk_frames"] = int(numbers[0])
        scalars["fixed_bytes"] = int(numbers[1])
        staged = numbers[len(names) :]
        n = len(staged) // len(_STAGE_FIELDS)
        for i, name in enumerate(_STAGE_FIELDS):
            scalars[name] = tuple(staged[i * n : (i + 1) * n])
        return cls(**scalars)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RunShape:
    """What a training step of the run looks like, as far as its memory and time go."""

    batch_size: int  # sequences per rank per micro-step
    size: int | tuple[int, int]  # frames are size x size, or (H, W)
    num_classes: int
    window: int  # T, frames per training window
    device: torch.device
    # memory.offload=frames: the frames stay in (pinned) host memory and cost the device nothing
    # per frame.
    frames_on_host: bool = False
    channels: int = 3
    sequence: int = 1  # the ranks each sequence is split across (parallel.sequence)

    def frame_bytes(self, given: FrameInput) -> int:
        """One frame's bytes as the model takes it (uint8: 1 a value, float: 4)."""
        height, width = frame_hw(self.size)
        return self.channels * height * width * (1 if given.dtype == "uint8" else 4)


def resident_bytes(model: nn.Module) -> int:
    """This rank's parameters (its shard under FSDP2) and AdamW's two fp32 moments for those
    that train (a part frozen for the whole run has ``requires_grad`` off, and no moments):
    memory that exists before a step begins, so a step's measured peak does not count it. A part
    frozen for some steps counts as training: its moments exist once it trains."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * (local.element_size() + (2 * 4 if p.requires_grad else 0))
    return total


def _forward_backward(model: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> None:
    model(x, mask).float().sum().backward()


def _forward_seconds(
    model: nn.Module, chunked: ChunkedModel, x: torch.Tensor, chunk: int
) -> list[float]:
    """Seconds a frame of the CNN's forward takes before each stage from the second on begins,
    and in all (the last entry): what a recompute that holds from that stage on still runs.

    Timed within the forwards of steps on ``x`` (every chunk held, as in a recompute), from the
    backbone's start to each stage's start and to its end, summed over the chunks and over
    TIMINGS runs after a warm-up. The stages of one forward are timed against each other, so
    they never reorder. Timing each split as a step of its own, and the forward as the
    difference of two steps, did: on the CPU's noise of a few percent of a step, holding more
    looked slower than holding less, and the forward of ResNet-18 at 64 px (k=8) came out
    0.8 ms a frame in one probe and 2.8 in the next.
    """
    marks: list[tuple[int, float]] = []
    end = len(chunked.stages) + 1

    def mark(stage: int) -> Callable[..., None]:
        # Run as it is, outside a compiled backbone's graph (model.compile): traced, the list
        # it appends to would be a guard that fails on every call, one recompile each.
        @torch._dynamo.disable  # type: ignore[untyped-decorator, unused-ignore]
        def hook(*args: object) -> None:
            synchronize(x.device)
            marks.append((stage, time.perf_counter()))

        return hook

    backbone = chunked.backbone
    hooks = [backbone.register_forward_pre_hook(mark(0)), backbone.register_forward_hook(mark(end))]
    hooks += [
        backbone.get_submodule(name).register_forward_pre_hook(mark(i))
        for i, name in enumerate(chunked.stages, start=1)
    ]
    mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    whole = chunked.holding(chunk, lambda frames, _: [WHOLE] * math.ceil(frames / chunk))
    try:
        with whole:
            for run in range(1 + TIMINGS):
                if run == 1:
                    marks.clear()  # the first run warms up
                # With its backward: a sharded model's forward alone leaves the parameters
                # gathered, and an optimizer built next would hold the gathered ones.
                _forward_backward(model, x, mask)
    finally:
        for hook in hooks:
            hook.remove()
    before = [0.0] * (end + 1)
    start = 0.0
    for stage, at in marks:
        start = at if stage == 0 else start
        before[stage] += at - start
    frames = TIMINGS * x.shape[1]
    return [seconds / frames for seconds in before[1:]]


@contextmanager
def _left_as_it_was(
    model: nn.Module, chunked: ChunkedModel, device: torch.device
) -> Iterator[None]:
    """Put back what probing changes in passing: BatchNorm buffers, the global RNG (dropout
    draws) and the gradients. (The chunking it runs by is the model's to put back:
    ChunkedModel.holding.) Every rank runs the probe's frames whole, split or not."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), chunked.unsplit():
        buffers = [b.detach().clone() for b in chunked.buffers()]
        try:
            yield
        finally:
            with torch.no_grad():
                for b, was in zip(chunked.buffers(), buffers, strict=True):
                    b.copy_(was)
            model.zero_grad(set_to_none=True)


def first_chunk(chunk_frames: int, window: int) -> int:
    """The chunk size a plan starts from: memory.chunk_frames, or where 4 of them would be more
    than data.window, the largest of CHUNKS that is not (the probe runs 4k frames, and should
    never run more than training does)."""
    if 4 * chunk_frames <= window:
        return chunk_frames
    return max([c for c in CHUNKS if 4 * c <= window], default=min(CHUNKS))


def probe(model: nn.Module, chunked: ChunkedModel, shape: RunShape, chunk: int) -> Probe:
    """Measure ``model`` (``chunked``, or it wrapped for FSDP/DDP) on random frames of ``shape``
    in chunks of ``chunk`` frames, and leave both as they were, but for the stages it finds
    (ChunkedModel.hold_stages)."""
    g, device, size = torch.Generator().manual_seed(0), shape.device, shape.size

    def frames(t: int) -> torch.Tensor:
        dims = (shape.batch_size, t, shape.channels, *frame_hw(size))
        x = chunked.input.random(dims, g, torch.device("cpu"))
        if shape.frames_on_host:
            return x.pin_memory() if device.type == "cuda" else x
        return x.to(device)

    def step(t: int, hold: Hold, timings: int = 1) -> StepCost:
        x = frames(t)
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=device)
        labels = torch.randint(0, shape.num_classes, x.shape[:2], generator=g).to(device)
        with chunked.holding(chunk, lambda frames, _: [hold] * math.ceil(frames / chunk)):
            return measure_step(model, x, mask, labels, timings)

    with _left_as_it_was(model, chunked, device):
        # Holding stages takes non-reentrant checkpoint's early stop, which fairscale has not,
        # and hooks that a compiled backbone does not run (ChunkedModel.compile_backbone).
        stages = chunked.recompute is Recompute.torch and not chunked.compiled
        starts = (
            stage_starts(model, chunked.backbone, size, device, chunked.input, shape.channels)
            if stages
            else []
        )
        chunked.hold_stages(starts)
        k = chunk
        short, long = 2 * k, 4 * k
        recomputed_short = step(short, NOTHING)
        recomputed = step(long, NOTHING)
        plain_short, plain = step(short, WHOLE), step(long, WHOLE, TIMINGS)
        # Held stages go to the chunk's own saved-tensor hooks, out of SavedTensorBytes' sight,
        # so their bytes come from the peak's growth between two lengths.
        holds = [Hold(h) for h in range(1, len(chunked.stages) + 1)]
        staged = [(step(short, hold), step(long, hold)) for hold in holds]
        *before_stages, forward = _forward_seconds(model, chunked, frames(long), k)

    def per_frame(at_short: StepCost, at_long: StepCost) -> float:
        return (at_long.peak_bytes - at_short.peak_bytes) / (long - short)

    in_step = per_frame(recomputed_short, recomputed)

    # A held frame's activations, from the peak's growth too: its saved tensors alone (what
    # SavedTensorBytes counts) came out 7 KB a frame short, and with 13 of 32 chunks kept a
    # plan's peak 2.8 MiB above its budget (ResNet-18, 64 px, T=1024).
    activation = max(0.0, per_frame(plain_short, plain) - in_step)
    on_device = 0 if shape.frames_on_host else shape.batch_size * shape.frame_bytes(chunked.input)
    return Probe(
        chunk_frames=k,
        fixed_bytes=resident_bytes(model),
        # The frames are on the device before a step begins, so its peak does not count them,
        # unless they are kept in host memory.
        per_frame_bytes=in_step + on_device,
        frame_bytes=on_device,
        recompute_bytes=recomputed.peak_bytes - long * in_step,
        held_base_bytes=plain.peak_bytes - long * in_step - long * activation,
        activation_bytes=activation,
        forward_seconds=forward,
        backward_seconds=max(0.0, plain.seconds / long - forward),
        stage_bytes=tuple(max(0.0, per_frame(*c) - in_step) for c in staged),
        stage_seconds=tuple(before_stages),
        # The step's peak comes at its second recompute, once the first chunk's backward has
        # made the parameter gradients, with 3 chunks' held bytes still there: after a kept
        # chunk, the first recompute has the gradients too. Counting the held bytes of 4 made
        # planned peaks 2.5 MiB (one chunk's held stage) above their budget in bench compare.
        stage_recompute_bytes=tuple(
            c[1].peak_bytes - long * in_step - (long - k) * max(0.0, per_frame(*c) - in_step)
            for c in staged
        ),
    )
