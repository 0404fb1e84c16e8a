"""``distseq bench data``: well-formed, self-consistent records (no timing thresholds)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest

from distseq.bench.data import DataRecord
from distseq.cli import main

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_json_records_are_consistent() -> None:
    cmd = [sys.executable, "-m", "distseq", "bench", "data", "--size", "32", "--window", "10"]
    cmd += ["--count", "40", "--num-workers", "1", "--model-fps", "50000", "--json"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["augment"], r["workers"]) for r in records] == [
        (False, 0),
        (False, 1),
        (True, 0),
        (True, 1),
    ]
    per_worker = {r["augment"]: r["fps"] for r in records if r["workers"] == 1}
    for r in records:
        assert set(r) == {f.name for f in fields(DataRecord)}
        assert (r["size"], r["window"], r["model_fps"]) == (32, 10, 50000)
        # Synthetic sequences are one window long and 40 frames are two whole batches of 2.
        assert r["frames"] == r["plain_frames"] == 40
        # Workers needed: the fewest whose 1-worker rate together reaches --model-fps.
        n, rate = r["workers_needed"], per_worker[r["augment"]]
        assert (n - 1) * rate < 50000 <= n * rate
    # The timed parts are real seconds within the command's own wall time; a rate computed from
    # a wrong unit or a wrong frame count would put them outside it.
    plain = {r["augment"]: r["plain_frames"] / r["plain_fps"] for r in records}  # one per augment
    timed = sum(r["frames"] / r["fps"] for r in records) + sum(plain.values())
    assert 0 < timed < wall


def test_given_shards_print_a_table(shards: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pattern = str(shards / "train-{000000..000003}.tar")
    argv = ["bench", "data", "--shards", pattern, "--size", "32", "--window", "12"]
    assert main([*argv, "--count", "30", "--num-workers", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = ["augment", "workers", "frames", "frames/s", "plain/s", "/plain", "needed"]
    assert lines[1].split() == header
    rows = [line.split() for line in lines[2:]]
    assert [row[:2] for row in rows] == [["off", "0"], ["on", "0"]]
    # Sequences of 9-12 frames: the last batch may pass the count.
    assert all(int(row[2]) >= 30 for row in rows)


def test_missing_shards_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "train-000000.tar"
    assert main(["bench", "data", "--shards", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(missing) in err, err
