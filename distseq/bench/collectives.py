"""Exact, repeatable counts of the collectives one training step issues.

They back the communication contract in the design, so they count dispatcher calls rather than
sampling the process. Memory measurements are in ``distseq.memory.measure``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["CollectiveCounter"]


# Dispatcher ops that move data, by the kind of collective they are. c10d:: ops are what
# ProcessGroup methods (and so every torch.distributed function, FSDP2 and DDP's C++ reducer)
# dispatch to; _c10d_functional:: ops are the functional collectives (DTensor, compiled code).
_KINDS: dict[str, str] = {
    "c10d::_allgather_base_": "all_gather",
    "c10d::allgather_": "all_gather",
    "c10d::allgather_coalesced_": "all_gather",
    "c10d::allgather_into_tensor_coalesced_": "all_gather",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d::allreduce_": "all_reduce",
    "c10d::allreduce_coalesced_": "all_reduce",
    "c10d::broadcast_": "broadcast",
    "c10d::reduce_": "reduce",
    "c10d::gather_": "gather",
    "c10d::gather_into_tensor_": "gather",
    "c10d::scatter_": "scatter",
    "c10d::alltoall_": "all_to_all",
    "c10d::alltoall_base_": "all_to_all",
    "c10d::barrier": "barrier",
    "c10d::monitored_barrier_": "barrier",
    "c10d::send": "send",
    "c10d::recv_": "recv",
    "c10d::recv_any_source_": "recv",
    "_c10d_functional::all_gather_into_tensor": "all_gather",
    "_c10d_functional::all_gather_into_tensor_out": "all_gather",
    "_c10d_functional::all_gather_into_tensor_coalesced": "all_gather",
    "_c10d_functional::reduce_scatter_tensor": "reduce_scatter",
    "_c10d_functional::reduce_scatter_tensor_out": "reduce_scatter",
    "_c10d_functional::reduce_scatter_tensor_coalesced": "reduce_scatter",
    "_c10d_functional::all_reduce": "all_reduce",
    "_c10d_functional::all_reduce_": "all_reduce",
    "_c10d_functional::all_reduce_coalesced": "all_reduce",
    "_c10d_functional::all_reduce_coalesced_": "all_reduce",
    "_c10d_functional::broadcast": "broadcast",
    "_c10d_functional::broadcast_": "broadcast",
    "_c10d_functional::all_to_all_single": "all_to_all",
    "_c10d_functional::isend": "send",
    "_c10d_functional::irecv": "recv",
    "_c10d_functional::batch_p2p_ops": "p2p",
}
# Ops in those namespaces that move nothing; any other unknown one is counted under its name so
# that a new collective is never silently missed.
_NOT_COMM = {
    "c10d::check_for_nan",
    "_c10d_functional::wait_tensor",
    "_c10d_functional::_wrap_tensor_autograd",
}


def _deferred_subclasses() -> tuple[type, ...]:
    # DTensor turns its ops into plain ops and its own collectives (redistribute); deferring to
    # it lets those come back through the mode to be counted. Other subclasses (FakeTensor under
    # DTensor's sharding propagation, AsyncCollectiveTensor) must simply be passed through: a
    # FakeTensor defers to its active fake mode, and both deferring would fail the dispatch.
    if not torch.distributed.is_available():
        return ()
    from torch.distributed.tensor import DTensor

    return (DTensor,)


def _tensor_bytes(x: object) -> int:
    return sum(t.nbytes for t in tree_leaves(x) if isinstance(t, torch.Tensor))


class CollectiveCounter(TorchDispatchMode):  # type: ignore[no-untyped-call, unused-ignore]
    """Count the collectives this process issues inside the block, per kind.

    ``counts[kind]`` is the number of ops; ``bytes[kind]`` the sum of their message sizes, where
    a message is the full (unsharded) buffer: an all-gather's output, a reduce-scatter's input,
    an all-reduce's tensor. ``log`` lists ``(kind, bytes)`` in issue order.

    It is a dispatch mode, so it sees the collectives at the dispatcher whatever Python or C++
    code issued them (FSDP2's ``all_gather_single``/``reduce_scatter_single``, DDP's reducer,
    functional collectives). On gloo the backend's own trace names would mislead: it runs a
    reduce-scatter as an all-reduce. Async ops count when issued. Collectives issued from other
    threads are not seen (modes are thread-local; autograd's backward inherits the mode).
    Costs about 7 to 10 us per aten op in the block (Python runs for each).
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call, unused-ignore]
        self.counts: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)
        self.log: list[tuple[str, int]] = []
        self._defer = _deferred_subclasses()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if any(issubclass(t, self._defer) for t in types):
            return NotImplemented
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name
        if name.startswith(("c10d::", "_c10d_functional::")) and name not in _NOT_COMM:
            kind = _KINDS.get(name, name)
            self.counts[kind] += 1
            nbytes = self._message_bytes(func, args, kwargs, out)
            self.bytes[kind] += nbytes
            self.log.append((kind, nbytes))
        return out

    @staticmethod
    def _message_bytes(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
        # The full buffer is the largest of: the output arguments (c10d all-gather), the other
        # tensor arguments (reduce-scatter input, in-place all-reduce), or what the op returns
        # (functional all-gather). Summing them all would count the in-place buffers twice.
        outputs = inputs = 0
        for i, arg in enumerate(func._schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            if "output" in arg.name:
                outputs += _tensor_bytes(value)
            else:
                inputs += _tensor_bytes(value)
        return max(outputs, inputs, _tensor_bytes(out))
