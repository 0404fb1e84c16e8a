"""``distseq bench protocols``: the two protocols on simulated Cholec80 videos."""

from __future__ import annotations

import json
import math

import pytest

from distseq.cli import main


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["bench", "protocols", "--videos", "4", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)["metrics"]


def test_the_protocols_agree_strict_and_differ_relaxed(capsys: pytest.CaptureFixture[str]) -> None:
    # Without a relaxed window only the aggregation differs, and where every phase occurs in
    # some video, mean and nanmean across phases agree: the same numbers, but for F1.
    strict = bench(capsys, "--relaxed-seconds", "0")
    for metric in ("accuracy", "precision", "recall", "jaccard"):
        assert strict[metric]["script"] == pytest.approx(strict[metric]["distseq"], abs=1e-12)
    assert math.isnan(strict["f1"]["script"]["mean"])
    relaxed = bench(capsys)
    assert relaxed["accuracy"]["script"]["mean"] != relaxed["accuracy"]["distseq"]["mean"]
    # The window forgives: each protocol's relaxed accuracy is above its strict one.
    for protocol in ("distseq", "script"):
        assert relaxed["accuracy"][protocol]["mean"] > strict["accuracy"][protocol]["mean"]
