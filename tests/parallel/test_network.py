"""distseq.parallel.network's reading of errors: which are a collective that lost its peer (the
run then stops in one line naming the node that does not answer) and which are bugs (a
traceback)."""

from __future__ import annotations

import pytest

from distseq.parallel import is_collective_failure


@pytest.mark.parametrize(
    "message",
    [
        # gloo, as the bed's lost-link test saw each: in a step, and in a checkpoint's all-reduce.
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]",
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out",
        "Application timeout caused pair closure",
        "Connection reset by peer",
    ],
)
def test_a_peer_gone_is_a_collective_failure(message: str) -> None:
    assert is_collective_failure(RuntimeError(message))


@pytest.mark.parametrize(
    "error",
    [RuntimeError("mat1 and mat2 shapes cannot be multiplied"), ValueError("timed out")],
)
def test_a_bug_is_not(error: Exception) -> None:
    assert not is_collective_failure(error)
