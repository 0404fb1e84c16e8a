"""distseq.memory.measure: exact saved bytes and exact CPU peak (collectives: tests/integration)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

from distseq.memory.measure import SavedTensorBytes, peak_memory

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
