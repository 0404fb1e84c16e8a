"""memory.offload=frames: each chunk's frames copied to the device one chunk ahead (prefetch.py)."""

from __future__ import annotations

import pytest
import torch
from test_gradients import TOL, max_rel_error, step

from conftest import random_batch, tiny_model
from distseq.config import MemoryConfig, Offload, Recompute
from distseq.memory import prefetch
from distseq.memory.policy import apply_memory_policy

CPU = torch.device("cpu")


@pytest.mark.parametrize("recompute", ["torch", "fairscale"])
def test_offloaded_frames_come_in_one_chunk_ahead_for_forward_and_recompute(
    recompute: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # memory.offload=frames: the sequence's frames stay where the loader put them; each chunk's
    # slice is copied to the device once for its forward and once more for its recompute (held
    # chunks once), each copy started while the chunk before it in that order computes. (On the
    # CPU the copy is a no-op; what is checked is when and of what it happens.)
    batch = random_batch(2, 13, lengths=[13, 9]).to(torch.device("cpu"), frames_on_host=True)
    ref, _ = step(tiny_model("none", chunk=1000), batch)
    memory = MemoryConfig(
        recompute=Recompute(recompute), chunk_frames=4, keep_frames=5, offload=Offload.frames
    )
    model = apply_memory_policy(tiny_model("none"), memory)
    events: list[tuple[str, int]] = []
    real = prefetch.to_device
    frame = batch.frames.stride(1)

    def spy(frames: torch.Tensor, device: torch.device) -> torch.Tensor:
        # a view of the host frames, never a copy of the whole sequence made beforehand
        assert frames.untyped_storage().data_ptr() == batch.frames.untyped_storage().data_ptr()
        events.append(("copy", frames.storage_offset() // frame))
        return real(frames, device)

    def computes(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        events.append(("compute", len(args[0])))

    monkeypatch.setattr(prefetch, "to_device", spy)
    model.backbone.register_forward_pre_hook(computes)
    got, _ = step(model, batch)
    assert max_rel_error(got, ref) < TOL
    # Chunks 0 and 4 are recomputed, in reverse; 8 and 12 are held. The backbone sees the
    # real frames of a chunk: 8 of chunks 0 and 4, 4 + 1 of chunk 8, 1 of chunk 12.
    assert events == [
        ("copy", 0),
        ("copy", 4),  # started before chunk 0 computes
        ("compute", 8),
        ("copy", 8),
        ("compute", 8),
        ("copy", 12),
        ("compute", 5),
        ("copy", 4),  # the first recompute's, while the head runs
        ("compute", 1),
        ("copy", 0),  # backward: chunk 0's, while chunk 4 is recomputed
        ("compute", 8),
        ("compute", 8),
    ]


def test_each_copy_is_started_one_chunk_ahead_in_the_order_of_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 4 chunks of 2 frames: the forward takes 0, 2, 4, 6 and backward recomputes 4, then 0 (6
    # and 2 held). Each take starts the copy of the next chunk in that order; the last forward
    # take starts the first recompute's.
    frames = torch.arange(8 * 3, dtype=torch.uint8).view(1, 8, 3, 1, 1)
    copies: list[int] = []
    real = prefetch.to_device

    def spy(chunk: torch.Tensor, device: torch.device) -> torch.Tensor:
        copies.append(chunk.storage_offset() // frames.stride(1))
        return real(chunk, device)

    monkeypatch.setattr(prefetch, "to_device", spy)
    ahead = prefetch.FramePrefetch(frames, 2, CPU, forward=[0, 2, 4, 6], recompute=[4, 0])
    taken = []
    for start in (0, 2, 4, 6, 4, 0):
        taken.append(ahead.take(frames[:, start : start + 2]))
        assert torch.equal(taken[-1], frames[:, start : start + 2])
    # 0 on demand, then each next one while the current one is in use.
    assert copies == [0, 2, 4, 6, 4, 0]
    copies.clear()
    # Another sequence's chunk at the same offsets gets a copy of its own, never a stale one.
    other = frames.clone() + 1
    assert torch.equal(ahead.take(other[:, 2:4]), other[:, 2:4]) and copies == [2]
