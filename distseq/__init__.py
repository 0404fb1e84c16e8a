"""distseq: end-to-end CNN + temporal-model training on long videos.

The library (docs/library.md): your per-frame CNN and your temporal module, run over whole
videos with the CNN in checkpointed chunks, so gradients are exact at a fraction of the memory::

    import distseq
    model = distseq.ChunkedModel(my_cnn, my_head, chunk_frames=16)
    logits = model(frames, mask)  # uint8 [B, T, 3, H, W], bool [B, T] -> [B, T, K]
    # (a multi-stage head, MS-TCN, gives every stage's: [S, B, T, K])

Names load on first use, so ``distseq`` on the command line starts without importing torch
before it must.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    import torch
    from torch import nn

    from distseq.config import ParamGroup, Recompute
    from distseq.errors import ConfigError, ModelError
    from distseq.memory.budget import load_plan, save_plan
    from distseq.memory.chunked import ChunkedModel
    from distseq.memory.measure import peak_memory
    from distseq.memory.plan import Plan
    from distseq.model.head import Carry, last_stage
    from distseq.parallel import (
        DistInfo,
        average_batchnorm_stats,
        close_distributed,
        init_distributed,
        parallelize,
    )
    from distseq.train.optim import param_groups

# Each public name and the module that defines it.
_HOMES = {
    "ChunkedModel": "distseq.memory.chunked",
    "Carry": "distseq.model.head",
    "last_stage": "distseq.model.head",
    "Recompute": "distseq.config",
    "Plan": "distseq.memory.plan",
    "save_plan": "distseq.memory.budget",
    "load_plan": "distseq.memory.budget",
    "peak_memory": "distseq.memory.measure",
    "init_distributed": "distseq.parallel",
    "parallelize": "distseq.parallel",
    "average_batchnorm_stats": "distseq.parallel",
    "close_distributed": "distseq.parallel",
    "DistInfo": "distseq.parallel",
    "ModelError": "distseq.errors",
    "ConfigError": "distseq.errors",
    "ParamGroup": "distseq.config",
    "param_groups": "distseq.train.optim",
}

__all__ = [
    "Carry",
    "ChunkedModel",
    "ConfigError",
    "DistInfo",
    "ModelError",
    "ParamGroup",
    "Plan",
    "Recompute",
    "__version__",
    "average_batchnorm_stats",
    "close_distributed",
    "init_distributed",
    "last_stage",
    "load_plan",
    "parallelize",
    "param_groups",
    "peak_memory",
    "plan_memory",
    "save_plan",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'distseq' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public names with the module's own: what ``dir(distseq)`` and tab completion list,
    though most load only on first use."""
    return sorted({*globals(), *__all__})


def plan_memory(
    model: ChunkedModel,
    budget: str | int,
    frames: torch.Tensor,
    num_classes: int,
    *,
    wrapped: nn.Module | None = None,
    sequence: int = 1,
    say: Callable[[str], None] = print,
) -> Plan:
    """The least recompute that fits ``budget`` for a training step on ``frames``' shape: see
    :func:`distseq.memory.budget.plan_memory`. Under torchrun every rank calls it, and all plan
    from rank 0's measurements."""
    from distseq.memory.budget import plan_memory as plan
    from distseq.parallel import from_rank_zero

    return plan(
        model,
        budget,
        frames,
        num_classes,
        wrapped=wrapped,
        sequence=sequence,
        say=say,
        agree=from_rank_zero,
    )
