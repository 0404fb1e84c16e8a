"""``memory.budget`` from the config key to a plan that runs the model: probe, agree, fit, apply,
and the plan recorded in the run.

The plan's arithmetic is ``memory.plan``, the measuring ``memory.probe``; this puts them to work
for a training run. A run's plan is chosen once, when the run starts, and recorded in its
``plan.json``; every later start of the run (a resume, a relaunch after a kill) plans from the
recorded measurements, so it runs the same chunks with the same holds without probing again. The
chunk size is part of the model under BatchNorm (its statistics are per chunk) and never changes
after the first start: on another kind of device or with another budget, a start says so and
plans the holds anew at the recorded chunk size.

Every rank probes when one does (the probe's steps are collectives under FSDP), and all of them
plan from one rank's numbers (``agree``, passed in by the trainer, which owns the process group),
so that every rank runs the same chunks and holds and no collective waits on a rank that planned
otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from distseq.config import Config, Offload, to_dict
from distseq.errors import ConfigError, TrainingError, first_line
from distseq.files import write_atomic
from distseq.memory.chunked import ChunkedModel
from distseq.memory.plan import Plan, fit
from distseq.memory.probe import Probe, RunShape, first_chunk, probe, resident_bytes
from distseq.units import format_size, parse_budget

PLAN_FILE = "plan.json"
_FRESH, _RECORDED, _HOLDS_ANEW = 0, 1, 2  # how a start plans (start): rank 0's decision for all


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


def device_kind(device: torch.device) -> str:
    """The kind of device a plan's measurements hold for: ``cpu``, or the GPU's name."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


@dataclass(frozen=True)
class Recorded:
    """A run's plan as ``plan.json`` keeps it: what was measured, and what it was measured for."""

    probe: Probe
    stages: tuple[str, ...]
    budget_bytes: int
    device: str  # device_kind()
    # What else the measurements depend on: the model, the frames and how they are held.
    shape: dict[str, Any]

    def write(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> Recorded | None:
        if not path.exists():
            return None
        try:
            doc = json.loads(path.read_text())
            probe: dict[str, Any] = {
                k: tuple(v) if isinstance(v, list) else v for k, v in doc["probe"].items()
            }
            return cls(
                Probe(**probe),
                tuple(doc["stages"]),
                int(doc["budget_bytes"]),
                str(doc["device"]),
                dict(doc["shape"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise TrainingError(
                f"{path} is unreadable ({first_line(e)}): it records this run's memory plan; "
                "restore it, or delete it to plan anew (under BatchNorm the chunk size may then "
                "change, and with it the model)"
            ) from None


def _shape(cfg: Config) -> dict[str, Any]:
    """The config keys whose change changes what the probe measures, the budget aside."""
    return {
        "model": to_dict(cfg)["model"],
        "data.size": cfg.data.size,
        "data.batch_size": cfg.data.batch_size,
        "memory.recompute": cfg.memory.recompute.value,
        "memory.offload": cfg.memory.offload.value,
    }


def plan_for_budget(
    cfg: Config,
    model: nn.Module,
    chunked: ChunkedModel,
    num_classes: int,
    window: int,
    device: torch.device,
    agree: Callable[[torch.Tensor], torch.Tensor],
    say: Callable[[str], None],
    is_main: bool,
) -> Plan:
    """The plan of this start of the run in ``cfg.train.out_dir``, applied to ``chunked`` (the
    model, or ``model`` wrapped for FSDP/DDP): the recorded one, or one planned from a probe
    that ``agree`` makes one rank's on every rank, recorded by the main rank. Refuses in one line
    a budget that cannot hold ``window`` frames, the longest sequence the run trains on."""
    budget = budget_bytes(cfg.memory.budget, device)
    data, fixed = cfg.data, resident_bytes(model)
    if fixed >= budget:  # before any probing: no chunk size changes this
        raise ConfigError(
            f"config key memory.budget: {format_size(budget)} is below the parameters and "
            f"optimizer state alone ({format_size(fixed)} here): a larger budget, or more ranks "
            "under FSDP"
        )
    path = Path(cfg.train.out_dir) / PLAN_FILE
    now: dict[str, Any] = dict(budget_bytes=budget, device=device_kind(device), shape=_shape(cfg))
    recorded = Recorded.read(path) if is_main else None
    start, k = _start(recorded, now, fixed, first_chunk(cfg.memory.chunk_frames, window), say, path)
    start, k = (int(x) for x in agree(torch.tensor([start, k], device=device)).tolist())
    shape = RunShape(
        data.batch_size,
        data.size,
        num_classes,
        window,
        device,
        frames_on_host=cfg.memory.offload is Offload.frames,
        sequence=cfg.parallel.sequence,
    )

    def plan_at(chunk: int) -> Plan:
        return _probed_plan(model, chunked, shape, chunk, budget, agree)

    if start == _RECORDED:
        # Every rank reads the run's record: train.out_dir is shared by all of them.
        recorded = recorded or Recorded.read(path)
        if recorded is None:
            raise TrainingError(f"{path} is missing on this rank: train.out_dir must be shared")
        plan = Plan(recorded.probe, budget, recorded.stages, shape.sequence)
        plan.check(window)
        say(f"memory plan: {plan.describe(window)} (as planned at the run's start)")
    else:
        # A chunk size recorded once is kept: under BatchNorm it is part of the model.
        plan = plan_at(k) if start == _HOLDS_ANEW else fit(plan_at, k, window, say)
        plan.check(window)
        say(f"memory plan: {plan.describe(window)}")
        if is_main:
            path.parent.mkdir(parents=True, exist_ok=True)
            Recorded(plan.probe, plan.stages, **now).write(path)
    plan.apply(chunked)
    return plan


def _start(
    recorded: Recorded | None,
    now: dict[str, Any],
    fixed: int,
    first: int,
    say: Callable[[str], None],
    path: Path,
) -> tuple[int, int]:
    """How this start plans, and at which chunk size: afresh from ``first``, as ``recorded``
    (the same budget, device, shape and resident bytes), or the holds anew at the recorded
    chunk size, which under BatchNorm is part of the model."""
    if recorded is None:
        return _FRESH, first
    then = dict(budget_bytes=recorded.budget_bytes, device=recorded.device, shape=recorded.shape)
    k = recorded.probe.chunk_frames
    if then == now and recorded.probe.fixed_bytes == fixed:
        return _RECORDED, k
    say(
        f"memory plan: {path} was planned for {_changes(then, now, recorded, fixed)}; "
        f"planning the holds anew at the run's chunk={k}"
    )
    return _HOLDS_ANEW, k


def _probed_plan(
    model: nn.Module,
    chunked: ChunkedModel,
    shape: RunShape,
    chunk: int,
    budget: int,
    agree: Callable[[torch.Tensor], torch.Tensor],
) -> Plan:
    """The plan from a probe of ``model`` at ``chunk`` frames a chunk, one rank's for all."""
    measured = probe(model, chunked, shape, chunk)
    agreed = Probe.from_tensor(agree(measured.as_tensor().to(shape.device)))
    return Plan(agreed, budget, tuple(chunked.stages), shape.sequence)


def plan_memory(
    model: ChunkedModel,
    budget: str | int,
    frames: torch.Tensor,
    num_classes: int,
    *,
    wrapped: nn.Module | None = None,
    sequence: int = 1,
    say: Callable[[str], None] = print,
    agree: Callable[[torch.Tensor], torch.Tensor] = lambda measured: measured,
) -> Plan:
    """The least recompute for a training step of ``frames``' shape [B, T, C, H, W] to fit
    ``budget`` ("2GB", a fraction of the GPU such as "0.5", or bytes), as ``memory.budget``
    plans a run: ``model`` probed (``wrapped``, if given, is it under FSDP2 or DDP) on random
    frames of that shape with cross-entropy over ``num_classes``, then the chunks kept whole and the
    stages each other chunk holds chosen, at ``model.chunk_frames`` or, where even that floor does
    not fit, a smaller chunk. Returns the plan, not yet applied: ``plan.apply(model)`` runs by
    it, ``plan.describe(T)`` says it in one line, ``save_plan`` keeps it. Every rank of a group
    must call this (the probe's steps are collectives under FSDP), and ``agree`` makes one
    rank's measurements every rank's (``distseq.plan_memory`` passes rank 0's). ``sequence``:
    ``parallelize``'s, for a model that splits each sequence across that many ranks (the probe
    runs it whole, the plan is per slice)."""
    device = frames.device if not model.prefetch_frames else next(model.parameters()).device
    if frames.dim() != 5:
        raise ConfigError(f"plan_memory: frames of shape {list(frames.shape)}, not [B, T, C, H, W]")
    b, t, c, h, w = frames.shape
    budget = budget_bytes(budget, device) if isinstance(budget, str) else budget
    fixed = resident_bytes(wrapped or model)
    if fixed >= budget:
        raise ConfigError(
            f"plan_memory: a budget of {format_size(budget)} is below the parameters and "
            f"optimizer state alone ({format_size(fixed)})"
        )
    shape = RunShape(b, (h, w), num_classes, t, device, model.prefetch_frames, c, sequence)

    def plan_at(chunk: int) -> Plan:
        return _probed_plan(wrapped or model, model, shape, chunk, budget, agree)

    return fit(plan_at, first_chunk(model.chunk_frames, t), t, say)


def save_plan(plan: Plan, path: str | Path) -> None:
    """Write ``plan`` as JSON (the measurements it was made from, its budget and the device
    kind), so that a later start runs the same chunks without probing: ``load_plan``."""
    kind = device_kind(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    Recorded(plan.probe, plan.stages, plan.budget_bytes, kind, {}).write(Path(path))


def load_plan(path: str | Path) -> Plan:
    """A plan that ``save_plan`` (or a run's ``plan.json``) wrote; ``plan.apply(model)`` runs by
    it."""
    recorded = Recorded.read(Path(path))
    if recorded is None:
        raise ConfigError(f"load_plan: {path} does not exist")
    return Plan(recorded.probe, recorded.budget_bytes, recorded.stages)


def _changes(then: dict[str, Any], now: dict[str, Any], recorded: Recorded, fixed: int) -> str:
    """What differs between the recorded plan's circumstances and this start's, for people."""
    said = []
    if then["device"] != now["device"]:
        said.append(f"device {then['device']}, this start runs on {now['device']}")
    if then["budget_bytes"] != now["budget_bytes"]:
        said.append(
            f"a budget of {format_size(then['budget_bytes'])}, this start has "
            f"{format_size(now['budget_bytes'])}"
        )
    if recorded.probe.fixed_bytes != fixed:
        said.append(
            f"{format_size(recorded.probe.fixed_bytes)} of parameters and optimizer state a "
            f"rank, this start has {format_size(fixed)} (another number of ranks?)"
        )
    keys = [k for k in now["shape"] if then["shape"].get(k) != now["shape"][k]]
    if keys:
        said.append(f"other {', '.join(keys)}")
    return "; ".join(said)
