"""``distseq bench gpu``: the GPU acceptance run, one table of what only a GPU can show.

ResNet-50 + LSTM at 224 px over one sequence of T frames, as ``bench compare`` measures a step
(the tensor memory a step allocates above what is there before it, and its fastest wall time):

- plain autograd against distseq's chunks against the planner at 50% of plain's peak: CUDA peak
  against the plan's prediction, step time, every gradient checked against plain's;
- the chunked step in bf16 (``parallel.precision=auto`` computes in bf16) against fp32;
- ``memory.offload=frames``: how much of the frames' copy to the device the side stream hides
  (the chunked step with frames on the host against frames on the device, over the copy's own
  time, twice: each chunk is copied for its forward and for its recompute);
- FSDP2 over NCCL on every visible GPU: a real torchrun group (``bench traffic``'s worker);
- ``torch.compile``'s speed-up, plain and chunked (``bench compare --compile``);
- the loader workers that feed the bf16 step's frames/s, from one worker's frames/s at 224 px
  with augmentation (``bench data``).

``--dry-run`` runs the same code at tiny sizes on the CPU, where no GPU is lent: ``tiny_cnn`` at
64 px, T=64 in chunks of 8, compiled with ``aot_eager``; few parameters, so that a step's memory
is mostly activations, as ResNet-50's is at 224 px, and quick to trace (MobileNetV3-small's
tracing took 85 s of the test's 180 s). It keeps this command working.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace

import torch

from distseq.bench.compare import Case, Row, compare, whole_step
from distseq.bench.data import AUGMENT, pipeline, synthetic_shards
from distseq.bench.traffic import TrafficBench, world_records
from distseq.config import DataConfig, Recompute
from distseq.errors import ConfigError
from distseq.files import output_folder, write_atomic
from distseq.memory.measure import fastest_seconds, peak_and_seconds
from distseq.units import MIB

LOADER_WINDOW = 64  # frames per window the loader row reads


@dataclass(frozen=True)
class GpuBench:
    """One ``bench gpu`` run: its options, as the command line gives them."""

    backbone: str
    size: int
    frames: int
    chunk: int
    compile: str  # a torch.compile backend
    loader_frames: int  # frames the loader row times
    dry_run: bool
    out: str
    json: bool


DRY_RUN = {
    "backbone": "tiny_cnn",
    "size": 64,
    "frames": 64,
    "chunk": 8,
    "compile": "aot_eager",
    "loader_frames": 64,
}


@dataclass
class Line:
    """One row of the table: a quantity, its value and unit, and what it is measured against."""

    quantity: str
    value: float | None  # None: not measurable here (named in ``note``)
    unit: str
    note: str = ""


def _row(rows: list[Row], approach: str, index: int = 0) -> Row:
    return [r for r in rows if r.approach == approach][index]


def _memory_lines(rows: list[Row]) -> list[Line]:
    """Plain, chunked and the planner at 50%, from ``compare``'s rows."""
    plain, chunked, half = _row(rows, "plain"), _row(rows, "chunked"), _row(rows, "planner", 1)
    out = []
    for name, r in (("plain", plain), ("chunked", chunked), ("planner at 50%", half)):
        if r.peak_bytes is None or r.step_seconds is None:
            out.append(Line(f"{name}: step", None, "s", "below the floor: nothing ran"))
            continue
        exact = "exact" if r.exact else "NOT exact"
        out.append(Line(f"{name}: peak", r.peak_bytes / MIB, "MiB", exact))
        out.append(Line(f"{name}: step", r.step_seconds, "s", f"{r.plain_ratio:.2f}x plain"))
    if half.peak_bytes and half.predicted_peak_bytes and half.budget_bytes:
        out.append(
            Line(
                "planner at 50%: predicted peak",
                half.predicted_peak_bytes / MIB,
                "MiB",
                f"measured {half.peak_bytes / half.predicted_peak_bytes:.3f}x the prediction; "
                f"budget {half.budget_bytes / MIB:.0f} MiB; {half.plan}",
            )
        )
    return out


def _bf16_lines(case: Case, fp32: Row) -> list[Line]:
    """The chunked step with every parameter and activation in bf16, against fp32's."""
    model = case.model(Recompute.torch, case.chunk).to(torch.bfloat16)
    batch = case.batch()

    def step() -> None:
        whole_step(model, *batch)
        model.zero_grad(set_to_none=True)

    step()  # warm-up
    peak, seconds = peak_and_seconds(step, case.device)
    speed = fp32.step_seconds / seconds if fp32.step_seconds else math.nan
    return [
        Line("chunked bf16: peak", peak / MIB, "MiB", f"fp32 {_mib(fp32.peak_bytes)} MiB"),
        Line("chunked bf16: step", seconds, "s", f"{speed:.2f}x the speed of fp32"),
    ]


def _offload_line(case: Case) -> Line:
    """The share of the frames' copy in that ``memory.offload=frames`` hides behind compute."""
    if case.device.type != "cuda":
        return Line("offload: copy hidden", None, "%", "no copy on the CPU: host is the device")
    model = case.model(Recompute.torch, case.chunk)
    frames, mask, labels = case.batch()
    host = frames.cpu().pin_memory()

    def on(x: torch.Tensor) -> float:
        def step() -> None:
            whole_step(model, x, mask, labels)
            model.zero_grad(set_to_none=True)

        step()
        return fastest_seconds(step, case.device, 3)

    model.prefetch_frames = False
    resident = on(frames)
    model.prefetch_frames = True
    offloaded = on(host)
    # Every chunk is copied for its forward and again for its recompute.
    copy = 2 * fastest_seconds(lambda: host.to(case.device, non_blocking=True), case.device, 3)
    hidden = 100 * (1 - max(0.0, offloaded - resident) / copy)
    return Line(
        "offload: copy hidden",
        hidden,
        "%",
        f"step {offloaded:.3f} s offloaded vs {resident:.3f} s resident; copies {copy:.3f} s",
    )


def _fsdp_lines(opts: GpuBench, device: torch.device) -> list[Line]:
    """One FSDP2 step on every visible GPU (2 CPU ranks over gloo in a dry run)."""
    world = torch.cuda.device_count() if device.type == "cuda" else 2
    traffic = TrafficBench(
        opts.backbone, opts.size, opts.frames, [opts.frames // opts.chunk], [world], ["fsdp"]
    )
    r = world_records(traffic, world)[0]
    backend = "nccl" if device.type == "cuda" else "gloo"
    rate = world * opts.frames / r.step_seconds
    return [
        Line(f"FSDP2 x{world} ({backend}): step", r.step_seconds, "s", f"{rate:.0f} frames/s"),
        Line(
            f"FSDP2 x{world} ({backend}): per rank",
            r.total_bytes / MIB,
            "MiB",
            f"predicted {r.predicted_bytes / MIB:.1f} MiB; on the wire "
            f"{r.wire_bytes / MIB / r.step_seconds:.0f} MiB/s over the step",
        ),
    ]


def _compile_lines(rows: list[Row]) -> list[Line]:
    out = []
    for name in ("plain", "chunked"):
        eager, compiled = _row(rows, name), _row(rows, f"{name}_compiled")
        if eager.step_seconds and compiled.step_seconds:
            exact = "exact" if compiled.exact else "NOT exact (docs/config.md: model.compile)"
            speed = eager.step_seconds / compiled.step_seconds
            out.append(Line(f"{name} compiled: speed-up", speed, "x", exact))
    return out


def _loader_line(opts: GpuBench, step_fps: float) -> Line:
    """Loader workers for ``step_fps``, from one worker's frames/s with augmentation."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one worker's rate, as bench data measures it
    try:
        window = min(LOADER_WINDOW, opts.frames)
        with synthetic_shards(opts.size, window) as pattern:
            cfg = DataConfig(
                train=pattern, window=window, size=opts.size, num_workers=1, augment=AUGMENT
            )
            frames, seconds = pipeline(cfg, opts.loader_frames)
    finally:
        torch.set_num_threads(threads)
    per_worker = frames / seconds
    return Line(
        "loader workers needed",
        math.ceil(step_fps / per_worker),
        "",
        f"for {step_fps:.0f} frames/s (chunked bf16), {per_worker:.0f} frames/s a worker",
    )


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / MIB:.0f}"


def table(lines: list[Line], title: str) -> str:
    out = [title, "", "| quantity | value | unit | against |", "|---|---|---|---|"]
    for line in lines:
        value = "-" if line.value is None else f"{line.value:.4g}"
        out.append(f"| {line.quantity} | {value} | {line.unit} | {line.note} |")
    return "\n".join(out)


def bench_gpu(opts: GpuBench) -> list[Line]:
    out = output_folder(opts.out)
    if opts.dry_run:
        opts = replace(opts, **DRY_RUN)  # type: ignore[arg-type]
    cuda = torch.cuda.is_available()
    if not cuda and not opts.dry_run:
        raise ConfigError("distseq bench gpu: no CUDA device here; --dry-run runs it on the CPU")
    if opts.frames % opts.chunk:
        raise ConfigError(f"--length {opts.frames}: must be a multiple of --chunk {opts.chunk}")
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name(device) if cuda else "CPU (dry run)"
    title = (
        f"{opts.backbone} + LSTM, {opts.size} px, T={opts.frames}, chunks of {opts.chunk}, "
        f"on {name}, torch {torch.__version__}"
    )
    if not opts.json:
        print(title + ": measuring ...", flush=True)
    start = time.perf_counter()
    case = Case(opts.backbone, opts.size, opts.frames, opts.chunk, opts.chunk, device, opts.compile)
    rows, _, _ = compare(case)
    chunked = _row(rows, "chunked")
    lines = _memory_lines(rows)
    lines += _bf16_lines(case, chunked)
    lines.append(_offload_line(case))
    lines += _fsdp_lines(opts, device)
    lines += _compile_lines(rows)
    bf16 = next(line for line in lines if line.quantity == "chunked bf16: step")
    assert bf16.value is not None
    lines.append(_loader_line(opts, opts.frames / bf16.value))
    lines.append(Line("whole run", time.perf_counter() - start, "s"))
    text = table(lines, title)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "gpu.md", text + "\n")
    record = {
        "title": title,
        "lines": [asdict(line) for line in lines],
        "rows": [asdict(r) for r in rows],
    }
    write_atomic(out / "gpu.json", json.dumps(record, indent=1) + "\n")
    print(json.dumps(record) if opts.json else text, flush=True)
    return lines
