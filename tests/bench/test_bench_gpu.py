"""``distseq bench gpu --dry-run``: the GPU acceptance command at tiny sizes on the CPU, every
line of its table measured, so that it keeps working where no GPU is lent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distseq.cli import main


@pytest.mark.integration  # a torchrun group of two ranks for the FSDP2 line
def test_the_dry_run_measures_every_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "gpu", "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table = (tmp_path / "gpu.md").read_text()
    assert table.strip() in out and "tiny_cnn + LSTM, 64 px, T=64" in table
    record = json.loads((tmp_path / "gpu.json").read_text())
    lines = {line["quantity"]: line for line in record["lines"]}
    assert list(lines) == [
        "plain: peak",
        "plain: step",
        "chunked: peak",
        "chunked: step",
        "planner at 50%: peak",
        "planner at 50%: step",
        "planner at 50%: predicted peak",
        "chunked bf16: peak",
        "chunked bf16: step",
        "offload: copy hidden",
        "FSDP2 x2 (gloo): step",
        "FSDP2 x2 (gloo): per rank",
        "plain compiled: speed-up",
        "chunked compiled: speed-up",
        "loader workers needed",
        "whole run",
    ]
    for quantity, line in lines.items():
        if quantity == "offload: copy hidden":  # nothing is copied on the CPU, and it says so
            assert line["value"] is None and "no copy on the CPU" in line["note"]
        else:
            assert line["value"] > 0, quantity
        assert f"| {quantity} |" in table
    plain, chunked = lines["plain: peak"]["value"], lines["chunked: peak"]["value"]
    assert chunked < plain and lines["chunked: peak"]["note"] == "exact"
    half = lines["planner at 50%: peak"]["value"]
    assert half <= 0.5 * plain * 1.001 and lines["planner at 50%: peak"]["note"] == "exact"
    predicted = lines["planner at 50%: predicted peak"]["value"]
    assert abs(half - predicted) < 0.05 * half
    assert "exact" in lines["chunked compiled: speed-up"]["note"]
    # The bf16 step keeps half the bytes of every parameter gradient and activation.
    assert lines["chunked bf16: peak"]["value"] < 0.75 * chunked
    assert lines["FSDP2 x2 (gloo): per rank"]["value"] > 0
    assert [r["approach"] for r in record["rows"]][-2:] == ["plain_compiled", "chunked_compiled"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without GPU")
def test_without_a_gpu_it_says_to_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "gpu"]) != 0
    assert "no CUDA device here; --dry-run runs it on the CPU" in capsys.readouterr().err
