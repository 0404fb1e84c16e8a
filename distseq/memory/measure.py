"""Measurements of one training step: the bytes autograd saves, the peak memory, the wall time.

The memory ones back the design's memory contract, the planner's probe, the demo's table and
``bench``, so each counts something exact and repeatable (bytes of tensors) rather than sampling
the process (RSS). Times are the fastest of a few runs, since noise only ever adds time.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType

import torch
import torch.nn.functional as F
from torch import nn
from torch._C import _autograd as _ag
from torch._C import _profiler as _prof
from torch.autograd.graph import saved_tensors_hooks
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = [
    "SavedTensorBytes",
    "StepCost",
    "fastest_seconds",
    "measure_step",
    "peak_and_seconds",
    "peak_memory",
    "synchronize",
]


def _storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    # A wrapper subclass (DTensor, ...) owns no memory itself; its inner tensors do. torch 2.14's
    # DTensor names its device mesh among them, which is no tensor.
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()
        inner = [getattr(t, a) for a in attrs]
        return [s for x in inner if isinstance(x, torch.Tensor) for s in _storages(x)]
    return [t.untyped_storage()]


class SavedTensorBytes:
    """Count the bytes of tensors that autograd saves for backward inside the block.

    Each storage is counted once, however many tensors or views of it are saved, so the number is
    the memory the saved tensors keep alive. Inputs that are saved count too; so do parameters,
    unless passed as ``exclude`` (to count activations only).
    Under non-reentrant checkpointing only what is saved outside the recompute is seen, so this
    is not the peak: use :func:`peak_memory` for that.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self.bytes = 0
        self._excluded = {(s.device, s.data_ptr()) for t in exclude for s in _storages(t)}
        # Keyed by address, with a weak ref so that a storage freed and its address reused
        # inside the block (e.g. after a backward) is counted as the new storage it is.
        self._seen: dict[tuple[torch.device, int], StorageWeakRef] = {}
        self._hooks: saved_tensors_hooks | None = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":  # meta tensors own no memory and all share address 0
            for s in _storages(t):
                key = (s.device, s.data_ptr())
                if key in self._excluded:
                    continue
                ref = self._seen.get(key)
                # StorageWeakRef is untyped in torch's source.
                if ref is None or ref.expired():  # type: ignore[no-untyped-call, unused-ignore]
                    new = StorageWeakRef(s)  # type: ignore[no-untyped-call, unused-ignore]
                    self._seen[key] = new
                    self.bytes += s.nbytes()
        # detach: returning the tensor itself would make a saved output hold its own grad_fn,
        # a C++ reference cycle that leaks the graph when no backward runs. Autograd re-attaches
        # the grad_fn on unpack, so gradients (double backward too) are unchanged.
        return t.detach()

    def __enter__(self) -> SavedTensorBytes:
        self._hooks = saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._hooks is not None
        self._hooks.__exit__(exc_type, exc, tb)
        self._hooks = None
        # The weak refs are only needed while packing; drop them so the counter holds nothing.
        self._seen.clear()


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


def peak_memory(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes of tensor memory allocated on ``device`` while ``fn()`` runs, above the start.

    CUDA: the caching allocator's ``max_memory_allocated`` minus the allocation at the start.
    CPU: the maximum, over time, of the bytes allocated inside ``fn`` and not yet freed, from
    the allocation events the profiler records (see :func:`_cpu_peak`).
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    if device.type == "cpu":
        return _cpu_peak(fn)
    raise ValueError(f"peak_memory: unsupported device {device}")


@contextmanager
def _native_stderr_off() -> Iterator[None]:
    """File descriptor 2 to /dev/null: kineto writes two "USDT ... profiler_start/stop" lines
    to it at every start and stop, whatever KINETO_LOG_LEVEL says, which a memory plan's probe
    would print into a training run's log. Errors still come back as Python exceptions."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cpu_peak(fn: Callable[[], object]) -> int:
    """Exact CPU peak from the allocation events the profiler records.

    The CPU allocator reports each allocation and free to an active profiler that has
    ``profile_memory`` on. Those are byte counts, not samples, so the peak is the same on every
    run of the same code. The profiler is started through torch's private entry point because
    only that one takes ``scopes``: restricting op recording to a scope nothing on CPU uses (the
    lite interpreter) skips recording every op, which cut the overhead by about 3x on a graph of
    80k small ops, and leaves only the memory events to walk.

    Only frees of blocks allocated inside ``fn`` count, matched by address. The allocator's
    size table outlives a profiling session, so a block allocated in an earlier session (or
    at an address one had used) is reported freed with a stale size: trusting those frees made
    the "peak" of a step depend on what ran before (44 to 78 MiB for a true 85). So it is the
    peak of what ``fn`` itself allocated and still held; a free inside ``fn`` of memory that
    existed before it does not lower it, as it would on CUDA.

    Not seen: allocations outside the CPU allocator (oneDNN's own scratch memory) and on threads
    the profiler does not follow. Cannot run inside another profiler.
    """
    if _ag._profiler_enabled():
        raise RuntimeError("peak_memory cannot run while another torch profiler is active")
    # Kineto logs a spurious "gpuGetDeviceCount failed" ERROR on a CUDA build without a GPU;
    # this only takes effect before its first use and leaves a user's own setting alone.
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    config = _prof.ProfilerConfig(
        _prof.ProfilerState.KINETO,
        False,  # report_input_shapes
        True,  # profile_memory
        False,  # with_stack
        False,  # with_flops
        False,  # with_modules
        _prof._ExperimentalConfig(),
    )
    activities = {_prof.ProfilerActivity.CPU}
    # The stubs omit the third (scopes) parameter that the binding has in torch 2.14.
    scopes = {_prof.RecordScope.LITE_INTERPRETER}
    with _native_stderr_off():
        _ag._prepare_profiler(config, activities)
        _ag._enable_profiler(config, activities, scopes)  # type: ignore[call-arg]
    try:
        fn()
    finally:
        with _native_stderr_off():
            result = _ag._disable_profiler()

    allocations: list[tuple[int, int, int]] = []  # (time, address, bytes; negative for a free)
    stack = result.experimental_event_tree()
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        fields = event.extra_fields
        if isinstance(fields, _prof._ExtraFields_Allocation) and fields.device.type == "cpu":
            allocations.append((event.start_time_ns, fields.ptr, fields.alloc_size))
    # Events of one thread are recorded in order; a stable sort on time alone keeps a free that
    # shares a timestamp with an allocation in the order they happened.
    allocations.sort(key=lambda a: a[0])
    live: dict[int, int] = {}
    current = peak = 0
    for _, ptr, nbytes in allocations:
        if nbytes > 0:
            live[ptr] = nbytes
            current += nbytes
            peak = max(peak, current)
        elif ptr in live:
            current -= live.pop(ptr)
    return peak


@dataclass(frozen=True)
class StepCost:
    peak_bytes: int  # tensor memory over one training step, above what existed before it
    saved_bytes: int  # activations kept from forward to backward, outside recompute
    seconds: float  # wall time of the step, after a warm-up step


def measure_step(
    model: nn.Module,
    frames: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor,
    timings: int = 1,
) -> StepCost:
    """One forward and backward of the per-frame loss, as ``bench memory`` measures it:
    exact peak bytes (profiler allocation events on CPU, the allocator's on CUDA), and the
    fastest of ``timings`` timed runs."""

    def loss() -> torch.Tensor:
        logits = model(frames, mask).float()
        stages = logits.shape[0] if logits.dim() == 4 else 1  # a multi-stage head's, each
        return F.cross_entropy(logits.flatten(0, -2), labels.flatten().repeat(stages))

    def step() -> None:
        loss().backward()
        model.zero_grad(set_to_none=True)

    step()  # warm-up: allocator, thread pools, cuDNN autotuning
    with SavedTensorBytes(exclude=model.parameters()) as saved:
        loss()
    peak, seconds = peak_and_seconds(step, frames.device, timings)
    return StepCost(peak, saved.bytes, seconds)


def peak_and_seconds(
    step: Callable[[], object], device: torch.device, timings: int = 1
) -> tuple[int, float]:
    """The peak bytes of ``step()`` (:func:`peak_memory`) and its wall time, the fastest of
    ``timings`` more runs without the profiler; the caller has warmed it up."""
    return peak_memory(step, device), fastest_seconds(step, device, timings)


def fastest_seconds(step: Callable[[], object], device: torch.device, runs: int) -> float:
    """The wall time of the fastest of ``runs`` runs of ``step()``: noise only ever adds time."""
    seconds = []
    for _ in range(runs):
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s queued work, so that a wall time covers it; nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
