"""``distseq bench compare`` on a tiny case: every row and column, files a person can open."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from torchcodec.decoders import decode_png

from distseq.bench.compare import Row
from distseq.cli import main

APPROACHES = ["plain", "per_block", "tbptt", "chunked", *["planner"] * 4, "planner_offload"]


@pytest.mark.slow
def test_every_row_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # MobileNet: few parameters, so at 32 px a step's memory is mostly activations, as it is for
    # a ResNet at 224 px; and dropout, which every row must draw alike.
    argv = ["bench", "compare", "--backbone", "mobilenet_v3_small", "--size", "32"]
    argv += ["--frames", "96", "--chunk", "4", "--plan-chunk", "4"]  # fine granularity
    assert main([*argv, "--json", "--out", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["approach"] for r in rows] == APPROACHES
    for r in rows:
        assert set(r) == {f.name for f in fields(Row)} and r["frames"] == 96
    by = {r["approach"]: r for r in rows[:4]}
    # Exactness comes from comparing gradients: 96 frames are two 64-frame windows, and only
    # the truncated gradient differs from plain's.
    assert {name: r["exact"] for name, r in by.items()} == {
        "plain": True,
        "per_block": True,
        "tbptt": False,
        "chunked": True,
    }
    assert by["chunked"]["peak_bytes"] < by["plain"]["peak_bytes"]
    chunked = by["chunked"]
    assert 0 < chunked["floor_bytes"] < chunked["peak_bytes"] and chunked["gradient_bytes"] > 0
    assert all(r["floor_bytes"] is None for r in rows if r["approach"] != "chunked")
    assert by["plain"]["plain_ratio"] == 1.0
    plain_peak = by["plain"]["peak_bytes"]
    budgets = [r["budget_bytes"] for r in rows[4:]]
    assert budgets[:3] == [int(s * plain_peak) for s in (0.25, 0.5, 0.75)]
    assert budgets[3] == by["tbptt"]["peak_bytes"] and budgets[4] == budgets[1]
    table = (tmp_path / "compare.md").read_text()
    ran = [r for r in rows[4:] if r["peak_bytes"] is not None]
    assert len(ran) >= 2, rows[4:]
    for r in ran:
        assert r["peak_bytes"] <= r["budget_bytes"] and r["exact"] is True
        assert abs(r["peak_bytes"] - r["predicted_peak_bytes"]) < 0.05 * r["peak_bytes"]
        assert r["bound_seconds"] > 0 and r["step_seconds"] > 0
        assert r["plan"].startswith("T=96 chunk=4: ") and r["plan"] in table
    assert all(r["plan"] is None for r in rows if r not in ran)
    for r in rows[4:]:
        if r["peak_bytes"] is None:  # below the floor: nothing ran, nothing made up
            assert r["step_seconds"] is None and r["exact"] is None
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved == rows
    assert table.count("\n| 96 | ") == 9 and "x bound" in table
    image = decode_png(
        torch.frombuffer(bytearray((tmp_path / "compare.png").read_bytes()), dtype=torch.uint8)
    )
    assert image.shape[1:] == (450, 600) and image[:3].float().std() > 15  # drawn


@pytest.mark.slow
def test_compiled_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # aot_eager: traced and partitioned as inductor would, no code generated (fast); ResNet has
    # no dropout, whose draws inductor makes its own way.
    argv = ["bench", "compare", "--backbone", "resnet18", "--size", "32", "--frames", "16"]
    argv += ["--chunk", "4", "--plan-chunk", "4", "--compile", "aot_eager"]
    assert main([*argv, "--json", "--out", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["approach"] for r in rows] == [*APPROACHES, "plain_compiled", "chunked_compiled"]
    by = {r["approach"]: r for r in rows}
    for name in ("plain", "chunked"):
        compiled = by[f"{name}_compiled"]
        assert compiled["exact"] is True and compiled["step_seconds"] > 0, compiled
        assert compiled["peak_bytes"] > 0 and compiled["plain_ratio"] > 0
    text = (tmp_path / "compare.md").read_text()
    assert "T=16 plain compiled: " in text and "T=16 chunked compiled: " in text, text
