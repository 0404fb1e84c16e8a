"""The examples run as a user runs them, at small sizes, and do what they claim (docs/library.md):
exact gradients and a lower peak than plain autograd; FSDP2 on 2 ranks equal to one process; a
head of one's own trained and scored by the command line through its import path."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from conftest import REPO, launch_torchrun
from distseq.data.manifest import find_manifest

EXAMPLES = REPO / "examples"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}:{EXAMPLES}"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def test_own_model_has_plain_autograd_s_gradients_in_less_memory(tmp_path: Path) -> None:
    small = ["--frames", "48", "--size", "32", "--chunk", "8", "--steps", "2", "--check"]
    proc = run(str(EXAMPLES / "own_model.py"), *small, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = re.findall(r"step \d: loss ([\d.]+)", proc.stdout)
    assert len(losses) == 2
    peaks = re.search(r"chunked ([\d.]+) MiB, plain ([\d.]+) MiB", proc.stdout)
    error = re.search(r"largest relative gradient difference: (\S+)", proc.stdout)
    assert peaks and error, proc.stdout
    assert float(peaks[1]) < float(peaks[2]) / 2, proc.stdout
    assert float(error[1]) < 1e-5


def test_fsdp_on_two_ranks_equals_one_process(tmp_path: Path) -> None:
    small = ["--videos", "2", "--frames", "24", "--size", "32", "--chunk", "8", "--steps", "3"]
    script = EXAMPLES / "fsdp_torchrun.py"
    alone = run(str(script), *small, cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr[-3000:]
    ranks = launch_torchrun(script, 2, tmp_path, *small)
    assert ranks.returncode == 0, ranks.stderr[-3000:]

    def losses(out: str) -> list[float]:
        return [float(x) for x in re.findall(r"step \d: loss ([\d.]+)", out)]

    one, two = losses(alone.stdout), losses(ranks.stdout)
    assert len(one) == len(two) == 3
    assert one[0] != one[2]  # it trained
    for a, b in zip(one, two, strict=True):
        assert abs(a - b) < 1e-5, (one, two)


def test_a_head_of_one_s_own_trains_and_is_scored_through_its_import_path(
    tmp_path: Path, shards: Path
) -> None:
    out = tmp_path / "tcn"
    overrides = [
        f"data.train={shards}/train-{{000000..000003}}.tar",
        f"data.val={shards}/val-{{000000..000001}}.tar",
        "data.window=8",
        "data.size=32",
        "data.batch_size=2",
        "data.num_workers=0",
        "memory.chunk_frames=4",
        "model.head.args.layers=3",
        "train.steps=3",
        "train.log_every=1",
        f"train.out_dir={out}",
    ]
    train = run("-m", "distseq", "train", str(EXAMPLES / "tcn.yaml"), *overrides, cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("val_accuracy" in r for r in records)
    scored = run("-m", "distseq", "eval", str(out), "--json", cwd=tmp_path)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert "accuracy" in json.dumps(json.loads(scored.stdout))

    # A head without state cannot carry it across windows: one line, before any training.
    ordered = run(
        "-m",
        "distseq",
        "train",
        str(EXAMPLES / "tcn.yaml"),
        *overrides,
        "data.ordered=true",
        f"train.out_dir={tmp_path / 'ordered'}",
        cwd=tmp_path,
    )
    assert ordered.returncode == 2
    assert ordered.stderr.strip().splitlines()[-1] == (
        "distseq: error: config key data.ordered: carries a head's state across windows, and "
        "model.head.kind=tcn_head:make_head carries none (its forward takes no state)"
    )


def test_footage_recall_labels_each_frame_with_the_clip_before_its_own(tmp_path: Path) -> None:
    small = ["--out", str(tmp_path / "data"), "--train", "2", "--val", "1", "--test", "1"]
    small += ["--length", "400"]
    proc = run(str(EXAMPLES / "footage_recall.py"), *small, "--size", "16", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = find_manifest("", str(tmp_path / "data" / "index.json"), "--out")
    assert manifest.classes == ["bikes", "bunny", "carphone"] and manifest.fps == 25.0
    assert sorted(manifest.shards) == ["test-000000.tar", "train-000000.tar", "val-000000.tar"]
    assert manifest.shards["test-000000.tar"].split == "test"

    sys.path.insert(0, str(EXAMPLES))
    import footage_recall

    # A clip of 4 frames played for 9 from its third: 2 3 2 1 0 1 2 3 2.
    assert footage_recall.back_and_forth(4, 2, 9) == [2, 3, 2, 1, 0, 1, 2, 3, 2]
    # Three "clips" of one grey level each, so a frame tells its clip.
    clips = [torch.full((5, 3, 2, 2), 10 * c, dtype=torch.uint8) for c in range(3)]
    rng = np.random.default_rng(0)
    frames, labels, shown = footage_recall.make_video(rng, clips, 1000)
    assert frames.shape == (1000, 3, 2, 2)
    assert [int(f[0, 0, 0]) // 10 for f in frames] == shown
    segments = [(clip, len(list(run))) for clip, run in itertools.groupby(shown)]
    assert all(30 <= n <= 160 for _, n in segments[:-1]) and len(segments) >= 1000 // 160
    expected = []
    for i, (_, n) in enumerate(segments):  # neighbours differ, so a run is one segment
        expected += [segments[i - 1][0] if i else -1] * n
    assert labels == expected
