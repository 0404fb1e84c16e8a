"""Collective traffic per step does not grow with the number of chunks (real gloo ranks)."""

from __future__ import annotations

from pathlib import Path

from conftest import torchrun


def test_collectives_flat_in_number_of_chunks(tmp_path: Path) -> None:
    for rank in torchrun("collectives", 2, tmp_path):
        one, eight = rank["k=T"], rank["k=T/8"]
        for held in ("k=T/8 half held", "k=T/8 stages held"):
            assert one["counts"] == eight["counts"] == rank[held]["counts"], held
            assert one["bytes"] == eight["bytes"] == rank[held]["bytes"], held
        assert one["counts"]["all_gather"] > 0 and one["counts"]["reduce_scatter"] > 0
        # The measurement can see growth: units inside the chunk loop re-gather per chunk.
        grown = rank["per_stage k=T/8"]["counts"]["all_gather"]
        assert grown > rank["per_stage k=T"]["counts"]["all_gather"], rank
        # A user's model through distseq.ChunkedModel and distseq.parallelize: flat too.
        user, user8 = rank["user k=T"], rank["user k=T/8"]
        assert user["counts"] == user8["counts"] and user["bytes"] == user8["bytes"]
        assert user["counts"]["all_gather"] > 0 and user["counts"]["reduce_scatter"] > 0
