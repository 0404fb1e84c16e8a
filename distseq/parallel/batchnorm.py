"""BatchNorm running statistics kept one across the ranks (neither FSDP2 nor DDP does)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from distseq.model.norms import batchnorms


def average_batchnorm_stats(model: nn.Module) -> None:
    """Make every rank's BatchNorm running statistics their mean over the ranks, in place.

    Neither FSDP2 nor DDP keeps them one: FSDP2 leaves each rank's to follow its own frames, and
    DDP overwrites the others with rank 0's at each forward. Called after every step, this makes
    the running mean the running average of the global batch's mean (for equal local batches)
    and keeps every rank's the same, so that every rank evaluates one model, the checkpoint
    (which keeps one copy) holds what every rank holds, and a run resumed from any step is the
    uninterrupted one. Averaging only at saves would not do: a stop at another step would add an
    averaging that the uninterrupted run never did. One all-reduce of the BN buffers a step
    (about 0.2 MB for ResNet-50), none without BatchNorm. ``num_batches_tracked`` is the same
    on every rank already: all take the same steps.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    stats = [
        buffer
        for bn in batchnorms(model)
        for buffer in (bn.running_mean, bn.running_var)
        if buffer is not None
    ]
    if not stats:
        return
    flat = torch.cat([s.flatten() for s in stats])  # one collective, not one per layer
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat.div_(dist.get_world_size())
    for s, mean in zip(stats, flat.split([s.numel() for s in stats]), strict=True):
        s.copy_(mean.view_as(s))
