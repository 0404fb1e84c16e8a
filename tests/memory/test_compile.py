"""model.compile: a compiled backbone gives the plain model's gradients in every memory mode,
with a bounded number of graphs; stages cannot be held then."""

from __future__ import annotations

import pytest
import torch
from test_gradients import TOL, max_rel_error, step

from conftest import random_batch, tiny_model
from distseq.errors import ConfigError
from distseq.memory.chunked import compiled_graphs
from distseq.memory.stages import stage_starts


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recompute", "keep", "offload"),
    [("none", 0, False), ("torch", 0, False), ("torch", 5, False), ("torch", 0, True),
     ("fairscale", 0, False)],
)  # fmt: skip
def test_a_compiled_backbone_gives_the_plain_gradients(
    recompute: str, keep: int, offload: bool
) -> None:
    # T=13 in chunks of 4: a short last chunk, and a sequence padded after 9 frames. aot_eager
    # traces and partitions as inductor does, without generating code (fast).
    batch = random_batch(2, 13, lengths=[13, 9])
    ref, ref_loss = step(tiny_model("none", chunk=1000), batch)
    model = tiny_model(recompute, chunk=4)
    model.keep_frames, model.prefetch_frames = keep, offload
    model.compile_backbone("aot_eager")
    for _ in range(2):  # the second step runs the graphs the first compiled
        model.zero_grad()
        got, loss = step(model, batch)
        assert max_rel_error(got, ref) < TOL
        assert abs(loss - ref_loss) < 1e-6


@pytest.mark.integration  # generating and building the C++ kernels takes minutes here
def test_inductor_generated_code_gives_the_plain_gradients() -> None:
    batch = random_batch(2, 6, lengths=[6, 5])
    # tiny_cnn: inductor generates and builds far fewer kernels than for a ResNet's (125 s).
    ref, _ = step(tiny_model("none", chunk=1000, backbone="tiny_cnn"), batch)
    model = tiny_model("torch", chunk=4, backbone="tiny_cnn")
    model.compile_backbone("inductor")
    got, _ = step(model, batch)
    # Inductor's fused kernels sum in another order: 1.46e-5 of a gradient's largest value
    # measured here, above the 1e-5 that eager's chunked and plain runs keep.
    assert max_rel_error(got, ref) < 3e-5


@pytest.mark.slow
def test_graphs_are_compiled_once_whatever_the_sequence_length() -> None:
    torch._dynamo.reset()  # the graphs of other tests in this process would serve again
    model = tiny_model("torch", chunk=4)
    model.compile_backbone("aot_eager")
    before = compiled_graphs()
    step(model, random_batch(2, 13, lengths=[13, 9]))
    first = compiled_graphs() - before
    # Other lengths and paddings: chunks of 3, 2 and 1 frames, batches of 1 and 2 sequences.
    for t, lengths in [(11, [11, 6]), (6, [6, 2]), (9, [9])]:
        model.zero_grad()
        step(model, random_batch(len(lengths), t, lengths=lengths))
    # Chunks of 8, 8, 5 and 1 frames: one graph for every size above one, one for a single
    # frame (dynamo specialises a dimension of 1).
    assert first == 2, first
    assert compiled_graphs() - before <= 3, compiled_graphs() - before


def test_stages_are_not_held_in_a_compiled_backbone() -> None:
    model = tiny_model("torch", chunk=4)
    starts = stage_starts(model, model.backbone, 32, torch.device("cpu"))
    model.compile_backbone("aot_eager")
    with pytest.raises(ValueError, match="compiled backbone"):
        model.hold_stages(starts)
    held = tiny_model("torch", chunk=4)
    held.hold_stages(starts)
    with pytest.raises(ValueError, match="cannot hold stages"):
        held.compile_backbone("aot_eager")


def test_an_unknown_backend_is_named() -> None:
    with pytest.raises(ConfigError, match=r"model\.compile_backend: 'fast'"):
        tiny_model("torch").compile_backbone("fast")
