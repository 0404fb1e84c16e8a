"""A memory budget turned into the least recompute that fits: the arithmetic of ``memory.budget``.

It starts from what the probe (memory.probe) measured of the run's own model, a :class:`Probe`,
and never runs the model itself.

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
last window, length buckets).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from distseq.data.batch import slices
from distseq.errors import ConfigError
from distseq.memory.chunked import NOTHING, WHOLE, ChunkedModel, Hold
from distseq.memory.probe import CHUNKS, Probe
from distseq.units import format_size


@dataclass(frozen=True)
class Level:
    """One way to run a chunk that is not among the last ones kept whole; per frame."""

    hold: Hold  # what the chunk keeps (memory.chunked)
    bytes: float  # held from forward to backward
    seconds: float  # recomputed in backward
    recompute_bytes: float  # the recompute's own peak, beyond what is held


def levels(p: Probe) -> list[Level]:
    """The ways to run a chunk that the probe measured, from every activation recomputed to the
    whole chunk kept."""
    staged = zip(p.stage_bytes, p.stage_seconds, p.stage_recompute_bytes, strict=True)
    return [
        Level(NOTHING, 0.0, p.forward_seconds, p.recompute_bytes),
        *(Level(Hold(h), b, s, r) for h, (b, s, r) in enumerate(staged, start=1)),
        Level(WHOLE, p.activation_bytes, 0.0, 0.0),
    ]


@dataclass(frozen=True)
class Layout:
    """What one T-frame step does: each chunk's hold, its predicted peak and time."""

    holds: tuple[Hold, ...]
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
        if lo_frames < self.rest and not hi.hold.whole:  # whole chunks are not recomputed
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
    # A sequence split of this many ranks (parallel.sequence): each runs and holds the frames of
    # its slice, t of the T, and the rest of the step (the gathered features, the head) whole.
    sequence: int = 1
    _layouts: dict[tuple[int, int], Layout] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def apply(self, model: ChunkedModel) -> None:
        """Run ``model`` by this plan from its next step on."""
        model.follow(self.probe.chunk_frames, list(self.stages), self.holds)

    def holds(self, frames: int, whole: int | None = None) -> list[Hold]:
        """Each chunk's hold for ``frames`` of a ``whole``-frame sequence (the same by default;
        a rank's slice under a split)."""
        return list(self.layout(frames, whole or frames).holds)

    def widest(self, frames: int) -> int:
        """The most frames one rank runs of a T-frame sequence: T, or the widest slice."""
        return max(b - a for a, b in slices(frames, self.probe.chunk_frames, self.sequence))

    # Of a T-frame step, on the rank with the widest slice:

    def peak_bytes(self, frames: int) -> float:
        return self.layout(self.widest(frames), frames).peak_bytes

    def step_seconds(self, frames: int) -> float:
        return self.layout(self.widest(frames), frames).seconds

    def base_bytes(self, frames: int, whole: int) -> float:
        """What no hold changes: the parameters and optimizer state, the frames a rank holds and
        the rest of the step, T-long."""
        p = self.probe
        return p.fixed_bytes + whole * (p.per_frame_bytes - p.frame_bytes) + frames * p.frame_bytes

    def floor_bytes(self, frames: int) -> float:
        """The peak with every chunk recomputed: the least any plan at this chunk size needs."""
        p = self.probe
        rest = max(p.recompute_bytes, p.held_base_bytes)
        return self.base_bytes(self.widest(frames), frames) + rest

    def top_bytes(self, frames: int) -> float:
        """The peak with every frame held: more than this saves no time."""
        p, t = self.probe, self.widest(frames)
        return self.base_bytes(t, frames) + t * p.activation_bytes + p.held_base_bytes

    def layout(self, frames: int, whole: int) -> Layout:
        if (frames, whole) not in self._layouts:
            self._layouts[frames, whole] = self._search(frames, whole)
        return self._layouts[frames, whole]

    def _search(self, frames: int, whole: int) -> Layout:
        p, k = self.probe, self.probe.chunk_frames
        n = math.ceil(frames / k)
        hull = _lower_hull(levels(p))
        pairs = list(itertools.pairwise(hull)) or [(hull[0], hull[0])]
        base = self.base_bytes(frames, whole)
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
                    holds = [lo.hold] * (chunks - low) + [hi.hold] * low + [WHOLE] * w
                    best = Layout(tuple(holds), peak, seconds)
        if best is None:  # not even the floor fits: check() says so
            floor = hull[0]
            seconds = plain + frames * floor.seconds
            peak = base + max(p.recompute_bytes, p.held_base_bytes)
            best = Layout((floor.hold,) * n, peak, seconds)
        return best

    def check(self, frames: int) -> None:
        """Refuse, in one line, a T whose floor (every chunk recomputed) does not fit, saying
        what would."""
        floor = self.floor_bytes(frames)
        if floor <= self.budget_bytes:
            return
        p = self.probe
        # What a frame more of T costs: the rest of the step, and a share of a frame held.
        grows = p.per_frame_bytes - p.frame_bytes * (1 - 1 / self.sequence)
        room = self.budget_bytes - (floor - frames * grows)  # for the T-long part
        largest = int(room // grows)
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
        p, t = self.probe, self.widest(frames)
        layout = self.layout(t, frames)
        counts, stages = Counter(layout.holds), len(p.stage_bytes) + 1
        # People count stages from 1, the stem's: Hold(h) keeps stages h + 1 to the last.
        held = [
            f"{counts[Hold(h)]} {'holds' if counts[Hold(h)] == 1 else 'hold'} "
            f"{f'stage {stages}' if h + 1 == stages else f'stages {h + 1}-{stages}'} of {stages} "
            f"(from {self.stages[h - 1]})"
            for h in range(1, stages)
            if counts[Hold(h)]
        ]
        if counts[NOTHING]:
            held.append(
                f"{counts[NOTHING]} {'recomputes' if counts[NOTHING] == 1 else 'recompute'} all"
            )
        rest = f", {' and '.join(held)}" if held else ""
        forward = t * p.forward_seconds
        recompute = (layout.seconds - t * (p.forward_seconds + p.backward_seconds)) / forward
        sliced = f" in slices of up to {t} on {self.sequence} ranks" if self.sequence > 1 else ""
        return (
            f"T={frames}{sliced} chunk={p.chunk_frames}: {counts[WHOLE]}/{len(layout.holds)} "
            "chunks kept"
            f"{rest}; predicted peak {format_size(layout.peak_bytes)} of "
            f"{format_size(self.budget_bytes)}, recompute {recompute:.0%} of forward time"
        )


def fit(
    plan_at: Callable[[int], Plan], first: int, frames: int, say: Callable[[str], None]
) -> Plan:
    """The plan for T=``frames`` at chunks of ``first`` frames or, where even its floor does not
    fit, at the largest smaller size of CHUNKS whose floor does, each probed anew
    (``plan_at(k)``): a smaller chunk recomputes a smaller piece at a time, and runs at its own,
    lower, speed. Refuses in one line (Plan.check) when the smallest does not fit either, and at
    once, without probing smaller chunks, when what no chunk size changes does not fit: the
    parameters and optimizer state and the T-long part of the step."""
    k = first
    while True:
        plan = plan_at(k)
        floor = plan.floor_bytes(frames)
        smaller = [c for c in CHUNKS if c < k]
        hopeless = plan.base_bytes(plan.widest(frames), frames) > plan.budget_bytes
        if floor <= plan.budget_bytes or not smaller or hopeless:
            plan.check(frames)
            return plan
        say(
            f"memory plan: chunk={k} needs {format_size(floor)} at T={frames} with every chunk "
            f"recomputed, above the budget of {format_size(plan.budget_bytes)}; probing smaller "
            "chunks"
        )
        k = max(smaller)
