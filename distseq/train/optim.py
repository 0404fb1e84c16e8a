"""AdamW with linear warm-up and cosine decay to zero at ``train.steps``, over parameter groups
by name prefix (``optim.groups``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from distseq.config import OptimConfig, ParamGroup
from distseq.errors import ConfigError


def param_groups(
    model: nn.Module, lr: float, weight_decay: float, groups: Sequence[ParamGroup] = ()
) -> list[dict[str, Any]]:
    """A torch optimizer's parameter groups for ``model``: each parameter in the group of the
    longest of ``groups``' prefixes that its name begins with (``lr * lr_scale``, its weight
    decay), the rest in a first group at ``lr`` and ``weight_decay``. A prefix that names no
    parameter is a :class:`ConfigError`."""
    module = getattr(model, "module", model)  # DDP's names begin with module.
    named = list(module.named_parameters())
    members: dict[str, list[nn.Parameter]] = {"": [], **{g.prefix: [] for g in groups}}
    for name, param in named:
        under = [g.prefix for g in groups if name == g.prefix or name.startswith(g.prefix + ".")]
        members[max(under, key=len, default="")].append(param)
    for group in groups:
        if not members[group.prefix]:
            tops = sorted({name.split(".")[0] for name, _ in named})
            raise ConfigError(
                f"config key optim.groups: prefix {group.prefix!r} names no parameter of the "
                f"model (its names begin with {', '.join(tops)})"
            )
    out = [{"params": members[""], "lr": lr, "weight_decay": weight_decay}] if members[""] else []
    for group in groups:
        decay = weight_decay if group.weight_decay is None else group.weight_decay
        out.append(
            {"params": members[group.prefix], "lr": lr * group.lr_scale, "weight_decay": decay}
        )
    return out


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    groups = param_groups(model, cfg.lr, cfg.weight_decay, cfg.groups)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def warmup_cosine(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)
