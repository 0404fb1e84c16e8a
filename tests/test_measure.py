"""Tests for distseq.measure: exact saved bytes, exact CPU peak, real FSDP2 collectives."""

from __future__ import annotations

import gc
import json
import textwrap
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import launch_torchrun
from distseq.measure import SavedTensorBytes, peak_memory

CPU = torch.device("cpu")
MiB = 1 << 20


# --- SavedTensorBytes -------------------------------------------------------------------------


def test_saved_bytes_known_graph() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    for _ in range(2):  # repeatable: the same graph gives the same number
        with SavedTensorBytes() as saved:
            y = (x * w).sum()  # mul saves both operands (each needs the other's grad); sum nothing
        assert saved.bytes == x.nbytes + w.nbytes == 64
        x.grad = w.grad = None
        torch.autograd.backward(y)  # the hooks hand the tensors back unchanged
        assert torch.equal(x.grad, w.expand(3, 4))  # type: ignore[arg-type]
        assert torch.equal(w.grad, x.detach().sum(0))  # type: ignore[arg-type]


def test_saved_bytes_can_exclude_parameters() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(4))
    with SavedTensorBytes(exclude=[w]) as saved:
        (x * w).sum()
    assert saved.bytes == x.nbytes == 48


def test_saved_bytes_deduplicates_by_storage() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    with SavedTensorBytes() as saved:
        (x * x).sum()  # x saved twice
        (x.view(12) * x.view(2, 6).reshape(12)).sum()  # two views of x's storage
    assert saved.bytes == x.nbytes
    with SavedTensorBytes() as saved:
        x.exp().sum()  # exp saves its output: a new storage
        x.sin().sum()  # sin saves its input, x
    assert saved.bytes == 2 * x.nbytes


def test_saved_bytes_counts_a_reused_address_again() -> None:
    # Once a saved storage is freed its address is often reused by the next one: that is new
    # memory and must count, not be taken for the storage already seen.
    ptrs: set[int] = set()
    with SavedTensorBytes() as saved:
        for _ in range(8):
            a = torch.randn(1024, requires_grad=True)
            ptrs.add(a.data_ptr())
            torch.autograd.backward(a.sin().sum())  # sin saves its input
            del a
    assert saved.bytes == 8 * 1024 * 4
    if len(ptrs) == 8:
        pytest.skip("the allocator reused no address, so the case under test did not occur")


def test_saved_bytes_does_not_leak_the_graph() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    with SavedTensorBytes() as saved:
        y = x.exp()  # saves its own output: must not keep y (and its graph) alive
    ref = weakref.ref(y)
    del y
    gc.collect()
    assert ref() is None
    assert saved.bytes == x.nbytes


# --- peak_memory ------------------------------------------------------------------------------


def _alloc(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


def test_cpu_peak_is_exact_and_includes_freed_memory() -> None:
    keep = _alloc(16 * MiB)  # allocated before: not part of the peak

    def fn() -> None:
        a = _alloc(4 * MiB)
        b = _alloc(8 * MiB)  # 12 MiB live: the peak
        del a
        c = _alloc(2 * MiB)  # 10 MiB live
        del b, c  # all freed before fn returns, so the end value is 0

    assert peak_memory(fn, CPU) == 12 * MiB
    assert peak_memory(fn, CPU) == 12 * MiB
    del keep


def test_cpu_peak_is_a_running_maximum() -> None:
    def fn() -> torch.Tensor:
        a = _alloc(6 * MiB)  # 6 MiB live: the peak
        del a
        b = _alloc(3 * MiB)
        c = _alloc(2 * MiB)  # 5 MiB live: less than the 11 MiB allocated in all
        del b
        return c  # still live when fn returns: counted like the rest

    assert peak_memory(fn, CPU) == 6 * MiB


def test_cpu_peak_of_conv_net_step_is_repeatable() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 2),
    )

    def peaks(batch: int) -> list[int]:
        x = torch.randn(batch, 3, 32, 32)

        def step() -> None:
            net.zero_grad(set_to_none=True)  # frees the last step's gradients: not counted
            net(x).sum().backward()

        out = []
        for _ in range(3):
            step()  # an unmeasured step in between must not change the next measurement
            out.append(peak_memory(step, CPU))
            out.append(peak_memory(step, CPU))
        return out

    small = peaks(4)
    assert small == [small[0]] * len(small)
    # The ReLU reads the first conv's output while writing its own: both are live at once.
    assert small[0] >= 2 * (4 * 8 * 32 * 32 * 4)
    assert peaks(8)[0] > small[0]


def test_cpu_peak_passes_exceptions_and_stops_profiling() -> None:
    def boom() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        peak_memory(boom, CPU)
    assert peak_memory(lambda: _alloc(MiB), CPU) == MiB  # the profiler was stopped


def test_peak_memory_rejects_other_devices() -> None:
    with pytest.raises(ValueError, match="meta"):
        peak_memory(lambda: None, torch.device("meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_peak_is_exact() -> None:
    cuda = torch.device("cuda")

    def fn() -> None:
        a = torch.empty(4 * MiB, dtype=torch.uint8, device=cuda)
        b = torch.empty(8 * MiB, dtype=torch.uint8, device=cuda)
        del a, b

    assert peak_memory(fn, cuda) == 12 * MiB


# --- CollectiveCounter in a real 2-process gloo run ------------------------------------------

_SCRIPT = """
import json
import os
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from distseq.measure import CollectiveCounter

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
group_bytes = [sum(p.nbytes for p in model[i].parameters()) for i in (0, 2)]
fully_shard(model[0])
fully_shard(model[2])
fully_shard(model)  # the root holds no parameters of its own: no collectives for it
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(3, 8)

with CollectiveCounter() as fwd:
    loss = model(x).sum()
with CollectiveCounter() as bwd:
    loss.backward()
with CollectiveCounter() as step:
    opt.step()  # on the sharded DTensor parameters: local, no traffic

with CollectiveCounter() as ar:
    a = torch.arange(6, dtype=torch.float64)
    dist.all_reduce(a)
    b = torch.ones(5)
    dist.all_reduce(b)
ok = torch.equal(a, 2 * torch.arange(6, dtype=torch.float64)) and torch.equal(b, 2 * torch.ones(5))

mesh = init_device_mesh("cpu", (2,))
dt = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
with CollectiveCounter() as dtensor:
    full = dt.redistribute(mesh, [Replicate()]).to_local()
ok = ok and torch.equal(full, torch.arange(8.0))

ddp = DistributedDataParallel(nn.Linear(8, 4))
with CollectiveCounter() as ddp_bwd:
    ddp(x).sum().backward()

res = {"group_bytes": group_bytes, "values_ok": ok}
counters = {"fwd": fwd, "bwd": bwd, "step": step, "ar": ar, "dtensor": dtensor, "ddp": ddp_bwd}
for name, c in counters.items():
    res[name] = {"counts": dict(c.counts), "bytes": dict(c.bytes), "log": c.log}
with open(f"result{rank}.json", "w") as f:  # a file each: prints of two ranks interleave
    json.dump(res, f)
dist.barrier()
dist.destroy_process_group()
# A process that used DDP on gloo sometimes aborts in C++ teardown at interpreter exit
# ("terminate called without an active exception", no Python frame); all is done, so skip it.
os._exit(0)
"""


def test_collective_counter_sees_fsdp2_and_explicit_collectives(tmp_path: Path) -> None:
    script = tmp_path / "collectives.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    # standalone: a free port, so runs never collide
    proc = launch_torchrun(script, 2, tmp_path, launcher_args=["--standalone"], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"result{rank}.json").read_text()) for rank in (0, 1)]

    for res in results:
        g0, g2 = res["group_bytes"]
        assert (g0, g2) == ((8 * 8 + 8) * 4, (8 * 4 + 4) * 4)
        # Forward: one all-gather per FSDP group with parameters, each its full parameter bytes.
        assert res["fwd"]["counts"] == {"all_gather": 2}
        assert res["fwd"]["log"] == [["all_gather", g0], ["all_gather", g2]]
        # Backward: both groups were resharded after forward, so each is gathered again, and
        # each group's gradients are reduce-scattered once.
        assert res["bwd"]["counts"] == {"all_gather": 2, "reduce_scatter": 2}
        assert res["bwd"]["bytes"] == {"all_gather": g0 + g2, "reduce_scatter": g0 + g2}
        assert res["step"]["counts"] == {}
        # Explicit all-reduces: exact message bytes, and the values were really reduced.
        assert res["ar"]["counts"] == {"all_reduce": 2}
        assert res["ar"]["bytes"] == {"all_reduce": 6 * 8 + 5 * 4}
        assert res["values_ok"]  # the collectives really ran
        # DTensor's own collectives (here a functional all-gather) are seen too.
        assert res["dtensor"]["log"] == [["all_gather", 8 * 4]]
        # DDP's C++ reducer: one bucket with the Linear's weight and bias gradients.
        assert res["ddp"]["log"] == [["all_reduce", g2]]
