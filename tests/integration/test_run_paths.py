"""A run started with relative paths, used from another directory: eval, report, predict and a
resume find its shards and its output, because the run records them as absolute paths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import run_distseq
from streams import N_VAL


def test_a_run_is_used_from_another_directory(shards: Path, tmp_path: Path) -> None:
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    shutil.copytree(shards, start / "data")
    elsewhere.mkdir()
    (start / "tiny.yaml").write_text(
        "data: {train: 'data/train-{000000..000003}.tar', val: 'data/val-{000000..000001}.tar',\n"
        "       window: 8, size: 32, num_workers: 0}\n"
        "model: {backbone: {name: tiny_cnn}, head: {hidden: 16}}\n"
        "train: {steps: 2, out_dir: run}\n"
    )
    trained = run_distseq("train", "tiny.yaml", cwd=start)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = start / "run"
    saved = (run / "config.yaml").read_text()
    assert f"train: {start}/data/train-" in saved and f"out_dir: {run}" in saved

    evaluated = run_distseq("eval", str(run), "--json", cwd=elsewhere)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout)["videos"] == N_VAL
    reported = run_distseq("report", str(run), cwd=elsewhere)
    assert reported.returncode == 0 and (run / "report" / "confusion.png").is_file()
    predicted = run_distseq(
        "predict", str(run), f"{start}/data/val-000000.tar", "--out", "p", cwd=elsewhere
    )
    assert predicted.returncode == 0 and len(list((elsewhere / "p").glob("*.csv"))) == 3
    # The run's own config, from elsewhere: it resumes the run where it is, not a new one here.
    resumed = run_distseq("train", str(run / "config.yaml"), "train.steps=3", cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 2" in resumed.stderr and not (elsewhere / "run").exists()
    assert (run / "checkpoints" / "latest").read_text() == "step_00000003\n"

    # Shards moved away: one line naming what the run recorded and the option that overrides it.
    (start / "data").rename(start / "moved")
    gone = run_distseq("eval", str(run), cwd=elsewhere)
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1, gone.stderr
    assert (
        f"the model's data.val {start}/data/val-" in gone.stderr and "pass --split" in gone.stderr
    )
    moved = run_distseq(
        "eval", str(run), "--split", f"{start}/moved/val-{{000000..000001}}.tar", cwd=elsewhere
    )
    assert moved.returncode == 0, moved.stderr[-3000:]
