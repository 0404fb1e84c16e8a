"""Sharded training state on disk, written with ``torch.distributed.checkpoint``.

Every rank writes its own shards, so saving never gathers the full model on one rank.
``latest`` names the newest complete checkpoint and is replaced only after the save finished.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.optim import Optimizer


def save_checkpoint(root: Path, step: int, model: nn.Module, optimizer: Optimizer) -> Path:
    path = root / f"step_{step:08d}"
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path))
    if dist.is_initialized():
        dist.barrier()
    if not dist.is_initialized() or dist.get_rank() == 0:
        tmp = root / "latest.tmp"
        tmp.write_text(path.name + "\n")
        os.replace(tmp, root / "latest")
    return path
