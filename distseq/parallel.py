"""Process group set-up and model wrapping: FSDP2 ``fully_shard``, DDP, or nothing; the
collectives the rest of the package needs; and its one voice, rank 0's (``say``).

The only module that talks to ``torch.distributed`` (a contract ``lint-imports`` keeps). gloo on
CPU and NCCL on GPU run the same code. FSDP1 (``FullyShardedDataParallel``) is not
offered: with fairscale's checkpoint wrapper it either crashes or silently leaves the CNN
without updates (docs/design.md, "FSDP1 fails silently").
"""

from __future__ import annotations

import fcntl
import gc
import os
import socket
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from typing import TextIO, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from distseq.config import ParallelMode, Precision
from distseq.errors import ConfigError, ModelError
from distseq.model.norms import batchnorms
from distseq.model.video import FeatureModel, VideoModel

_meshes: list[DeviceMesh] = []  # this process's FSDP2 meshes, until close_distributed


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(timeout_s: float = 600.0) -> DistInfo:
    """Join the torchrun group when launched by torchrun; otherwise run as a single process."""
    if "RANK" not in os.environ:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return DistInfo(0, 1, device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        # A bounded timeout turns a rank stuck in a collective into an error instead of a hang.
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return DistInfo(dist.get_rank(), dist.get_world_size(), device)


def rank_world() -> tuple[int, int]:
    """(rank, world size) of the process group; (0, 1) without one."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def say(text: str, file: TextIO | None = None) -> None:
    """Print ``text`` (to ``file``, stdout by default) on rank 0 alone: the package's one voice
    (docs/design.md, "One voice"); the other ranks print only errors, which name their rank.
    Above a progress bar if one is running: tqdm's write clears the bar and draws it again."""
    if rank_world()[0] == 0:
        out = file or sys.stdout
        tqdm.write(text, file=out)
        out.flush()


def _interface(address: str) -> str:
    """The name of this host's interface that has ``address`` (SIOCGIFADDR per interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                request = struct.pack("256s", name.encode()[:15])
                found = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            if found == address:
                return name
    return "an interface this host does not list"


_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


@dataclass(frozen=True)
class Node:
    """One host of the group, as its ranks see it."""

    host: str
    address: str  # of its route to the group's store
    interface: str  # that address's
    told: str  # "GLOO_SOCKET_IFNAME=..., NCCL_SOCKET_IFNAME=..." as set there
    ranks: tuple[int, ...]

    def __str__(self) -> str:
        told = f", {self.told}" if self.told else ""
        r = self.ranks
        ranks = f"ranks {r[0]}-{r[-1]}" if len(r) > 1 else f"rank {r[0]}"
        return f"{self.host} {self.address} ({self.interface}{told}; {ranks})"


def nodes() -> list[Node]:
    """Every node of the group (a collective): where its ranks talk from; [] without a group."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))  # UDP: no packet
        address = s.getsockname()[0]
    told = [
        f"{k}={os.environ[k]}"
        for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
        if k in os.environ
    ]
    me = (socket.gethostname(), address, _interface(address), ", ".join(told))
    ranks: dict[tuple[str, str, str, str], list[int]] = {}
    for rank, node in enumerate(all_gather_objects([me])):
        ranks.setdefault(node, []).append(rank)
    return [Node(*node, tuple(r)) for node, r in ranks.items()]


def nodes_line(found: list[Node]) -> str:
    """The start-up line naming each node and where it talks from; "" on one node. A wrong
    address or interface is how a multi-node run hangs (docs/launching.md)."""
    if len(found) < 2:
        return ""
    store = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    return f"{len(found)} nodes, store {store}: " + ", ".join(map(str, found))


def is_collective_failure(error: BaseException) -> bool:
    """A collective that timed out or lost its peer (gloo, NCCL), as opposed to a bug."""
    text = str(error)
    # gloo's words for a peer gone, as they have changed: "Application timeout caused pair
    # closure" came from an all-reduce while a link was down (seen once in CI, in a save).
    lost = (
        "Timed out",
        "timed out",
        "Application timeout",
        "Connection closed by peer",
        "Connection reset by peer",
    )
    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and any(word in text for word in lost)
    )


def unreachable(found: list[Node], seconds: float = 3.0) -> list[Node]:
    """The other nodes that do not answer a TCP connection from here within ``seconds``: a
    closed port answers at once (refused), a host or link that is gone does not."""
    here = socket.gethostname()
    lost = []
    for node in found:
        if node.host == here:
            continue
        try:
            socket.create_connection((node.address, 9), timeout=seconds).close()
        except ConnectionRefusedError:
            continue  # it answered
        except OSError:
            lost.append(node)
    return lost


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def close_distributed() -> None:
    """Leave the process group and free it now, while the interpreter is whole.

    A group that outlives this is freed during the interpreter's finalization instead, where
    now and then the process aborted ("terminate called without an active exception", SIGABRT;
    likely a gloo thread taking the GIL there, ended inside C++) and torchrun reported a
    finished job as failed: 4 of 30 runs of `bench traffic` in one series here, 1 of 5 of its
    test in another, none in 48 more. Two things kept the group: torch 2.14's DeviceMesh holds
    its groups (``_pg_registry``) and DTensor's caches hold the mesh; and FSDP2's modules hold
    them in reference cycles, which only the collector frees. A module the caller still holds
    keeps its group all the same: close after letting go of it.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    for mesh in _meshes:
        vars(mesh).get("_pg_registry", {}).clear()  # an older torch may have none
    _meshes.clear()
    gc.collect()


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
) -> nn.Module:
    """``model`` on this rank's device, sharded (``mode="fsdp"``, FSDP2), replicated (``"ddp"``)
    or as it is (``"none"``) across the torchrun group; as it is without one. ``precision``:
    "auto" (bf16 on GPU, fp32 on CPU), "bf16" (FSDP2 only) or "fp32"; gradients reduce in fp32.
    ``frozen_steps``: some steps give some parameters no gradient (``backbone_frozen``), which
    DDP must then look for after every backward (FSDP2 needs nothing).

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
    mesh = init_device_mesh(info.device.type, (info.world,))
    _meshes.append(mesh)  # for close_distributed
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
