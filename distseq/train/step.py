"""One optimizer step's forward and backward, gradient checks and clipping."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from distseq.config import LossConfig
from distseq.data.batch import Batch
from distseq.errors import TrainingError
from distseq.model.head import Carry
from distseq.parallel import all_reduce_sum, gradient_sync
from distseq.train.loss import Loss


def check_every_parameter_has_grad(model: nn.Module, frozen: Sequence[nn.Parameter] = ()) -> None:
    """Fail loudly where checkpointing or sharding would silently stop a part from learning;
    ``frozen``: parameters that train later (optim.groups' frozen_until)."""
    later = {id(p) for p in frozen}
    missing = [
        n
        for n, p in model.named_parameters()
        if p.requires_grad and p.grad is None and id(p) not in later
    ]
    if missing:
        raise TrainingError(
            f"{len(missing)} parameters got no gradient after the first step "
            f"(e.g. {missing[0]}); refusing to train a model that cannot learn"
        )


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):  # sharded gradients: the local norm is a partial result
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, norm)
    return float(norm)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[Batch],
    world: int,
    carries: dict[int, Carry] | None = None,
    loss: Loss | None = None,
) -> tuple[float, int]:
    """Forward and backward over the micro-batches of one optimizer step.

    Returns the loss over the global batch (train/loss.py: a mean per labelled frame, or per
    weight) and the global count of real frames (labelled or not). Each rank's loss is scaled so
    that the gradient average that DDP and FSDP perform gives exactly the gradient of the global
    loss, whatever the padding and the unlabelled frames on each rank.

    ``carries`` (ordered mode): the RNN state of each loader worker's lanes, carried across
    batches; each worker's batches continue its own videos. ``loss``: plain cross-entropy if
    None.
    """
    loss = loss or Loss(LossConfig(), None)
    counts = all_reduce_sum(
        torch.stack([loss.counts(b.labels, b.mask) for b in micro_batches]).sum(0)
    )
    sums = torch.zeros(2, dtype=torch.float64, device=micro_batches[0].mask.device)
    for i, batch in enumerate(micro_batches):
        carry = None if carries is None else carries.setdefault(batch.worker, Carry())
        if carry is not None:
            carry.reset(batch.starts)
        with gradient_sync(model, enabled=i == len(micro_batches) - 1):
            ce, smooth = loss.sums(model(batch.frames, batch.mask, carry), batch.labels, batch.mask)
            (loss.total(ce, smooth, counts) * world).backward()
        sums += torch.stack([ce.detach(), smooth.detach()]).double()
    ce, smooth = all_reduce_sum(sums).unbind()
    return float(loss.total(ce, smooth, counts)), int(counts[0])
