"""``distseq bench traffic``: real torchrun groups of 1 and 2 ranks; the bytes each rank's
collectives carry in one step, flat in the chunk count and as the parameter count says; sizes
that no rank could run refused before any group starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import run_distseq
from distseq.bench.memory import bench_model
from distseq.cli import main
from distseq.config import Recompute


@pytest.mark.parametrize(
    "options,said",
    [
        # The three: a rank's ZeroDivisionError, "max() arg is an empty sequence", and
        # "torchrun failed: no output" (world 1 ran no case).
        (["--sequences", "0"], "--sequences 0: must be >= 1"),
        (["--sequences", "-1"], "--sequences -1: must be >= 1"),
        (
            ["--sequences", "3", "--worlds", "1"],
            "--worlds 1: no --sequences value (3) divides it, so it would run no case",
        ),
        (["--worlds", "0"], "--worlds 0: must be >= 1"),
        (["--length", "0"], "--length 0: must be >= 1"),
        (["--chunks-per-sequence", "0"], "--chunks-per-sequence 0: must be >= 1"),
        (
            ["--chunks-per-sequence", "3"],  # chunks of 16 // 3 frames: 4 of them, not 3
            "--chunks-per-sequence 3: must divide --length 16 (chunks of T / chunks frames)",
        ),
    ],
)
def test_sizes_no_rank_can_run_are_refused_before_torchrun(
    options: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "traffic", *options]) == 2
    captured = capsys.readouterr()  # refused before the table's heading, or any torchrun
    assert (captured.out, captured.err) == ("", f"distseq: error: bench traffic: {said}\n")


@pytest.mark.integration  # starts torchrun
@pytest.mark.slow
def test_bytes_per_rank_are_flat_in_chunks_and_follow_the_parameter_count(tmp_path: Path) -> None:
    args = ["bench", "traffic", "--json", "--worlds", "1", "2", "--chunks-per-sequence", "2", "4"]
    # tiny_cnn: 17 s for the twelve records against ResNet-18's 41; in both, every parameter's
    # first dimension is even but the classifier's 7 rows.
    args += ["--backbone", "tiny_cnn", "--sequences", "1", "2", "--size", "32", "--length", "4"]
    proc = run_distseq(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    by = {(r["mode"], r["world"], r["sequence"], r["chunks"]): r for r in rows}
    assert all(r["peak_bytes"] > 0 for r in rows)  # measured on every rank, the largest kept
    runs = [(w, s) for w in (1, 2) for s in (1, 2) if w % s == 0]
    assert sorted(by) == sorted(
        (m, w, s, c) for m in ("fsdp", "ddp") for w, s in runs for c in (2, 4)
    )
    for mode in ("fsdp", "ddp"):
        for world, s in runs:
            two, four = by[mode, world, s, 2], by[mode, world, s, 4]
            assert two["counts"] == four["counts"] and two["bytes"] == four["bytes"], (two, four)

    model = bench_model("tiny_cnn", Recompute.torch, 4, torch.device("cpu"))
    head = sum(p.numel() for p in model.head.parameters())
    root = sum(p.numel() for p in model.parameters()) - head
    # DDP all-reduces every fp32 gradient once, alone or not; the rest are the loss's scalars.
    for world in (1, 2):
        extra = by["ddp", world, 1, 2]["bytes"]["all_reduce"] - 4 * (root + head)
        assert 0 < extra <= 64, extra
    # FSDP2 alone gathers and reduces no parameter. At 2 ranks each parameter is padded to an
    # even number of rows: only the classifier's 7 rows (of 128 weights and a bias) gain one.
    # The backbone's parameters are gathered once, the head's twice (resharded after the
    # forward); every gradient is reduce-scattered once.
    alone = by["fsdp", 1, 1, 2]
    assert set(alone["bytes"]) == {"all_reduce"} and alone["total_bytes"] <= 64, alone
    head_padded = head + 128 + 1
    fsdp = by["fsdp", 2, 1, 2]
    assert fsdp["bytes"]["all_gather"] == 4 * (root + 2 * head_padded)
    assert fsdp["bytes"]["reduce_scatter"] == 4 * (root + head_padded)
    assert fsdp["predicted_bytes"] == 4 * (2 * root + 3 * head_padded)
    assert 0 < fsdp["total_bytes"] - fsdp["predicted_bytes"] <= 512  # loss and norm scalars
    # Over one rank's link (ring) at 2 ranks: half of each gathered or scattered buffer, and
    # each all-reduced one whole (half out reduced, half back gathered).
    sizes = fsdp["bytes"]
    half = (sizes["all_gather"] + sizes["reduce_scatter"]) / 2
    assert fsdp["wire_bytes"] == half + sizes.get("all_reduce", 0)

    # A video split across the 2 ranks (S=2) adds the features' all-gather in forward, by hand:
    # 2 slices of 2 frames x 32 tiny_cnn features x 4 bytes, one sequence, each after its rank's
    # 32-byte signature; nothing in backward, and the parameters' collectives as without the split.
    for mode in ("fsdp", "ddp"):
        split, whole = by[mode, 2, 2, 2], by[mode, 2, 1, 2]
        gathered = split["bytes"]["all_gather"] - whole["bytes"].get("all_gather", 0)
        assert (
            gathered == 2 * (2 * 32 * 4 + 32) == split["predicted_bytes"] - whole["predicted_bytes"]
        )
        assert split["counts"]["all_gather"] == whole["counts"].get("all_gather", 0) + 1
        others = {k: v for k, v in split["bytes"].items() if k != "all_gather"}
        assert others == {k: v for k, v in whole["bytes"].items() if k != "all_gather"}, mode
