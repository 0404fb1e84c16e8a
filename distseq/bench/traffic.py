"""``distseq bench traffic``: what one training step sends between ranks, at each world size,
chunk count and parallel mode, against what the parameter count predicts; and the step's time.

Each world size is a real ``torchrun`` group on this host (gloo on CPU, NCCL on GPUs). Every
rank trains one step to warm up, three timed (the median is kept, the slowest rank's reported),
then one counted by ``CollectiveCounter`` (the count slows the step, so it is not a timed one).
Bytes are per rank and per step, as the counter measures them: each collective's full buffer
(an all-gather's output, a reduce-scatter's input, an all-reduce's tensor). ``wire`` is what a
ring algorithm moves over one rank's link for those buffers, (W-1)/W of an all-gather's or a
reduce-scatter's and 2(W-1)/W of an all-reduce's: the figure that the cost model of
docs/benchmarks.md divides by a link's bandwidth.

``predicted`` comes from the parameter count alone. DDP all-reduces every gradient once: 4 P
bytes in fp32. FSDP2, as ``parallel.parallelize`` wraps the model, gathers the root unit (the
backbone and the model's own parameters) once per step and the head twice (it is resharded
after the forward), and reduce-scatters every gradient once; each parameter is padded to a
multiple of W rows first; alone (W = 1) it sends nothing. A sequence split over S ranks
(``parallel.sequence``) adds one all-gather of the features in forward, S slices of the widest
slice's B x t x F fp32 values, and nothing in backward. What is left over is the loss's and
the gradient norm's scalars.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from distseq.bench.collectives import CollectiveCounter
from distseq.bench.memory import bench_model
from distseq.config import Recompute
from distseq.data.batch import Batch, slices
from distseq.errors import ConfigError, TrainingError
from distseq.memory.chunked import ChunkedModel
from distseq.memory.measure import peak_memory
from distseq.parallel import (
    SIGNATURE_BYTES,
    DistInfo,
    all_gather_objects,
    close_distributed,
    init_distributed,
    parallelize,
)
from distseq.train.step import clip_grad_norm, train_step
from distseq.units import MIB

_RING = {"all_gather": 1.0, "reduce_scatter": 1.0, "all_reduce": 2.0}


@dataclass
class TrafficBench:
    backbone: str = "resnet18"
    size: int = 64
    frames: int = 16
    chunks: list[int] = field(default_factory=lambda: [1, 4])  # chunks per sequence (T/k)
    worlds: list[int] = field(default_factory=lambda: [1, 2, 4, 6])
    modes: list[str] = field(default_factory=lambda: ["fsdp", "ddp"])
    sequences: list[int] = field(default_factory=lambda: [1, 2])  # S; those dividing a world
    # memory.recompute, one run each: "none" holds every chunk's activations
    recompute: list[str] = field(default_factory=lambda: ["torch"])
    json: bool = False


@dataclass
class TrafficRecord:
    mode: str
    world: int
    chunks: int
    parameters: int
    counts: dict[str, int]  # collectives per kind
    bytes: dict[str, int]  # bytes per kind, per rank
    total_bytes: int
    predicted_bytes: int  # from the parameter count
    wire_bytes: float  # over one rank's link, ring algorithms
    step_seconds: float  # the slowest rank's median of three uncounted steps
    sequence: int = 1  # S: each sequence split across S ranks
    # The largest rank's frames and its step's peak above them (memory.measure).
    peak_bytes: int = 0
    recompute: str = "torch"  # memory.recompute


def feature_bytes(model: ChunkedModel, frames: int, sequence: int, batch: int = 1) -> int:
    """Bytes per rank per step of a sequence split's feature all-gather: S slices, each padded
    to the widest, of B x t x F fp32 values, each after its rank's signature (what the ranks of
    a group check they hold alike: parallel/sequence.py)."""
    if sequence == 1:
        return 0
    widest = max(b - a for a, b in slices(frames, model.chunk_frames, sequence))
    return sequence * (4 * batch * widest * (model.feature_dim or 0) + SIGNATURE_BYTES)


def predicted_bytes(model: nn.Module, mode: str, world: int) -> int:
    """Bytes per rank per step of the parameter collectives, from the parameter count alone."""
    if mode == "ddp":
        return sum(4 * p.numel() for p in model.parameters())
    if world == 1:
        return 0  # FSDP2 alone in its group gathers and reduces nothing

    def padded(module: nn.Module, skip: nn.Module | None = None) -> int:
        skipped = {id(p) for p in skip.parameters()} if skip is not None else set()
        total = 0
        for p in module.parameters():
            if id(p) not in skipped:
                rows = -(-p.shape[0] // world) * world if p.dim() else 1
                total += 4 * rows * (p.numel() // max(p.shape[0], 1) if p.dim() else 1)
        return total

    head = model.get_submodule("head")
    root, head_bytes = padded(model, skip=head), padded(head)
    gathered = root + 2 * head_bytes  # the head is resharded after the forward, gathered again
    return gathered + root + head_bytes  # + every gradient reduce-scattered once


def wire_bytes(sizes: dict[str, int], world: int) -> float:
    return sum(_RING.get(kind, 1.0) * n * (world - 1) / world for kind, n in sizes.items())


def _batch(opts: TrafficBench, info: DistInfo, sequence: int, unit: int) -> Batch:
    """The rank's batch: its data-parallel group's one sequence, of whose frames it holds its
    slice alone under a split, as a training run's stream gives it (data.Part)."""
    g = torch.Generator().manual_seed(info.data_rank(sequence)[0])
    shape = (1, opts.frames, 3, opts.size, opts.size)
    frames = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 7, (1, opts.frames), generator=g)
    part = info.data_part(sequence, unit)
    held = frames[:, part.held(opts.frames)] if part else frames
    mask = torch.ones(1, opts.frames, dtype=torch.bool)
    return Batch(held, labels, mask).to(info.device)


def _step(model: nn.Module, opt: torch.optim.Optimizer, batch: Batch, world: int) -> None:
    opt.zero_grad()
    train_step(model, opt, [batch], world)
    clip_grad_norm(model, 1.0)
    opt.step()


def _record(
    opts: TrafficBench, info: DistInfo, mode: str, chunks: int, sequence: int, recompute: str
) -> TrafficRecord:
    """On each rank: one step to warm up, three timed, one counted, one measured."""
    model = bench_model(opts.backbone, Recompute(recompute), opts.frames // chunks, info.device)
    features = feature_bytes(model, opts.frames, sequence)
    predicted = predicted_bytes(model, mode, info.world) + features
    parameters = sum(p.numel() for p in model.parameters())
    sharded = parallelize(model, mode, info=info, sequence=sequence)
    opt = torch.optim.AdamW(sharded.parameters())
    batch = _batch(opts, info, sequence, model.chunk_frames)
    _step(sharded, opt, batch, info.world)  # warm-up: allocations, the first gathers' buffers
    times = []
    for _ in range(3):
        start = time.perf_counter()
        _step(sharded, opt, batch, info.world)
        times.append(time.perf_counter() - start)
    seconds = sorted(times)[1]  # the median of three
    with CollectiveCounter() as counter:
        _step(sharded, opt, batch, info.world)
    held = batch.frames.numel()  # uint8: what the rank holds before the step, under its peak
    peak = held + peak_memory(lambda: _step(sharded, opt, batch, info.world), info.device)
    slowest, largest = map(max, zip(*all_gather_objects([(seconds, peak)]), strict=True))
    # The features' all-gather runs within a sequence group: (S-1)/S of it crosses a link.
    w, s = info.world, sequence
    wire = wire_bytes(counter.bytes, w) - features * ((w - 1) / w - (s - 1) / s)
    return TrafficRecord(
        mode, info.world, chunks, parameters, dict(counter.counts), dict(counter.bytes),
        sum(counter.bytes.values()), predicted, wire, slowest, sequence, int(largest), recompute,
    )  # fmt: skip


def world_records(opts: TrafficBench, world: int) -> list[TrafficRecord]:
    """One torchrun group of ``world`` ranks on this host; rank 0's records."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={world}", "-m", "distseq.bench.traffic", json.dumps(asdict(opts))]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        why = torchrun_failure(proc.stderr.strip() or proc.stdout.strip() or "no output")
        raise TrainingError(f"bench traffic at world {world}: torchrun failed: {why}")
    return [TrafficRecord(**json.loads(line)) for line in lines]


def torchrun_failure(said: str) -> str:
    """The line that says why a torchrun group failed: a rank's own error, else the exit of the
    rank torchrun's summary names as the root cause (a rank killed by a signal prints nothing)."""
    lines = [line.strip() for line in said.splitlines()]
    own = [
        line
        for line in lines
        if re.search(r"\w(Error|Exception)\b|error:|^terminate called", line)
        and "ChildFailedError" not in line  # torchrun's own, above its summary
    ]
    if own:
        return own[-1]
    # The summary's last entry is the root cause: "rank : 1 (local_rank: 1)", "exitcode : -6 ..."
    ranks = [line for line in lines if re.match(r"rank\s*:", line)]
    exits = [line for line in lines if re.match(r"exitcode\s*:", line)]
    if ranks and exits:
        return f"{' '.join(ranks[-1].split())}, {' '.join(exits[-1].split())}"
    return lines[-1]


def checked(opts: TrafficBench) -> None:
    """Refuse, before any torchrun group starts, sizes that a rank would fail on and a world
    that would run no case (no S divides it): a rank's error, or none, was all that was said."""
    sizes = {
        "--size": [opts.size],
        "--length": [opts.frames],
        "--chunks-per-sequence": opts.chunks,
        "--worlds": opts.worlds,
        "--sequences": opts.sequences,
    }
    for option, values in sizes.items():
        if not values or min(values) < 1:
            raise ConfigError(f"bench traffic: {option} {min(values, default='')}: must be >= 1")
    for chunks in opts.chunks:
        if opts.frames % chunks:
            raise ConfigError(
                f"bench traffic: --chunks-per-sequence {chunks}: must divide --length "
                f"{opts.frames} (chunks of T / chunks frames)"
            )
    for world in opts.worlds:
        if all(world % s for s in opts.sequences):
            said = " ".join(map(str, opts.sequences))
            raise ConfigError(
                f"bench traffic: --worlds {world}: no --sequences value ({said}) divides it, "
                "so it would run no case"
            )


def bench_traffic(opts: TrafficBench) -> list[TrafficRecord]:
    checked(opts)
    records: list[TrafficRecord] = []
    if not opts.json:
        print(
            f"{opts.backbone} + LSTM, T={opts.frames} at {opts.size} px, one sequence a data-"
            "parallel rank, split across S ranks (MiB per rank; wire: ring algorithms over one "
            "rank's link; peak: the largest rank's frames and its step's peak above them)"
        )
        print(
            f"{'mode':>5} {'recompute':>9} {'world':>5} {'S':>2} {'chunks':>6} {'collectives':>11} "
            f"{'all_gather':>10} "
            f"{'reduce_sc':>9} {'all_reduce':>10} {'total':>8} {'predicted':>9} "
            f"{'other B':>7} {'wire':>8} {'step s':>7} {'peak':>8}"
        )
    for world in opts.worlds:
        for r in world_records(opts, world):
            records.append(r)
            if opts.json:
                print(json.dumps(asdict(r)), flush=True)
                continue
            mib = {k: r.bytes.get(k, 0) / MIB for k in _RING}
            print(
                f"{r.mode:>5} {r.recompute:>9} {r.world:>5} {r.sequence:>2} {r.chunks:>6} "
                f"{sum(r.counts.values()):>11} "
                f"{mib['all_gather']:>10.2f} {mib['reduce_scatter']:>9.2f} "
                f"{mib['all_reduce']:>10.2f} {r.total_bytes / MIB:>8.2f} "
                f"{r.predicted_bytes / MIB:>9.2f} {r.total_bytes - r.predicted_bytes:>7} "
                f"{r.wire_bytes / MIB:>8.2f} {r.step_seconds:>7.3f} {r.peak_bytes / MIB:>8.1f}",
                flush=True,
            )
    return records


def _main() -> None:
    """A rank of ``world_records``' group: rank 0 prints every record, one JSON line each."""
    opts = TrafficBench(**json.loads(sys.argv[1]))
    info = init_distributed()
    records = [
        _record(opts, info, mode, chunks, s, recompute)
        for recompute in opts.recompute
        for s in opts.sequences
        if info.world % s == 0
        for mode in opts.modes
        for chunks in opts.chunks
    ]
    close_distributed()
    if int(os.environ.get("RANK", "0")) == 0:
        for r in records:
            print(json.dumps(asdict(r)), flush=True)


if __name__ == "__main__":
    _main()
