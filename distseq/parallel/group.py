"""The process group: joining it (or running as one process), who this process is in it, the
package's one voice (rank 0's ``say``), the device meshes made over it, and leaving it."""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import TextIO

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from tqdm import tqdm

from distseq.data.batch import Part

_meshes: list[DeviceMesh] = []  # this process's meshes, until close_distributed


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def data_rank(self, sequence: int = 1) -> tuple[int, int]:
        """(rank, world) of this process among those that take batches of their own: under a
        sequence split (``parallelize(..., sequence=S)``) the S consecutive ranks of a group
        share one batch."""
        return self.rank // sequence, self.world // sequence

    def data_part(self, sequence: int, unit: int) -> Part | None:
        """This rank's part of each batch's frames under a sequence split (the slice it runs,
        in chunks of ``unit`` frames); None without one."""
        return Part(self.rank % sequence, sequence, unit) if sequence > 1 else None


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


def device_mesh(
    device: torch.device, shape: tuple[int, ...], names: tuple[str, ...] | None = None
) -> DeviceMesh:
    """A mesh over the whole group, kept so that :func:`close_distributed` can free it."""
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
    _meshes.append(mesh)
    return mesh


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
