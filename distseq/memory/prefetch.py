"""memory.offload=frames: each chunk's frames copied to the device one chunk ahead.

The frames of a sequence stay in (pinned) host memory, and each chunk needs its own on the device
twice: for its forward, and again for its recompute in backward. The forward visits the chunks
in order and backward recomputes the checkpointed ones in reverse, so while one chunk computes,
the copy of the one after it in that order is already on its way, on a side stream on a GPU.
On the CPU there is no stream and the copy is a no-op, but the order of copies is the same,
which is what the tests check.
"""

from __future__ import annotations

import itertools

import torch


def to_device(frames: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A chunk's frames on ``device``; a no-op where they are already there."""
    return frames.to(device, non_blocking=True)


class FramePrefetch:
    """The device copies of one sequence's chunks, each started one chunk ahead of its use.

    ``forward``: the starts of the chunks the forward runs, in order; ``recompute``: those that
    backward recomputes, in the order it does. A chunk taken a second time is in its recompute.
    The forward's last chunk starts the copy for the first recompute: the head's forward and
    backward run in between.
    """

    def __init__(
        self,
        frames: torch.Tensor,
        k: int,
        device: torch.device,
        forward: list[int],
        recompute: list[int],
    ) -> None:
        self.frames, self.k, self.device = frames, k, device
        self._after = (
            dict(itertools.pairwise(forward + recompute[:1])),
            dict(itertools.pairwise(recompute)),
        )
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._ready: dict[int, tuple[torch.Tensor, torch.cuda.Event | None]] = {}
        self._taken: set[int] = set()

    def take(self, chunk: torch.Tensor) -> torch.Tensor:
        """``chunk`` (a slice of the frames along T) on the device, and the next one started."""
        if chunk.untyped_storage().data_ptr() != self.frames.untyped_storage().data_ptr():
            return to_device(chunk, self.device)  # another sequence's: never a stale copy
        start = int(chunk.storage_offset() - self.frames.storage_offset()) // self.frames.stride(1)
        after = self._after[start in self._taken].get(start)
        self._taken.add(start)
        ready = self._ready.pop(start, None)
        x = to_device(chunk, self.device) if ready is None else self._wait(*ready)
        if after is not None and after not in self._ready:
            self._ready[after] = self._start(after)
        return x

    def _start(self, start: int) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        chunk = self.frames[:, start : start + self.k]
        if self._stream is None:
            return to_device(chunk, self.device), None
        with torch.cuda.stream(self._stream):
            x = to_device(chunk, self.device)
            done = torch.cuda.Event()
            done.record(self._stream)
        return x, done

    def _wait(self, x: torch.Tensor, done: torch.cuda.Event | None) -> torch.Tensor:
        if done is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(done)
            # Allocated on the side stream, freed after use on this one: the allocator must not
            # hand the memory out again before this stream is done with it.
            x.record_stream(compute)
        return x
