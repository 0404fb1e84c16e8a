"""``distseq bench heads`` on a tiny case: every head's row, memory that grows linearly with T for
local attention, the epoch rows over the same videos, and the chunked CNN's saving."""

from __future__ import annotations

import json

import pytest

from distseq.bench.heads import HEADS
from distseq.cli import main

ARGS = ["bench", "heads", "--feature-dim", "16", "--num-classes", "4", "--videos", "5"]
SMALL = ["--min-frames", "20", "--max-frames", "40", "--size", "32", "--chunk", "4", "--json"]


@pytest.mark.slow
def test_heads_epochs_and_end_to_end_rows(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*ARGS, *SMALL, "--frames", "128", "256", "512", "--end-to-end-frames", "24"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    heads = rows[: 3 * len(HEADS)]
    assert [(r["head"], r["frames"]) for r in heads] == [
        (h, t) for t in (128, 256, 512) for h in HEADS
    ]
    assert all(r["peak_bytes"] > 0 and r["step_seconds"] > 0 for r in heads)
    peak = {(r["head"], r["frames"]): r["peak_bytes"] for r in heads}
    for head in ("transformer", "transformer-causal", "mstcn"):
        # Linear in T: p(4T) - p(T) = 3 (p(2T) - p(T)); quadratic attention would give 5.
        growth = (peak[head, 512] - peak[head, 128]) / (peak[head, 256] - peak[head, 128])
        assert 2.5 < growth < 3.5, (head, growth)
    distseq, plain = rows[3 * len(HEADS) : 3 * len(HEADS) + 2]
    assert (distseq["way"], plain["way"]) == ("distseq", "plain")
    assert distseq["videos"] == plain["videos"] == 5
    assert distseq["frames"] == plain["frames"]  # every training video once, each way
    assert distseq["peak_bytes"] < 1.25 * plain["peak_bytes"]
    none, chunked = rows[-2:]
    assert none["head"].endswith("none") and chunked["head"].endswith("torch")
    assert none["frames"] == chunked["frames"] == 24
    assert chunked["peak_bytes"] < none["peak_bytes"]
