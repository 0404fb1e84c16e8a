"""A memory policy changes how the model runs, never what its parameters are called."""

from __future__ import annotations

import pytest
import torch

from conftest import random_batch, tiny_model
from distseq.config import HeadConfig, MemoryConfig, ModelConfig, Recompute
from distseq.memory.chunked import NOTHING, WHOLE
from distseq.memory.policy import apply_memory_policy
from distseq.model.video import build_model


@pytest.mark.parametrize("recompute", list(Recompute))
@pytest.mark.parametrize("tbptt", [0, 4])
def test_keys_are_those_of_the_plain_model(recompute: Recompute, tbptt: int) -> None:
    cfg = ModelConfig(head=HeadConfig(hidden=16))
    torch.manual_seed(0)
    plain = build_model(cfg, 3)
    torch.manual_seed(0)
    memory = MemoryConfig(recompute=recompute, chunk_frames=3, tbptt_frames=tbptt)
    policed = apply_memory_policy(build_model(cfg, 3), memory)
    assert list(policed.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in policed.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert next(iter(plain.state_dict())) == "backbone.conv1.weight"
    # The weights move both ways as they are, and both models then compute the same thing.
    plain.load_state_dict(policed.state_dict(), strict=True)
    batch = random_batch(1, 7)
    with torch.no_grad():
        torch.testing.assert_close(
            policed.eval()(batch.frames, batch.mask), plain.eval()(batch.frames, batch.mask)
        )


def test_a_probe_runs_by_its_holds_inside_holding_and_leaves_the_model_as_it_was() -> None:
    model = tiny_model(backbone="tiny_cnn", chunk=4)
    model.keep_frames = 4
    assert model.holds(8, 8) == [NOTHING, WHOLE]
    with pytest.raises(KeyboardInterrupt), model.holding(2, lambda t, _: [WHOLE] * -(-t // 2)):
        assert model.chunk_frames == 2 and model.holds(8, 8) == [WHOLE] * 4
        raise KeyboardInterrupt  # put back on any way out
    assert model.chunk_frames == 4 and model.plan is None
    assert model.holds(8, 8) == [NOTHING, WHOLE]
