"""The model's normalisation layers whose running statistics training updates."""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def batchnorms(module: nn.Module) -> list[_BatchNorm]:
    """The BatchNorm layers of ``module`` that track running statistics."""
    return [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
