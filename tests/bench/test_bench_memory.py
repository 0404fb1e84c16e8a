"""``distseq bench memory`` on a tiny case: one record per (T, recompute), measured exactly."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from distseq.bench.memory import MemoryRecord
from distseq.cli import main

ARGS = ["bench", "memory", "--size", "32", "--chunk", "4", "--json"]


def records(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, object]]:
    assert main([*ARGS, *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.slow
def test_records_are_exact_and_chunking_saves_memory(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--frames", "8", "16", "--recompute", "none", "torch", "fairscale"]
    first = records(capsys, *argv)
    cases = [(r["frames"], r["recompute"]) for r in first]
    assert cases == [(t, m) for t in (8, 16) for m in ("none", "torch", "fairscale")]
    by = {(r["frames"], r["recompute"]): r for r in first}
    for r in first:
        assert set(r) == {f.name for f in fields(MemoryRecord)}
        assert (r["backbone"], r["size"], r["chunk"], r["device"]) == ("resnet18", 32, 4, "cpu")
        assert 0 < r["floor_bytes"] < r["peak_bytes"] and r["step_seconds"] > 0
    for t in (8, 16):
        plain, torch_, fairscale = (by[t, m] for m in ("none", "torch", "fairscale"))
        # Checkpointed chunks keep only their inputs and features from forward to backward.
        assert torch_["saved_bytes"] == fairscale["saved_bytes"] < plain["saved_bytes"] / 4
    # At 32 px the parameter gradients dominate the peak, so compare its growth with T: plain
    # memory grows by every activation, chunked memory by features and chunk inputs.
    plain_growth = by[16, "none"]["peak_bytes"] - by[8, "none"]["peak_bytes"]
    chunked_growth = by[16, "torch"]["peak_bytes"] - by[8, "torch"]["peak_bytes"]
    assert 0 <= chunked_growth < plain_growth / 4
    # CPU bytes come from allocation events: the same run gives the same numbers.
    again = records(capsys, "--frames", "8", "--recompute", "torch")
    assert again[0]["peak_bytes"] == by[8, "torch"]["peak_bytes"]
    assert again[0]["saved_bytes"] == by[8, "torch"]["saved_bytes"]
