"""``memory.budget`` from the config key to a plan that runs the model: probe, agree, fit, apply.

The plan's arithmetic is ``memory.plan``, the measuring ``memory.probe``; this puts them to work
for a training run. Every rank probes, and all of them then plan from one rank's numbers
(``agree``, passed in by the trainer, which owns the process group), so that every rank runs
the same chunks and holds and no collective waits on a rank that planned otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from distseq.config import Config, Offload
from distseq.errors import ConfigError
from distseq.memory.chunked import ChunkedModel
from distseq.memory.plan import Plan, Probe, fit
from distseq.memory.probe import RunShape, probe
from distseq.units import parse_budget


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


def plan_for_budget(
    cfg: Config,
    model: nn.Module,
    chunked: ChunkedModel,
    classes: int,
    device: torch.device,
    agree: Callable[[torch.Tensor], torch.Tensor],
    say: Callable[[str], None],
) -> Plan:
    """Probe ``model`` (``chunked``, or it wrapped for FSDP/DDP), plan from the numbers ``agree``
    returns (one rank's, on every rank), refuse in one line a budget that cannot hold
    data.window frames, and let the plan set each chunk's hold for each T from now on."""
    budget = budget_bytes(cfg.memory.budget, device)
    data = cfg.data
    shape = RunShape(
        data.batch_size,
        data.size,
        classes,
        data.window,
        device,
        frames_on_host=cfg.memory.offload is Offload.frames,
    )

    def plan_at(largest: int) -> Plan:
        measured = probe(model, chunked, shape, largest)
        agreed = Probe.from_tensor(agree(measured.as_tensor().to(device)))
        return Plan(agreed, budget, tuple(chunked.stages))

    plan = fit(plan_at, data.window, say)
    say(f"memory plan: {plan.describe(data.window)}")
    plan.apply(chunked)
    return plan
