"""AdamW with linear warm-up and cosine decay to zero at ``train.steps``, over parameter groups
by name prefix (``optim.groups``), some of them frozen for the run's first steps."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from distseq.config import OptimConfig, ParamGroup
from distseq.errors import ConfigError
from distseq.model.video import VideoModel


def _group_of(name: str, groups: Sequence[ParamGroup]) -> str:
    """The longest of ``groups``' prefixes that ``name`` is or begins with; "" for none."""
    under = [g.prefix for g in groups if name == g.prefix or name.startswith(g.prefix + ".")]
    return max(under, key=len, default="")


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
        members[_group_of(name, groups)].append(param)
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


def _frozen_until(name: str, groups: Sequence[ParamGroup]) -> int:
    """The last step at which parameter ``name`` is frozen; 0 for none."""
    prefix = _group_of(name, groups)
    return next((g.frozen_until for g in groups if g.prefix == prefix), 0)


def freeze_for_the_run(model: nn.Module, groups: Sequence[ParamGroup], steps: int) -> int:
    """Turn off ``requires_grad`` for the parameters frozen through the run's last step (their
    groups' ``frozen_until`` >= ``steps``): no gradient is computed or reduced for them and the
    optimizer makes no state, which the memory plan then leaves out (resident_bytes). Call it on
    the plain model, before a wrapper takes the flags over; returns how many it froze."""
    named = list(model.named_parameters())
    frozen = [p for n, p in named if _frozen_until(n, groups) >= steps]
    if frozen and len(frozen) == len(named):
        raise ConfigError(
            f"config key optim.groups: every parameter is frozen through step {steps}, "
            f"train.steps: nothing would train; lower frozen_until"
        )
    until = backbone_frozen_until(model, groups)
    rest = [n for n, _ in named if not n.startswith("backbone.")]
    if until and all(_frozen_until(n, groups) >= steps for n in rest):
        raise ConfigError(
            f"config key optim.groups: through step {min(until, steps)}: nothing would train, "
            f"the backbone is frozen until then and the rest for the whole run"
        )
    for param in frozen:
        param.requires_grad_(False)
    return len(frozen)


def backbone_frozen_until(model: nn.Module, groups: Sequence[ParamGroup]) -> int:
    """The last step at which every parameter of ``model.backbone`` is frozen; 0 for none (or
    a model without a backbone)."""
    module = getattr(model, "module", model)
    names = [n for n, _ in module.named_parameters() if n.startswith("backbone.")]
    return min((_frozen_until(n, groups) for n in names), default=0)


class Freezing:
    """The groups of ``optim.groups`` with ``frozen_until``: through that step their gradients
    are dropped before clipping and the optimizer step (AdamW then neither moves them nor makes
    state for them) and their BatchNorm layers run in eval mode (statistics used, not updated).

    While the whole backbone is frozen it runs without autograd (``VideoModel.backbone_frozen``):
    no activation kept, no recompute, no backward through the CNN. A frozen part of the backbone
    alone, or of the head, still has its gradients computed (the backward passes through it to
    what trains before it) and then dropped."""

    def __init__(self, model: nn.Module, groups: Sequence[ParamGroup]) -> None:
        module = getattr(model, "module", model)
        self.model = module if isinstance(module, VideoModel) else None
        self.backbone_until = backbone_frozen_until(module, groups)
        self.spans: list[tuple[int, list[nn.Parameter], list[nn.modules.batchnorm._BatchNorm]]] = []
        for group in groups:
            if not group.frozen_until:
                continue
            mine: list[nn.Parameter] = [
                p for n, p in module.named_parameters() if _group_of(n, groups) == group.prefix
            ]
            norms = [
                m
                for n, m in module.named_modules()
                if isinstance(m, nn.modules.batchnorm._BatchNorm)
                and _group_of(n, groups) == group.prefix
            ]
            self.spans.append((group.frozen_until, mine, norms))

    def before_step(self, step: int) -> None:
        """Batch norms of the groups frozen at ``step`` in eval mode, the others as they were,
        and the backbone without autograd while all of it is frozen."""
        for until, _, norms in self.spans:
            for norm in norms:
                norm.train(step > until)
        if self.model is not None:
            self.model.backbone_frozen = step <= self.backbone_until

    def unfreezes(self, step: int) -> bool:
        """Whether a group trains for the first time at ``step``."""
        return any(until + 1 == step for until, _, _ in self.spans)

    def frozen_at(self, step: int) -> list[nn.Parameter]:
        """The parameters frozen at ``step``."""
        return [p for until, params, _ in self.spans if step <= until for p in params]

    def after_backward(self, step: int) -> None:
        """The gradients of the groups frozen at ``step`` dropped."""
        for param in self.frozen_at(step):
            param.grad = None


def warmup_cosine(cfg: OptimConfig, total_steps: int, step: int) -> float:
    """optim.lr's factor at scheduler step ``step`` (0 at the run's step 1): a linear warm-up over
    optim.warmup_steps, then a cosine to 0 at ``total_steps``."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    groups = param_groups(model, cfg.lr, cfg.weight_decay, cfg.groups)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)

    def factor(group: ParamGroup | None) -> Callable[[int], float]:
        """The schedule of a group; one frozen through step ``frozen_until`` warms up over its
        own ``warmup_steps`` once it trains."""

        def of(step: int) -> float:
            base = warmup_cosine(cfg, total_steps, step)
            if group is None or not group.frozen_until:
                return base
            since = step - group.frozen_until  # 0 at the first step it trains
            if since < 0:
                return 0.0
            ramp = min(1.0, (since + 1) / group.warmup_steps) if group.warmup_steps else 1.0
            return ramp * base

        return of

    default: list[ParamGroup | None] = [None] * (len(groups) - len(cfg.groups))  # if any
    lambdas = [factor(g) for g in [*default, *cfg.groups]]
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)
