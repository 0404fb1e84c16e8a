"""The collectives the rest of the package calls: small flags and sums, rank 0's decision for
all, and the package's own records gathered. Each is a no-op without a group."""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.distributed as dist


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank; every rank must call this (one tiny all-reduce)."""
    if not dist.is_initialized():
        return flag
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )
    value = torch.tensor([float(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return bool(value.item() > 0)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def from_rank_zero(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's ``x`` on every rank, in place: one decision (a measured plan) for all."""
    if dist.is_initialized():
        dist.broadcast(x, src=0)
    return x


T = TypeVar("T")


def all_gather_objects(items: list[T]) -> list[T]:
    """Every rank's ``items``, in rank order, on every rank; ``items`` without a group. Only for
    the package's own small records (pickled on the way): never shard data."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(items)
    parts: list[list[T] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, items)
    return [item for part in parts for item in part or []]
