"""``distseq bench compare``: one configuration trained one step by each approach people use,
side by side in one run: memory, time, the bound physics allows, and exactness.

Rows, per T:

- ``plain``: autograd, nothing recomputed;
- ``per_block``: every CNN block checkpointed (torch's ``apply_activation_checkpointing`` with a
  per-block policy, what Lightning's, accelerate's and torchtitan's activation checkpointing
  give), the whole sequence at once;
- ``tbptt``: truncated BPTT as the published surgical baselines train it: 64-frame windows, a
  backward per window, the RNN state carried but detached, nothing recomputed;
- ``chunked``: distseq at a fixed chunk, every chunk recomputed;
- ``planner``: distseq under ``memory.budget`` at 25%, 50% and 75% of plain's peak and at
  tbptt's;
- ``planner_offload``: the planner at 50% with ``memory.offload=frames``;
- with ``--compile BACKEND``: ``plain_compiled`` and ``chunked_compiled``, those two rows with
  the backbone compiled (``model.compile``), after a step that compiles it.

Peaks and budgets are a step's, as ``bench memory`` measures them: the tensor memory a step
allocates above what exists before it (the parameters, their AdamW state, the frames; the plan
adds those to the budget it is given). ``bound_seconds`` is the least time an exact step can
take at that memory, from the probe's own per-frame times: T (F + B) + r F, with r F the forward
work that cannot be held there, at the best mix of whole chunks and held stages (the plan's own
prediction at a budget of the row's peak). ``exact`` compares every gradient with plain's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing,
)
from torchvision.models.convnext import CNBlock
from torchvision.models.efficientnet import MBConv
from torchvision.models.mobilenetv2 import InvertedResidual
from torchvision.models.resnet import BasicBlock, Bottleneck

from distseq.bench.memory import CLASSES, bench_model, floor_bytes, random_sequence
from distseq.config import Recompute
from distseq.files import output_folder, write_atomic
from distseq.memory.chunked import ChunkedModel
from distseq.memory.measure import peak_and_seconds
from distseq.memory.plan import Plan
from distseq.memory.probe import Probe, RunShape, probe, resident_bytes
from distseq.model.head import Carry
from distseq.units import MIB

TBPTT = 64
SHARES = (0.25, 0.5, 0.75)
BLOCKS = (BasicBlock, Bottleneck, InvertedResidual, MBConv, CNBlock)


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
Step = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], None]


@dataclass
class Row:
    approach: str
    frames: int
    budget_bytes: int | None
    peak_bytes: int | None  # None: the budget is below the floor, nothing ran
    predicted_peak_bytes: float | None
    step_seconds: float | None
    plain_ratio: float | None = None  # step time over plain's
    bound_seconds: float | None = None
    bound_ratio: float | None = None  # step time over the bound
    exact: bool | None = None  # every gradient within 1e-4 of plain's (relative to its largest)
    # chunked: what chunking cannot avoid (bench memory's floor), and the parameter gradients
    floor_bytes: int | None = None
    gradient_bytes: int | None = None
    plan: str | None = None  # planner rows: the plan's line, as training prints it


@dataclass(frozen=True)
class Case:
    backbone: str
    size: int
    frames: int
    chunk: int
    plan_chunk: int  # memory.chunk_frames of the planner rows
    device: torch.device
    compile: str = ""  # a torch.compile backend: the compiled rows too

    def model(self, recompute: Recompute, chunk: int, compiled: bool = False) -> ChunkedModel:
        model = bench_model(self.backbone, recompute, chunk, self.device)
        if compiled:
            model.compile_backbone(self.compile)
        return model

    def batch(self) -> Batch:
        return random_sequence(self.frames, self.size, self.device)


def whole_step(model: nn.Module, x: torch.Tensor, mask: torch.Tensor, y: torch.Tensor) -> None:
    loss = F.cross_entropy(model(x, mask).flatten(0, 1).float(), y.flatten())
    loss.backward()


def _windows(model: nn.Module, x: torch.Tensor, mask: torch.Tensor, y: torch.Tensor) -> None:
    """A backward per window, the state carried detached: the loss is the sequence's mean."""
    carry = Carry()
    for start in range(0, x.shape[1], TBPTT):
        w = slice(start, start + TBPTT)
        logits = model(x[:, w], mask[:, w], carry).flatten(0, 1).float()
        (F.cross_entropy(logits, y[:, w].flatten(), reduction="sum") / x.shape[1]).backward()


def _grads(model: nn.Module, run: Step, batch: Batch) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    # The same dropout draws in every row: MobileNet and EfficientNet keep some.
    torch.manual_seed(1)
    run(model, *batch)
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return grads


def _exact(got: list[torch.Tensor], ref: list[torch.Tensor]) -> bool:
    return len(got) == len(ref) and all(
        float((g - r).abs().max() / r.abs().max().clamp_min(1e-12)) < 1e-4
        for g, r in zip(got, ref, strict=True)
    )


def compare(case: Case) -> tuple[list[Row], Probe, int]:
    """Every row of one T, measured in this process one after the other; the probe, and the
    bytes on the device before a step."""
    batch = case.batch()
    plain = case.model(Recompute.none, case.frames)
    before = resident_bytes(plain) + batch[0].numel()  # on the device before any step
    chunked = case.model(Recompute.torch, case.chunk)
    shape = RunShape(1, case.size, CLASSES, case.frames, case.device)
    measured = probe(chunked, chunked, shape, case.plan_chunk)
    stages = tuple(chunked.stages)
    reference = _grads(plain, whole_step, batch)

    def measure(
        model: nn.Module, step: Step, approach: str, plan: Plan | None = None, data: Batch = batch
    ) -> Row:
        exact = _exact(_grads(model, step, data), reference)

        def once() -> None:
            step(model, *data)
            model.zero_grad(set_to_none=True)

        once()  # warm-up
        peak, seconds = peak_and_seconds(once, case.device)
        base = before if data is batch else before - batch[0].numel()  # offloaded: no frames
        budget = None if plan is None else plan.budget_bytes - base
        predicted = None if plan is None else plan.peak_bytes(case.frames) - base
        return Row(approach, case.frames, budget, peak, predicted, seconds, exact=exact)

    def planned(approach: str, plan: Plan, data: Batch = batch) -> Row:
        if plan.floor_bytes(case.frames) > plan.budget_bytes:
            base = before if data is batch else before - batch[0].numel()
            return Row(approach, case.frames, plan.budget_bytes - base, None, None, None)
        model = case.model(Recompute.torch, plan.probe.chunk_frames)
        plan.apply(model)
        model.prefetch_frames = data is not batch  # offloaded, as memory.offload=frames runs
        row = measure(model, whole_step, approach, plan, data)
        row.plan = plan.describe(case.frames)
        return row

    blocks = case.model(Recompute.none, case.frames)
    apply_activation_checkpointing(blocks, check_fn=lambda m: isinstance(m, BLOCKS))
    rows = [
        measure(plain, whole_step, "plain"),
        measure(blocks, whole_step, "per_block"),
        measure(case.model(Recompute.none, case.frames), _windows, "tbptt"),
        measure(chunked, whole_step, "chunked"),
    ]
    rows[3].floor_bytes = floor_bytes(case.backbone, chunked, batch[0], batch[1], case.chunk)
    rows[3].gradient_bytes = sum(p.numel() * p.element_size() for p in chunked.parameters())
    plain_peak, tbptt_peak = rows[0].peak_bytes, rows[2].peak_bytes
    assert plain_peak is not None and tbptt_peak is not None
    for budget in [int(share * plain_peak) for share in SHARES] + [tbptt_peak]:
        rows.append(planned("planner", Plan(measured, before + budget, stages)))
    # Frame offload at half of plain's peak: the frames leave the device, so the same step
    # budget is over a device that holds no frames (on the CPU, host and device are one).
    frames = batch[0].pin_memory() if case.device.type == "cuda" else batch[0]
    on_host = probe(chunked, chunked, replace(shape, frames_on_host=True), case.plan_chunk)
    half = before - batch[0].numel() + int(SHARES[1] * plain_peak)
    rows.append(planned("planner_offload", Plan(on_host, half, stages), (frames, *batch[1:])))
    if case.compile:  # measure() compiles in its exactness step, before the timed ones
        rows.append(
            measure(case.model(Recompute.none, case.frames, True), whole_step, "plain_compiled")
        )
        rows.append(
            measure(case.model(Recompute.torch, case.chunk, True), whole_step, "chunked_compiled")
        )
    for row in rows:
        if row.peak_bytes is None or row.step_seconds is None:
            continue
        assert rows[0].step_seconds is not None
        row.plain_ratio = row.step_seconds / rows[0].step_seconds
        at = Plan(measured, before + (row.budget_bytes or row.peak_bytes))
        if at.floor_bytes(case.frames) <= at.budget_bytes:
            row.bound_seconds = at.step_seconds(case.frames)
            row.bound_ratio = row.step_seconds / row.bound_seconds
    return rows, measured, before


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / MIB:.0f}"


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(rows: list[Row], case: Case) -> str:
    """The rows as a Markdown table."""
    head = (
        "| T | approach | budget MiB | peak MiB | predicted MiB | step s | x plain | bound s "
        "| x bound | exact |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [f"{case.backbone}+LSTM, {case.size} px, batch 1, {case.device}", "", head]
    for r in rows:
        exact = "-" if r.exact is None else ("yes" if r.exact else "no")
        lines.append(
            f"| {r.frames} | {r.approach} | {_mib(r.budget_bytes)} | {_mib(r.peak_bytes)} "
            f"| {_mib(r.predicted_peak_bytes)} | {_num(r.step_seconds)} | {_num(r.plain_ratio)} "
            f"| {_num(r.bound_seconds)} | {_num(r.bound_ratio)} | {exact} |"
        )
    return "\n".join(lines)


def targets(rows: list[Row]) -> list[str]:
    """The targets docs/benchmarks.md sets for the planner (budget kept, near the bound, half of
    plain's memory, against truncation, the floor), each with its measured figure, met or not."""
    out = []
    for frames in sorted({r.frames for r in rows}):
        at = {r.approach: r for r in rows if r.frames == frames and r.approach != "planner"}
        planned = [r for r in rows if r.frames == frames and r.approach == "planner"]
        offloaded = [r for r in rows if r.frames == frames and r.approach == "planner_offload"]
        for r in planned + offloaded:
            if r.peak_bytes is None or r.budget_bytes is None:
                out.append(f"T={frames} {r.approach} {_mib(r.budget_bytes)} MiB: below the floor")
                continue
            use = r.peak_bytes / r.budget_bytes
            out.append(
                f"T={frames} {r.approach} {_mib(r.budget_bytes)} MiB: peak {use:.1%} of it "
                f"({'within' if use <= 1 else 'ABOVE'}), {_num(r.bound_ratio)}x the bound "
                f"(target <= 1.05), {_num(r.plain_ratio)}x plain"
            )
        half, tbptt = planned[1], planned[-1]
        if half.plain_ratio is not None:
            out.append(f"T={frames} half of plain's memory: {half.plain_ratio:.2f}x plain (<= 1.2)")
        if tbptt.step_seconds is not None and at["tbptt"].step_seconds:
            ratio = tbptt.step_seconds / at["tbptt"].step_seconds
            out.append(f"T={frames} at tbptt's peak: exact {ratio:.2f}x tbptt's time")
        chunked = at["chunked"]
        for name in ("plain", "chunked"):
            fast, slow = at.get(f"{name}_compiled"), at[name]
            if fast is not None and fast.step_seconds and slow.step_seconds:
                speed = slow.step_seconds / fast.step_seconds
                out.append(f"T={frames} {name} compiled: {speed:.2f}x the speed of {name}")
        if chunked.peak_bytes and chunked.floor_bytes and chunked.gradient_bytes is not None:
            ratio = (chunked.peak_bytes - chunked.gradient_bytes) / chunked.floor_bytes
            out.append(
                f"T={frames} floor: chunked peak less parameter gradients "
                f"{ratio:.2f}x the floor, {_mib(chunked.floor_bytes)} MiB (<= 1.25)"
            )
    return out


def plot(rows: list[Row], case: Case, probes: dict[int, tuple[Probe, int]], path: Path) -> None:
    """Step time against peak memory, one point per row, the bound as a curve, per T.
    ``probes``: each T's probe and the bytes on the device before a step."""
    lengths = sorted({r.frames for r in rows})
    fig, axes = plt.subplots(1, len(lengths), figsize=(6 * len(lengths), 4.5), squeeze=False)
    for ax, frames in zip(axes[0], lengths, strict=True):
        measured, before = probes[frames]
        plan = Plan(measured, 0)
        floor, top = plan.floor_bytes(frames), plan.top_bytes(frames)
        budgets = [floor + (top - floor) * i / 50 for i in range(51)]
        ax.plot(
            [(b - before) / MIB for b in budgets],
            [Plan(measured, int(b)).step_seconds(frames) for b in budgets],
            color="0.6",
            label="bound: T(F+B) + rF",
        )
        for r in rows:
            if r.frames == frames and r.peak_bytes is not None:
                ax.scatter(r.peak_bytes / MIB, r.step_seconds, zorder=3)
                budget = "" if r.budget_bytes is None else f" {_mib(r.budget_bytes)}"
                label = r.approach + budget
                ax.annotate(
                    label,
                    (r.peak_bytes / MIB, r.step_seconds),
                    fontsize=8,
                    xytext=(4, 4),
                    textcoords="offset points",
                )
        ax.set(xlabel="peak memory (MiB)", ylabel="step time (s)", title=f"T={frames}")
        ax.legend(loc="upper right")
    fig.suptitle(f"{case.backbone}+LSTM, {case.size} px, {case.device}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@dataclass(frozen=True)
class CompareBench:
    """One ``bench compare`` run: its options, as the command line gives them."""

    backbone: str
    size: int
    frames: list[int]
    chunk: int
    plan_chunk: int
    out: str
    json: bool
    compile: str


def bench_compare(args: CompareBench) -> list[Row]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = output_folder(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    probes: dict[int, tuple[Probe, int]] = {}
    for frames in args.frames:
        case = Case(
            args.backbone, args.size, frames, args.chunk, args.plan_chunk, device, args.compile
        )
        if not args.json:
            print(f"T={frames}: measuring {11 if args.compile else 9} rows ...", flush=True)
        got, measured, before = compare(case)
        probes[frames] = measured, before
        rows += got
        if args.json:
            for row in got:
                print(json.dumps(asdict(row)), flush=True)
    plans = [f"- {r.approach}: {r.plan}" for r in rows if r.plan]
    text = (
        table(rows, case)
        + "\n\n"
        + "\n".join(f"- {t}" for t in targets(rows))
        + "\n\nThe plans:\n\n"
        + "\n".join(plans)
        + "\n"
    )
    write_atomic(out / "compare.md", text.encode())
    write_atomic(out / "compare.json", json.dumps([asdict(r) for r in rows], indent=1).encode())
    plot(rows, case, probes, out / "compare.png")
    if not args.json:
        print(text + f"\nwrote {out / 'compare.md'}, compare.json and compare.png", flush=True)
    return rows
