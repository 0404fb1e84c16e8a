"""Wrapping a model for the group: FSDP2 ``fully_shard``, DDP, or nothing; and skipping the
gradient reduction on an accumulated step's first micro-batches.

FSDP1 (``FullyShardedDataParallel``) is not offered: with fairscale's checkpoint wrapper it
either crashes or silently leaves the CNN without updates (docs/design.md, "FSDP1 fails
silently").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from distseq.config import ParallelMode, Precision
from distseq.errors import ConfigError, ModelError
from distseq.model.video import FeatureModel, VideoModel
from distseq.parallel.group import DistInfo, device_mesh, init_distributed
from distseq.parallel.sequence import SequenceSplit


def _param_dtype(precision: Precision, device: torch.device) -> torch.dtype | None:
    if precision is Precision.bf16 or (precision is Precision.auto and device.type == "cuda"):
        return torch.bfloat16
    return None


E = TypeVar("E", bound=Enum)


def _choice(enum: type[E], value: E | str, name: str) -> E:
    """``value`` of the argument ``name`` as ``enum``'s member. A bad one is the caller's
    ModelError, as a bad ``recompute=`` is ChunkedModel's: ``distseq train`` checks its config's
    values before they get here."""
    try:
        return enum(value)
    except ValueError:
        raise ModelError(f"{name}={value!r}: must be one of {[e.value for e in enum]}") from None


def parallelize(
    model: VideoModel | FeatureModel,
    mode: ParallelMode | str = ParallelMode.fsdp,
    precision: Precision | str = Precision.auto,
    info: DistInfo | None = None,
    *,
    frozen_steps: bool = False,
    sequence: int = 1,
) -> nn.Module:
    """``model`` on this rank's device, sharded (``mode="fsdp"``, FSDP2), replicated (``"ddp"``)
    or as it is (``"none"``) across the torchrun group; as it is without one. ``precision``:
    "auto" (bf16 on GPU, fp32 on CPU), "bf16" (FSDP2 only) or "fp32"; gradients reduce in fp32.
    ``frozen_steps``: some steps give some parameters no gradient (``backbone_frozen``), which
    DDP must then look for after every backward (FSDP2 needs nothing). ``sequence``: S > 1
    splits each sequence's frames across groups of S consecutive ranks (parallel/sequence.py),
    which must all be given the same batch (:meth:`DistInfo.data_rank`); FSDP2 or DDP still
    span every rank.

    Parameter names stay those of ``model``: FSDP2 and DDP both keep them in ``state_dict``.
    FSDP2 shards the head as one unit and the rest, the backbone and the chunk loop, as the root:
    the backbone's parameters are gathered once a step, however many chunks run.
    """
    mode = _choice(ParallelMode, mode, "mode")
    precision = _choice(Precision, precision, "precision")
    if precision is Precision.bf16 and mode is not ParallelMode.fsdp:
        raise ModelError(f"precision='bf16' needs mode='fsdp', not {mode.value!r}")
    info = info or init_distributed()
    model.to(info.device)
    split = _split(model, sequence, info)
    wrapped = _wrap(model, mode, precision, info, frozen_steps)
    # Only now, once nothing can raise: a call that raised leaves the model as it was, and a
    # later call without a split takes off an earlier one's.
    if isinstance(model, VideoModel):
        model.split = split
    return wrapped


def _wrap(
    model: VideoModel | FeatureModel,
    mode: ParallelMode,
    precision: Precision,
    info: DistInfo,
    frozen_steps: bool,
) -> nn.Module:
    if not dist.is_initialized():
        return model
    if mode is ParallelMode.none:
        if info.world > 1:
            raise ConfigError(
                f"config key parallel.mode=none: {info.world} ranks would train "
                f"{info.world} unrelated models; use fsdp or ddp"
            )
        return model
    if mode is ParallelMode.ddp:
        ids = [info.device.index] if info.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=frozen_steps)
    mp = MixedPrecisionPolicy(
        param_dtype=_param_dtype(precision, info.device), reduce_dtype=torch.float32
    )
    mesh = device_mesh(info.device, (info.world,))
    # The head is one unit (RNN + classifier): a batch_first nn.LSTM sharded on its own returns a
    # transposed view, which FSDP2 warns about on every forward. The head's output is made a
    # fresh tensor before FSDP2's own hook sees it: an nn.Linear over [B, T, F] returns a view,
    # and an in-place op on the model's output (logits.masked_fill_(...), masking padding) then
    # skipped the pre-backward all-gather and failed backward ("setStorage: ... storage of
    # size 0"). The copy is the logits', B x T x K.
    model.head.register_forward_hook(_fresh_output)
    fully_shard(model.head, mesh=mesh, mp_policy=mp)
    # The backbone's parameters belong to the root unit, the module that owns the chunk loop
    # (memory.ChunkedModel): they are gathered once per step, however many chunks and recomputes
    # run, and not resharded between forward and backward, which would gather them again.
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def _split(model: VideoModel | FeatureModel, sequence: int, info: DistInfo) -> SequenceSplit | None:
    """``model``'s sequence group's split (None at ``sequence=1``), or one line on why it cannot
    take one."""
    # bool is an int, and True == 1: sequence=True would quietly be no split.
    if not isinstance(sequence, int) or isinstance(sequence, bool) or sequence < 1:
        raise ModelError(f"sequence={sequence!r}: a whole number of ranks >= 1")
    if sequence == 1:
        return None
    if not isinstance(model, VideoModel):
        raise ModelError(
            f"sequence={sequence}: a {type(model).__name__} runs no CNN, so there is no frame "
            "work to split; split the batch instead (sequence=1)"
        )
    if info.world % sequence:
        raise ModelError(
            f"sequence={sequence} does not divide the {info.world} ranks of this group"
        )
    mesh = device_mesh(info.device, (info.world // sequence, sequence), ("data", "sequence"))
    return SequenceSplit(model, mesh.get_group("sequence"))


def _fresh_output(module: nn.Module, args: object, output: object) -> object:
    """A forward hook: ``output`` with each tensor that is a view of another copied (a stateful
    head's ``(logits, state)`` too), so that in-place ops after FSDP2's hooks are safe."""
    if isinstance(output, torch.Tensor):
        return output.clone() if output._base is not None else output
    if isinstance(output, tuple):
        return tuple(_fresh_output(module, args, item) for item in output)
    return output


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient reduction on all but the last micro-batch of an accumulated step."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    elif isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
    else:
        yield
