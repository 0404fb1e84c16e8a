"""``distseq bench recipes`` on the demo's shards at tiny sizes, as a user runs it: every recipe
on two seeds, its numbers equal to ``distseq train`` runs made the ordinary way, and a second run
that reads the finished trainings back and trains only what is missing."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import matplotlib.image
import pytest

from conftest import REPO, run_distseq
from distseq.bench.recipes import SCORES, STAGE3
from distseq.demo.task import write_task

DEMO = str(REPO / "distseq" / "demo" / "demo.yaml")
SMALL = ["data.batch_size=2", "data.num_workers=0", "model.head.hidden=8"]
STEPS = ["--steps", "2", "--eval-every", "1"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    data = tmp_path_factory.mktemp("demo")
    write_task(data, train=4, val=2, length=320, size=16, seed=0, per_shard=2)
    return [f"data.train={data}/train-{{000000..000001}}.tar", f"data.val={data}/val-000000.tar"]


def bench(shards: list[str], out: Path, *steps: str) -> subprocess.CompletedProcess[str]:
    argv = ["bench", "recipes", DEMO, *shards, *SMALL, *steps, "--seeds", "0", "1"]
    return run_distseq(*argv, "--out", str(out), "--json", cwd=out.parent)


def records(proc: subprocess.CompletedProcess[str]) -> list[dict]:
    """The bench's JSON records: with --json, stdout holds nothing else (every training's
    progress and metrics went to stderr), so it can be piped."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def numbers(run: Path) -> str:
    """The run's metrics.jsonl but for its clock: losses, gradient norms, validation scores (as
    JSON text, where NaN, a score without a segment, equals NaN)."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    clock = ("frames_per_s", "step_seconds", "data_wait_fraction")
    return json.dumps([{k: v for k, v in json.loads(r).items() if k not in clock} for r in lines])


def test_every_recipe_equals_its_train_run_and_a_rerun_trains_only_what_is_missing(
    shards: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "recipes"
    made = records(bench(shards, out, *STEPS))
    recipes = ["per_frame", "tbptt", "two_stage", "three_stage", "end_to_end"]
    assert [(r["recipe"], r["seed"]) for r in made] == [
        (recipe, seed) for seed in (0, 1) for recipe in recipes
    ]
    # Steps of all a recipe's trainings: two_stage is stage 1 and 2, three_stage one more.
    assert [r["steps"] for r in made[:5]] == [2, 2, 4, 6, 2]
    for r in made:
        assert set(r["scores"]) == set(SCORES) and r["seconds"] > 0
        assert [step for step, _ in r["curve"]] == (
            [0, 1, 2] if r["recipe"] == "three_stage" else [1, 2]
        )
    three = made[3]
    assert three["curve"][0][1] == made[2]["scores"]["val_accuracy"]  # stage 2's last score

    # The ordinary way: distseq train with the same overrides gives the same scores.
    seed1 = out / "seed-1"
    base = [DEMO, *shards, *SMALL, "train.seed=1", "train.steps=2", "train.eval_every=1"]
    init = f"train.init_from=[{seed1 / 'frames'}:backbone,{seed1 / 'head'}]"
    # Stage 2 as docs/training.md's three commands run it: distseq features, then the head on them.
    features = tmp_path / "features"
    inputs = [url.split("=", 1)[1] for url in shards]
    proc = run_distseq(
        "features", str(seed1 / "frames"), *inputs, "--out", str(features), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    on_features = [f"{url.split('=')[0]}={features}/{Path(url).name}" for url in shards]
    for name, extra in {
        "frames": ["model.head.kind=none", "model.head.chrono_frames=0"],
        "tbptt": ["memory.tbptt_frames=64"],
        "head": [*on_features, "data.features=true", "data.window=0"],
        "stage3": [init, *STAGE3],
        "end_to_end": [],
    }.items():
        mine = tmp_path / name
        proc = run_distseq("train", *base, *extra, f"train.out_dir={mine}", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert numbers(mine) == numbers(seed1 / name)
        assert '"loss"' in numbers(mine) and '"val_accuracy"' in numbers(mine)
    stage3 = json.loads(numbers(tmp_path / "stage3"))[-1]
    assert stage3["val_accuracy"] == made[8]["scores"]["val_accuracy"]

    table = (out / "recipes.md").read_text().splitlines()
    assert [line.split("|")[1].strip() for line in table[2:7]] == recipes
    assert re.match(r"\S+ (wins|and \S+ tie): frame accuracy", table[8]), table[8]
    assert table[10].startswith("three_stage from stage 2's accuracy: seed 0 ")
    assert matplotlib.image.imread(out / "recipes.png").shape[2] == 4  # a PNG one can open

    # A stop after some trainings: the rerun reads the finished ones and makes the one missing.
    (seed1 / "end_to_end" / "result.json").unlink()
    proc = bench(shards, out, *STEPS)
    again = records(proc)
    assert re.findall(r"== seed (\d): (\S+)", proc.stderr) == [("1", "end_to_end")]
    assert again == [*made[:9], again[9]] and again[9]["scores"] == made[9]["scores"]
    # Other options into the same folder: refused in one line, not mixed with the old runs.
    proc = bench(shards, out, "--steps", "3", "--eval-every", "1")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        f"distseq: error: bench recipes: {out / 'seed-0' / 'frames'} was made with other options "
        "than these: give another --out, or delete that folder to make it again"
    )
