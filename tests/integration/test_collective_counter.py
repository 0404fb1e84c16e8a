"""distseq.bench.collectives.CollectiveCounter in a real 2-process gloo run: FSDP2, explicit
collectives, DTensor and DDP, each with its exact count and bytes."""

from __future__ import annotations

from pathlib import Path

from conftest import torchrun


def test_collective_counter_sees_fsdp2_and_explicit_collectives(tmp_path: Path) -> None:
    results = torchrun("collective_counter", 2, tmp_path, timeout=120)

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
