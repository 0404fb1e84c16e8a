"""``distseq bench recipes`` on the demo's shards at tiny sizes, as a user runs it: every recipe
on two seeds, each training's checkpoint selected on data.val and scored on a test split, its
numbers equal to ``distseq train`` and ``distseq eval`` runs made the ordinary way; a second run
that reads the finished trainings back and trains only what is missing; and the same bench on the
SLURM cluster's two nodes, each training a job, which ends with the same table."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from conftest import REPO, WORKERS, run_distseq
from distseq.bench.recipes.trainings import SCORES, STAGE3
from distseq.demo.task import write_task

DEMO = str(REPO / "distseq" / "demo" / "demo.yaml")
SMALL = ["data.batch_size=2", "data.num_workers=0", "model.head.hidden=8"]
STEPS = ["--steps", "2", "--eval-every", "1"]
RECIPES = ["per_frame", "tbptt", "two_stage", "three_stage", "end_to_end"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's task: 4 training, 2 validation and 2 test videos, in one folder."""
    data = tmp_path_factory.mktemp("demo")
    write_task(data, train=4, val=2, length=320, size=16, seed=0, per_shard=2, test=2)
    return data


def shards(data: Path) -> list[str]:
    return [f"data.train={data}/train-{{000000..000001}}.tar", f"data.val={data}/val-000000.tar"]


def argv(data: Path, out: Path, *options: str) -> list[str]:
    seeds = ["--seeds", "0", "1"]
    return ["bench", "recipes", DEMO, *shards(data), *SMALL, *seeds, *options, "--out", str(out)]


def bench(data: Path, out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return run_distseq(*argv(data, out, *options, "--json"), cwd=out.parent)


def records(proc: subprocess.CompletedProcess[str]) -> list[dict]:
    """The bench's JSON records: with --json, stdout holds nothing else (every training's
    progress and metrics went to stderr), so it can be piped."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def without_seconds(table: str) -> list[str]:
    """recipes.md but for the train seconds, where two runs of a bench differ: their column and
    the advice's cheaper of two that tie."""
    table = re.sub(r"; \S+ is the cheaper \(\d+ s\)", "", table)
    return [re.sub(r" [\d.]+ ± [\d.]+ \|$", " |", line) for line in table.splitlines()]


@pytest.fixture(scope="module")
def local(data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict], str]:
    """The bench run here, one training after another: its folder, records and table."""
    out = tmp_path_factory.mktemp("local") / "recipes"
    made = records(bench(data, out, *STEPS, "--test", str(data)))
    return out, made, (out / "recipes.md").read_text()


def numbers(run: Path) -> str:
    """The run's metrics.jsonl but for its clock: losses, gradient norms, validation scores (as
    JSON text, where NaN, a score without a segment, equals NaN)."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    clock = ("frames_per_s", "step_seconds", "data_wait_fraction")
    return json.dumps([{k: v for k, v in json.loads(r).items() if k not in clock} for r in lines])


def test_every_recipe_equals_its_train_run_and_a_rerun_trains_only_what_is_missing(
    data: Path, local: tuple[Path, list[dict], str], tmp_path: Path
) -> None:
    out, made, text = local
    assert [(r["recipe"], r["seed"]) for r in made] == [
        (recipe, seed) for seed in (0, 1) for recipe in RECIPES
    ]
    # Steps of all a recipe's trainings: two_stage is stage 1 and 2, three_stage one more.
    assert [r["steps"] for r in made[:5]] == [2, 2, 4, 6, 2]
    for r in made:
        assert set(r["val"]) == set(r["test"]) == set(SCORES) and r["seconds"] > 0
        steps, accuracy = zip(*r["curve"], strict=True)
        assert steps == ((0, 1, 2) if r["recipe"] == "three_stage" else (1, 2))
        # The selected checkpoint: the first validation of the highest frame accuracy.
        assert r["selected"] == steps[accuracy.index(max(accuracy))], r
        assert r["val"]["accuracy"] == max(accuracy)
    three = made[3]
    # Stage 3 starts from stage 2's selected checkpoint, validated at its step 0.
    assert three["curve"][0][1] == made[2]["val"]["accuracy"]
    assert three["stage2"] == made[2]["test"]

    # The ordinary way: distseq train with the same overrides gives the same scores, and the
    # test scores are distseq eval's of the selected checkpoint on the test split.
    seed1 = out / "seed-1"
    base = [DEMO, *shards(data), *SMALL, "train.seed=1", "train.steps=2", "train.eval_every=1"]
    init = f"train.init_from=[{seed1 / 'frames'}:backbone,{seed1 / 'head'}]"
    # Stage 2 as docs/training.md's three commands run it: distseq features, then the head on them.
    features = tmp_path / "features"
    inputs = [url.split("=", 1)[1] for url in shards(data)]
    on_features = [f"{url.split('=')[0]}={features}/{Path(url).name}" for url in shards(data)]
    trainings = {
        "frames": ["model.head.kind=none", "model.head.chrono_frames=0"],
        "tbptt": ["memory.tbptt_frames=64"],
        "head": [*on_features, "data.features=true", "data.window=0"],
        "stage3": [init, *STAGE3],
        "end_to_end": [],
    }
    commands = [["features", str(seed1 / "frames"), *inputs, "--out", str(features)]]
    for name, extra in trainings.items():
        commands.append(["train", *base, *extra, f"train.out_dir={tmp_path / name}"])
    for name in ("stage3", "head"):  # the head on the test split's features
        commands.append(
            ["eval", str(seed1 / name), "--split", "test", "--out", f"{tmp_path}/{name}-eval"]
        )
    proc = subprocess.run(
        [sys.executable, str(WORKERS / "commands.py"), json.dumps(commands)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in trainings:
        assert numbers(tmp_path / name) == numbers(seed1 / name)
        assert '"loss"' in numbers(tmp_path / name) and '"val_accuracy"' in numbers(tmp_path / name)
    for name, record in (("stage3", made[8]), ("head", made[7])):
        report = json.loads((tmp_path / f"{name}-eval" / "eval.json").read_text())
        assert report["frame_level"]["accuracy"] == record["test"]["accuracy"], name
        assert f"step {record['selected']}, the best validation" in report["model"], name

    table = text.splitlines()
    assert table[0].startswith("Each training's checkpoint selected on data.val by")
    assert "scores on the test split (--test: 1 shard in" in table[0]
    assert table[2].startswith("| recipe | seeds | steps | selected at | val acc (selection) |")
    assert [line.split("|")[1].strip() for line in table[4:9]] == RECIPES
    assert re.match(r"\S+ (wins|and \S+ tie): test frame accuracy", table[10]), table[10]
    assert table[12].startswith("three_stage against its stage 2, test frame accuracy of the ")
    assert matplotlib.image.imread(out / "recipes.png").shape[2] == 4  # a PNG one can open

    # A stop after some trainings: the rerun reads the finished ones and makes the one missing.
    (seed1 / "end_to_end" / "result.json").unlink()
    proc = bench(data, out, *STEPS, "--test", str(data))
    again = records(proc)
    assert re.findall(r"== seed (\d): (\S+)", proc.stderr) == [("1", "end_to_end")]
    assert again == [*made[:9], again[9]] and again[9]["test"] == made[9]["test"]
    # Without --test, the same trainings are read back (none trains) and reported on data.val.
    proc = bench(data, out, *STEPS)
    on_val = records(proc)
    assert "== seed" not in proc.stderr
    assert [r["val"] for r in on_val] == [r["val"] for r in made]
    assert all(r["test"] == {} for r in on_val)
    assert "scores on data.val, the split that selected them" in (out / "recipes.md").read_text()


@pytest.mark.hosts
def test_on_slurm_every_training_is_a_job_and_the_table_is_the_local_one(
    data: Path, local: tuple[Path, list[dict], str], two_nodes: Path, tmp_path: Path
) -> None:
    """On the cluster's two nodes: the stages chained as job dependencies; a job cancelled in
    the queue and the waiting bench stopped (Ctrl-C); run again, it waits for the jobs still
    queued, submits the cancelled one anew and makes the local run's table."""
    out = tmp_path / "recipes"
    slurm = ["--slurm", "--partition", "hosts", "--time", "00:05:00"]
    cmd = [sys.executable, "-m", "distseq", *argv(data, out, *STEPS, "--test", str(data), *slurm)]
    env, pipe = {**os.environ, "PYTHONPATH": str(REPO)}, subprocess.PIPE
    # Ctrl-C as a terminal sends it: a suite started in the background (`.ci/run &`) hands its
    # processes SIGINT ignored, and Python then keeps ignoring it.
    default = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    first = subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True, env=env, preexec_fn=default)
    lines = []
    assert first.stderr is not None
    for line in first.stderr:
        lines.append(line)
        if "jobs in SLURM" in line:
            break
    said = "".join(lines)
    jobs = dict(re.findall(r"submitted job (\d+): (seed-\d/\w+)", said))
    assert sorted(jobs.values()) == sorted(
        f"seed-{s}/{j}" for s in (0, 1) for j in ("frames", "head", "stage3", "tbptt", "end_to_end")
    ), said
    ids = {key: job for job, key in jobs.items()}
    # The stages wait on each other: stage 3 on stages 1 and 2, the head on stage 1.
    assert f"submitted job {ids['seed-1/stage3']}: seed-1/stage3 after job " in said
    after = re.search(rf"{ids['seed-1/stage3']}: seed-1/stage3 after job (.+)", said)
    assert after and set(after[1].split(", ")) == {ids["seed-1/frames"], ids["seed-1/head"]}
    subprocess.run(["scancel", ids["seed-1/stage3"]], check=True)  # still waiting in the queue
    # Held until the rerun below has found it queued (it waits on stage 1, which takes seconds).
    subprocess.run(["scontrol", "hold", ids["seed-1/head"]], check=True)
    first.send_signal(signal.SIGINT)
    _, stopped = first.communicate(timeout=60)
    assert first.returncode != 0, said + stopped
    assert "stopped waiting; the jobs go on in SLURM" in stopped, said + stopped

    rerun = subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True, env=env)
    assert rerun.stderr is not None
    lines = []
    for line in rerun.stderr:
        lines.append(line)
        if "jobs in SLURM" in line:
            break
    subprocess.run(["scontrol", "release", ids["seed-1/head"]], check=True)
    _, rest = rerun.communicate(timeout=300)
    again = "".join(lines) + rest
    assert rerun.returncode == 0, again[-3000:]
    # The cancelled job, submitted anew after the jobs it waits on, still queued; no other job
    # twice.
    assert f"waiting for job {ids['seed-1/head']}: seed-1/head, queued before" in again, again
    anew = rf"submitted job \d+: seed-1/stage3 after job .*{ids['seed-1/head']}"
    assert len(re.findall(anew, again)) == 1, again
    assert not re.findall(r"submitted job \d+: (?!seed-1/stage3)", again), again
    assert re.search(r"\] seed-1/stage3: done \(job \d+ on ds-h\d\)", again), again
    assert without_seconds((out / "recipes.md").read_text()) == without_seconds(local[2])
    # Side by side: the trainings ran on both nodes.
    every = [*jobs, *re.findall(r"submitted job (\d+)", again)]
    sacct = ["sacct", "-n", "-P", "-X", "-o", "NodeList", "-j", ",".join(every)]
    ran = subprocess.run(sacct, capture_output=True, text=True, check=True).stdout.splitlines()
    assert set(ran) - {"None assigned"} == {"ds-h1", "ds-h2"}, ran  # the cancelled job: none
