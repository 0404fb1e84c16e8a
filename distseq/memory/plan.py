"""A memory budget turned into the least recompute that fits: ``memory.budget``.

A short probe measures the run's own model at its own batch, frame size and device, on a few
frames: a step's peak with every chunk recomputed at two lengths (2k and 4k frames), with every
frame held, and with each stage split (memory.stages) holding its late stages, at both lengths;
the bytes autograd saves; and the CNN's forward time a frame up to each stage's start, timed
within the same forwards.

Each chunk but the last ones runs at a *level*: nothing held (every activation recomputed), the
stages from h on held (``bytes`` a frame, for ``seconds`` a frame of early stages recomputed), or
the whole chunk held. The last ``w`` chunks are kept whole: backward reaches them first and frees
them before the first recompute, so they cost the larger of their activations and one recompute,
not the sum (measured, ResNet-18 at 32 px, k=8, T=128: 67.7 MB with nothing held and with 8
frames held, then 0.46 MB more per frame held, up to 118.9 MB with all 128). For a T-frame step:

    peak = fixed + T * per_frame + the largest, over the moments of backward, of what is held then
           (the held base and kept activations at its start; at each chunk's recompute, the held
           bytes of the chunks not yet done and that recompute's own peak; see _Split)
    time = T * (forward + backward) + sum(recompute seconds)

``per_frame`` grows with T whatever is held (the frames, features, the RNN's saved state, the
logits and their gradients); ``fixed`` is the parameters and their optimizer state (AdamW: two
fp32 moments a parameter; this rank's shard under FSDP).

The search is exhaustive over ``w`` and, for the other chunks, takes two neighbouring levels on
the lower convex hull of (bytes, seconds): for identical chunks under one byte budget the best
mix uses at most two levels, and only hull levels, so the plan is optimal up to whole chunks
and the levels' own recompute peaks, which the hull leaves out. It takes a few milliseconds per
T (4 ms for T=10,000 in chunks of 16) and is cached, so it runs again whenever T changes (the
last window, length buckets). The chunk size is the smallest k whose CNN throughput is within 10% of
the best measured, so that small chunks do not starve a GPU.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import torch
from torch import nn

from distseq.config import Recompute, parse_budget
from distseq.errors import ConfigError
from distseq.memory.chunked import ChunkedModel
from distseq.memory.measure import StepCost, fastest_seconds, measure_step, synchronize
from distseq.memory.stages import stage_starts

CHUNKS = (1, 2, 4, 8, 16, 32)  # chunk sizes the probe times
THROUGHPUT_SLACK = 0.9  # the smallest k with at least 90% of the best frames/s
TIMINGS = 3  # timed runs per chunk size, after a warm-up
GB = 10**9
_STAGE_FIELDS = ("stage_bytes", "stage_seconds", "stage_recompute_bytes")


@dataclass(frozen=True)
class Level:
    """One way to run a chunk that is not among the last ones kept whole; per frame."""

    hold: int  # the chunk's hold (memory.chunked): 0 whole, 1.. late stages, last nothing
    bytes: float  # held from forward to backward
    seconds: float  # recomputed in backward
    recompute_bytes: float  # the recompute's own peak, beyond what is held


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
    # Per stage split h = 1 .. stages: the held bytes and recomputed seconds of a frame whose
    # stages from h on are held, and the rest of that step's peak beyond the held bytes of the
    # chunks not yet recomputed, the recomputing one's included.
    stage_bytes: tuple[float, ...] = ()
    stage_seconds: tuple[float, ...] = ()
    stage_recompute_bytes: tuple[float, ...] = ()

    def levels(self) -> list[Level]:
        nothing = len(self.stage_bytes) + 1
        staged = zip(self.stage_bytes, self.stage_seconds, self.stage_recompute_bytes, strict=True)
        return [
            Level(nothing, 0.0, self.forward_seconds, self.recompute_bytes),
            *(Level(h, b, s, r) for h, (b, s, r) in enumerate(staged, start=1)),
            Level(0, self.activation_bytes, 0.0, 0.0),
        ]

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
class Layout:
    """What one T-frame step does: each chunk's hold, its predicted peak and time."""

    holds: tuple[int, ...]
    peak_bytes: float
    seconds: float


@dataclass(frozen=True)
class _Split:
    """The chunks before the last ``kept`` frames, at two levels: ``lo`` first, then ``m`` at
    ``hi``. Backward recomputes them in reverse, so the hi chunks go first, with every held
    byte still there, and each lo chunk after the hi chunks have freed theirs. The peak above
    ``fixed + T * per_frame`` is the largest of:

    - the start of backward: the held base, the kept frames' activations, all held bytes;
    - the first hi chunk's recompute (if hi is recomputed): all held bytes and its own peak;
    - the first lo chunk's recompute: the lo chunks' held bytes and its own peak.

    The first two grow with m and the last shrinks, so the largest m that fits the first two
    is the best, if the last fits there.
    """

    probe: Probe
    lo: Level
    hi: Level
    kept: int
    rest: int  # frames in the chunks before the kept ones
    chunks: int

    def lo_frames(self, m: int) -> int:
        # Every chunk but the sequence's last is k frames long, so the lo chunks in front are.
        return min((self.chunks - m) * self.probe.chunk_frames, self.rest)

    def rising(self, m: int) -> float:
        lo, hi, p = self.lo, self.hi, self.probe
        lo_frames = self.lo_frames(m)
        held = lo_frames * lo.bytes + (self.rest - lo_frames) * hi.bytes
        peak = p.held_base_bytes + self.kept * p.activation_bytes + held
        if lo_frames < self.rest and hi.hold != 0:  # hold 0: whole chunks, not recomputed
            peak = max(peak, held + hi.recompute_bytes)
        return peak

    def falling(self, m: int) -> float:
        lo_frames = self.lo_frames(m)
        return lo_frames * self.lo.bytes + self.lo.recompute_bytes if lo_frames else 0.0


def _lower_hull(levels: list[Level]) -> list[Level]:
    """The levels that can be the best at some budget, by bytes: each faster than the one
    before, and below the line between its neighbours, so that no mix of two beats it."""
    hull: list[Level] = []
    for level in sorted(levels, key=lambda lv: (lv.bytes, lv.seconds)):
        if hull and level.seconds >= hull[-1].seconds:
            continue  # more bytes for no time saved
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            above = (b.seconds - a.seconds) * (level.bytes - a.bytes) >= (
                level.seconds - a.seconds
            ) * (b.bytes - a.bytes)
            if not above:
                break
            hull.pop()
        hull.append(level)
    return hull


@dataclass
class Plan:
    probe: Probe
    budget_bytes: int
    stages: tuple[str, ...] = ()  # where stages 2.. begin (memory.stages), for people
    _layouts: dict[int, Layout] = field(default_factory=dict, repr=False, compare=False)

    def apply(self, model: ChunkedModel) -> None:
        """Run ``model`` by this plan from its next step on."""
        model.chunk_frames = self.probe.chunk_frames
        model.hold_stages(list(self.stages))
        model.plan = self.holds

    def holds(self, frames: int) -> list[int]:
        return list(self.layout(frames).holds)

    def peak_bytes(self, frames: int) -> float:
        return self.layout(frames).peak_bytes

    def step_seconds(self, frames: int) -> float:
        return self.layout(frames).seconds

    def floor_bytes(self, frames: int) -> float:
        """The peak with every chunk recomputed: the least any plan at this chunk size needs."""
        p = self.probe
        rest = max(p.recompute_bytes, p.held_base_bytes)
        return p.fixed_bytes + frames * p.per_frame_bytes + rest

    def top_bytes(self, frames: int) -> float:
        """The peak with every frame held: more than this saves no time."""
        p = self.probe
        return p.fixed_bytes + frames * (p.per_frame_bytes + p.activation_bytes) + p.held_base_bytes

    def layout(self, frames: int) -> Layout:
        if frames not in self._layouts:
            self._layouts[frames] = self._search(frames)
        return self._layouts[frames]

    def _search(self, frames: int) -> Layout:
        p, k = self.probe, self.probe.chunk_frames
        n = math.ceil(frames / k)
        hull = _lower_hull(p.levels())
        pairs = list(itertools.pairwise(hull)) or [(hull[0], hull[0])]
        base = p.fixed_bytes + frames * p.per_frame_bytes
        room = self.budget_bytes - base
        plain = frames * (p.forward_seconds + p.backward_seconds)
        best = None
        kept = 0  # frames in the last w chunks, kept whole
        for w in range(n + 1):
            kept += 0 if w == 0 else min(k, frames - (n - w) * k)
            rest, chunks = frames - kept, n - w
            for lo, hi in pairs:
                split = _Split(p, lo, hi, kept, rest, chunks)
                if split.rising(0) > room:
                    continue
                low, high = 0, chunks  # the most chunks at hi whose rising terms fit
                while low < high:
                    mid = (low + high + 1) // 2
                    low, high = (mid, high) if split.rising(mid) <= room else (low, mid - 1)
                if split.falling(low) > room:
                    continue
                peak = base + max(split.rising(low), split.falling(low))
                hi_frames = rest - split.lo_frames(low)
                seconds = plain + hi_frames * hi.seconds + (rest - hi_frames) * lo.seconds
                if best is None or (seconds, peak) < (best.seconds, best.peak_bytes):
                    holds = [lo.hold] * (chunks - low) + [hi.hold] * low + [0] * w
                    best = Layout(tuple(holds), peak, seconds)
        if best is None:  # not even the floor fits: check() says so
            floor = hull[0]
            seconds = plain + frames * floor.seconds
            best = Layout((floor.hold,) * n, self.floor_bytes(frames), seconds)
        return best

    def check(self, frames: int) -> None:
        """Refuse, in one line, a T whose floor (every chunk recomputed) does not fit, saying
        what would."""
        floor = self.floor_bytes(frames)
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
        """One line: what is kept and held, the predicted peak, and the share of forward time
        that is recomputed."""
        p, layout = self.probe, self.layout(frames)
        counts, stages = Counter(layout.holds), len(p.stage_bytes) + 1
        held = [
            f"{counts[h]} {'holds' if counts[h] == 1 else 'hold'} "
            f"{f'stage {stages}' if h + 1 == stages else f'stages {h + 1}-{stages}'} of {stages} "
            f"(from {self.stages[h - 1]})"
            for h in sorted(counts)
            if 0 < h < stages
        ]
        if counts[stages]:
            held.append(
                f"{counts[stages]} {'recomputes' if counts[stages] == 1 else 'recompute'} all"
            )
        rest = f", {' and '.join(held)}" if held else ""
        forward = frames * p.forward_seconds
        recompute = (layout.seconds - frames * (p.forward_seconds + p.backward_seconds)) / forward
        return (
            f"T={frames} chunk={p.chunk_frames}: {counts[0]}/{len(layout.holds)} chunks kept"
            f"{rest}; predicted peak {format_size(layout.peak_bytes)} of "
            f"{format_size(self.budget_bytes)}, recompute {recompute:.0%} of forward time"
        )


def fit(plan_at: Callable[[int], Plan], frames: int, say: Callable[[str], None]) -> Plan:
    """The plan for T=``frames`` at the probe's chunk size or, where even its floor does not
    fit, at the largest smaller one whose floor does, each probed anew (``plan_at(largest)``):
    a smaller chunk recomputes a smaller piece at a time, and runs at its own, lower, speed.
    Refuses in one line (Plan.check) when the smallest does not fit either."""
    largest = max(CHUNKS)
    while True:
        plan = plan_at(largest)
        k, floor = plan.probe.chunk_frames, plan.floor_bytes(frames)
        smaller = [c for c in CHUNKS if c < k]
        if floor <= plan.budget_bytes or not smaller:
            plan.check(frames)
            return plan
        say(
            f"memory plan: chunk={k} needs {format_size(floor)} at T={frames} with every chunk "
            f"recomputed, above the budget of {format_size(plan.budget_bytes)}; probing smaller "
            "chunks"
        )
        largest = max(smaller)


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
    model: nn.Module,
    chunked: ChunkedModel,
    frames: Callable[[int], torch.Tensor],
    window: int,
    largest: int,
) -> int:
    """The smallest k in CHUNKS, up to ``largest``, whose plain forward and backward reach 90% of
    the best frames/s (a k-frame sequence, held whole: no recompute). The probe then runs 4k
    frames: k is at most a quarter of the window, so that the probe never runs more frames than
    training does."""
    rates = {}
    for k in [k for k in CHUNKS if 4 * k <= window and k <= largest] or [min(CHUNKS)]:
        x = frames(k)
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        chunked.keep_frames = k
        step = functools.partial(_forward_backward, model, x, mask)
        step()  # warm-up: allocator, cuDNN autotuning
        # The fastest of a few runs: one run each flipped the choice between neighbouring
        # sizes on this CPU.
        rates[k] = x.shape[0] * k / fastest_seconds(step, x.device, TIMINGS)
        model.zero_grad(set_to_none=True)
    best = max(rates.values())
    return min(k for k, rate in rates.items() if rate >= THROUGHPUT_SLACK * best)


def _forward_backward(model: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> None:
    model(x, mask).float().sum().backward()


def _forward_seconds(model: nn.Module, chunked: ChunkedModel, x: torch.Tensor) -> list[float]:
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
    chunked.plan = lambda frames: [0] * math.ceil(frames / chunked.chunk_frames)
    mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    try:
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
    largest: int = max(CHUNKS),
) -> Probe:
    """Measure ``model`` (``chunked``, or it wrapped for FSDP/DDP) on random frames, and leave
    both as they were, but for the stages it finds (ChunkedModel.hold_stages).
    ``frames_on_host``: memory.offload=frames, the frames stay in (pinned) host memory and cost
    the device nothing per frame. ``largest``: the largest chunk size to consider."""
    g = torch.Generator().manual_seed(0)

    def frames(t: int) -> torch.Tensor:
        x = torch.randint(0, 256, (batch_size, t, 3, size, size), generator=g, dtype=torch.uint8)
        if frames_on_host:
            return x.pin_memory() if device.type == "cuda" else x
        return x.to(device)

    def step(t: int, hold: int, timings: int = 1) -> StepCost:
        chunked.plan = lambda frames: [hold] * math.ceil(frames / chunked.chunk_frames)
        x = frames(t)
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=device)
        labels = torch.randint(0, classes, x.shape[:2], generator=g).to(device)
        return measure_step(model, x, mask, labels, timings)

    with _left_as_it_was(model, chunked, device):
        # Holding stages takes non-reentrant checkpoint's early stop, which fairscale has not.
        torch_backend = chunked.recompute is Recompute.torch
        starts = stage_starts(model, chunked.backbone, size, device) if torch_backend else []
        chunked.hold_stages(starts)
        nothing = len(chunked.stages) + 1
        chunked.chunk_frames = max(CHUNKS)  # one chunk per timed sequence
        k = _chunk_size(model, chunked, frames, window, largest)
        chunked.chunk_frames = k
        short, long = 2 * k, 4 * k
        recomputed_short = step(short, nothing)
        recomputed = step(long, nothing)
        plain_short, plain = step(short, 0), step(long, 0, TIMINGS)
        # Held stages go to the chunk's own saved-tensor hooks, out of SavedTensorBytes' sight,
        # so their bytes come from the peak's growth between two lengths.
        staged = [(step(short, hold), step(long, hold)) for hold in range(1, nothing)]
        *before_stages, forward = _forward_seconds(model, chunked, frames(long))

    def per_frame(at_short: StepCost, at_long: StepCost) -> float:
        return (at_long.peak_bytes - at_short.peak_bytes) / (long - short)

    in_step = per_frame(recomputed_short, recomputed)

    # A held frame's activations, from the peak's growth too: its saved tensors alone (what
    # SavedTensorBytes counts) came out 7 KB a frame short, and with 13 of 32 chunks kept a
    # plan's peak 2.8 MiB above its budget (ResNet-18, 64 px, T=1024).
    activation = max(0.0, per_frame(plain_short, plain) - in_step)
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
