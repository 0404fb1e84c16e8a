"""train.ema's weight average on 2 ranks, FSDP2 (each rank holding its shard of the average)
and DDP: after three steps it is the average worked out by hand from the parameters of every
step, and applying it for a validation leaves the trained weights as they were."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import torchrun
from workers.ema import DECAY


def test_the_average_is_the_hand_computed_one_on_two_ranks(tmp_path: Path) -> None:
    records = torchrun("ema", 2, tmp_path, "fsdp", "ddp")
    for mode in ("fsdp", "ddp"):
        got = records[0][mode]
        assert records[1][mode]["average"] == got["average"], mode  # one average, all ranks
        steps = got["steps"]
        assert steps[0] != steps[3]  # the weights moved
        for name, average in got["average"].items():
            # e_0 = p_0, e_t = d e_(t-1) + (1 - d) p_t: e_3 = d^3 p_0 + d^2 (1-d) p_1 + ...
            weights = [DECAY**3, DECAY**2 * (1 - DECAY), DECAY * (1 - DECAY), 1 - DECAY]
            hand = [sum(w * s[name][i] for w, s in zip(weights, steps, strict=True))
                    for i in range(len(average))]  # fmt: skip
            assert average == pytest.approx(hand, rel=1e-6, abs=1e-7), (mode, name)
            assert got["applied"][name] == average, (mode, name)
        assert got["back"], mode
