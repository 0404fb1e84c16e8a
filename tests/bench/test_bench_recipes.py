"""bench recipes: its arithmetic and refusals, worked by hand (its runs: tests/integration)."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO
from distseq.bench.recipes.report import advice, from_stage2, heading, summarize, table
from distseq.bench.recipes.run import checked, held_out_shards
from distseq.bench.recipes.slurm import Jobs, check_sacct, jobs_of, options_of
from distseq.bench.recipes.trainings import (
    RECIPES,
    SCORES,
    STAGE3,
    RecipesBench,
    Result,
    SeedRuns,
    per_frame_overrides,
)
from distseq.cli import main
from distseq.config import load_config
from distseq.demo.task import write_task
from distseq.errors import ConfigError, TrainingError
from distseq.launch.slurm import SlurmOptions


def result(recipe: str, seed: int, accuracy: float, seconds: float, val: float = 0.9) -> Result:
    """A recipe's result on one seed: ``accuracy`` on the test split, ``val`` on data.val."""
    test = dict.fromkeys(SCORES, 0.5) | {"accuracy": accuracy}
    val_scores = dict.fromkeys(SCORES, 0.5) | {"accuracy": val}
    return Result(recipe, seed, 10, seconds, 10, val_scores, test, [(10, val)], {})


def test_mean_and_sample_std_over_seeds() -> None:
    rows = summarize(
        [result("a", 0, 0.6, 10, 0.7), result("a", 1, 0.8, 30, 0.9), result("b", 0, 0.7, 5)]
    )
    assert [r.recipe for r in rows] == ["a", "b"]
    # The test split's scores, where the bench has one: data.val's selected the checkpoints.
    assert rows[0].mean["accuracy"] == pytest.approx(0.7)
    assert rows[0].selection == pytest.approx(0.8)  # (0.7 + 0.9) / 2, on data.val
    # Sample std of 0.6 and 0.8: sqrt(((-0.1)^2 + 0.1^2) / 1) = 0.1414.
    assert rows[0].std["accuracy"] == pytest.approx(0.02**0.5)
    assert rows[0].mean["seconds"] == 20 and rows[0].std["seconds"] == pytest.approx(200**0.5)
    assert rows[1].std["accuracy"] == 0 and rows[1].seeds == 1
    # Without a test split, data.val's scores are reported, and the table and heading say so.
    on_val = summarize([replace(result("a", 0, 0.6, 10, 0.7), test={})])
    assert on_val[0].mean["accuracy"] == pytest.approx(0.7)
    assert (
        table(on_val, "val")
        .splitlines()[0]
        .startswith(
            "| recipe | seeds | steps | selected at | val acc (selection) | val frame acc | "
        )
    )
    assert "scores on data.val, the split that selected them: optimistic" in heading(
        "val", "max val_accuracy", ""
    )
    assert heading("test", "min val_loss", "t/test-000000.tar::t/test-000001.tar").endswith(
        "by `train.select: min val_loss`; scores on the test split (--test: 2 shards in t), "
        "which no choice saw."
    )


def test_the_advice_weighs_the_gap_against_its_standard_error() -> None:
    wide = summarize(
        [result("e2e", s, a, 100) for s, a in enumerate((0.90, 0.92, 0.94))]
        + [result("tbptt", s, a, 40) for s, a in enumerate((0.70, 0.71, 0.72))]
    )
    # Gap 0.21; stds 0.02 and 0.01, so its standard error is sqrt(0.0004/3 + 0.0001/3) = 0.0129.
    assert advice(wide, "test") == (
        "e2e wins: test frame accuracy 0.920 against tbptt's 0.710 (+0.210), more than twice the "
        "gap's standard error (0.013); ahead on 3 of 3 seeds"
    )
    close = summarize(
        [result("e2e", s, a, 100) for s, a in enumerate((0.80, 0.85, 0.90))]
        + [result("tbptt", s, a, 40) for s, a in enumerate((0.81, 0.805, 0.80))]
    )
    # Gap 0.045 against sqrt(0.05^2/3 + 0.005^2/3) = 0.0290: above it, within twice it, a tie.
    line = advice(close, "test")
    assert line.startswith("e2e and tbptt tie") and "(0.029)" in line, line
    assert "e2e ahead on 2 of 3 seeds" in line  # 0.80 < 0.81, 0.85 > 0.805, 0.90 > 0.80
    assert line.endswith("tbptt is the cheaper (40 s)")
    near = summarize(
        [result("three", s, 1.0, 300) for s in range(3)]
        + [result("two", s, a, 200) for s, a in enumerate((0.999, 0.999, 0.9995))]
    )
    # Gap 0.0008 with a standard error of 0.0002: still a tie, under CLOSE (0.01).
    assert advice(near, "val") == (
        "three and two tie: val frame accuracy 1.000 against two's 0.999 (+0.001) is less than "
        "0.01 apart; two is the cheaper (200 s)"
    )
    one = summarize([result("e2e", 0, 0.9, 1), result("tbptt", 0, 0.5, 1)])
    assert "on one seed" in advice(one, "test")


def test_the_per_frame_cnn_resets_its_head_s_options() -> None:
    cfg = load_config(None, ["model.head.kind=gru", "model.head.chrono_frames=300"])
    overrides = per_frame_overrides(cfg)
    assert overrides == ["model.head.kind=none", "model.head.chrono_frames=0"]
    assert load_config(None, [*overrides]).model.head.kind == "none"  # valid as it stands
    tcn = load_config(None, ["model.head.kind=mstcn", "model.head.causal=true"])
    assert per_frame_overrides(tcn) == ["model.head.kind=none", "model.head.causal=false"]


DEMO = str(REPO / "distseq" / "demo" / "demo.yaml")


def options(
    tmp_path: Path, *overrides: str, recipes: tuple[str, ...] = RECIPES, test: str = ""
) -> RecipesBench:
    for name in ("t.tar", "v.tar"):  # checked to be there, and not read
        (tmp_path / name).touch()
    shards = [f"data.train={tmp_path}/t.tar", f"data.val={tmp_path}/v.tar"]
    mine, out = [*shards, *overrides], str(tmp_path)
    return RecipesBench(DEMO, mine, 2, [0], 64, 1, list(recipes), [], [], test, out, False)


def test_recipes_that_cannot_apply_are_refused_or_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert checked(
        options(tmp_path, "model.head.kind=mstcn", "model.head.chrono_frames=0")
    ).recipes == [r for r in RECIPES if r != "tbptt"]
    assert "tbptt left out: model.head.kind=mstcn" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"data\.features=true: the recipes train the CNN"):
        checked(options(tmp_path, "data.features=true"))
    with pytest.raises(ConfigError, match=r"data\.val is empty"):
        checked(options(tmp_path, "data.val="))
    with pytest.raises(ConfigError, match=r"train\.select is empty: the recipes are compared at"):
        checked(options(tmp_path, "train.select="))
    with pytest.raises(ConfigError, match=r"--recipes exact: each must be one of"):
        checked(options(tmp_path, recipes=("exact",)))
    with pytest.raises(ConfigError, match=r"memory\.tbptt_frames=64 in the config"):
        checked(options(tmp_path, "memory.tbptt_frames=64"))
    with pytest.raises(ConfigError, match=r"no recipe left"):
        gru = options(tmp_path, "model.head.bidirectional=true", recipes=("tbptt",))
        checked(gru)
    assert "tbptt left out: a bidirectional RNN" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"--recipes: give each once"):
        checked(options(tmp_path, recipes=("tbptt", "tbptt")))
    # A training's own config is checked before any trains, and says which it is.
    bad = replace(options(tmp_path), stage2=["data.window=-1"])
    with pytest.raises(ConfigError, match=r"^bench recipes, the head training: config key data"):
        checked(bad)
    # Its train.select too: a score validation never logs was refused as the training started
    # (with --slurm, after the queue and the earlier stages).
    bad = replace(options(tmp_path), stage3=["train.select=max val_bogus"])
    refused = r"^bench recipes, the stage3 training: config key train\.select='max val_bogus': "
    with pytest.raises(ConfigError, match=refused):
        checked(bad)


def test_the_head_on_features_takes_none_of_the_frames_keys(tmp_path: Path) -> None:
    frames = ["data.frame_stride=2", "data.augment.flip=true", "memory.budget=0.5"]
    runs = SeedRuns(options(tmp_path, *frames, "optim.groups=[{prefix: backbone}]"), 0)
    head = runs.config("head")
    # Features are written at the frames' stride: the head must not stride them again.
    assert head.data.frame_stride == 1 and not head.data.augment.flip
    assert head.memory.budget == "" and head.optim.groups == [] and head.data.window == 0
    assert runs.config("frames").optim.groups == []  # stage 1: one learning rate
    assert runs.config("end_to_end").data.frame_stride == 2  # the config as it is


def test_stage_3_against_the_stage_2_it_started_from() -> None:
    held = replace(result("three_stage", 0, 0.9, 1.0), selected=20, stage2={"accuracy": 0.8})
    # Selected at step 0: stage 3 never beat its start on data.val, yet scores below it on test
    # (a warm start's validation and its test need not agree).
    lost = replace(result("three_stage", 1, 0.75, 1.0), selected=0, stage2={"accuracy": 0.8})
    assert from_stage2([held, lost, result("tbptt", 0, 0.5, 1)], "test") == (
        "three_stage against its stage 2, test frame accuracy of the selected checkpoints: "
        "seed 0 0.800 -> 0.900 (step 20); seed 1 0.800 -> 0.750 (step 0): BELOW stage 2 on 1"
    )
    assert from_stage2([held], "test").endswith("below stage 2 on no seed")
    assert from_stage2([result("tbptt", 0, 0.5, 1)], "test") == ""


def test_the_stage_3_config_holds_the_bench_s_measured_groups() -> None:
    stage3 = load_config(REPO / "configs/stages/3-end-to-end.yaml", ["train.init_from=[]"])
    assert stage3.optim.groups == load_config(None, STAGE3).optim.groups
    assert stage3.optim.lr == load_config(REPO / "configs/cholec-resnet50-lstm.yaml").optim.lr


def test_a_test_split_is_one_that_no_training_or_selection_saw(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_task(data, train=1, val=1, length=301, size=8, seed=0, per_shard=1, test=1)
    cfg = load_config(DEMO, [f"data.train={data}/train-000000.tar", f"data.val={data}/val-*.tar"])
    # A shard folder gives its test split, named as local files resolved.
    assert held_out_shards(str(data), cfg) == str((data / "test-000000.tar").resolve())
    with pytest.raises(ConfigError, match=r"^--test: \S+/val-000000\.tar is also in data\.val: "):
        held_out_shards(f"{data}/{{test,val}}-000000.tar", cfg)
    with pytest.raises(ConfigError, match=r"train-000000\.tar is also in data\.train"):
        held_out_shards(f"{tmp_path}/../{tmp_path.name}/data/train-000000.tar", cfg)
    # Feature shards are named by their shard: a test shard named as a validation one would
    # find the validation's features.
    (tmp_path / "copy").mkdir()
    shutil.copy(data / "val-000000.tar", tmp_path / "copy")
    with pytest.raises(ConfigError, match=r"val-000000\.tar has the name of a shard of data\.val"):
        held_out_shards(str(tmp_path / "copy" / "val-000000.tar"), cfg)
    other = tmp_path / "other"
    write_task(other, train=0, val=0, length=301, size=8, seed=0, per_shard=1, test=1)
    index = json.loads((other / "index.json").read_text())
    (other / "index.json").write_text(json.dumps(index | {"classes": ["a", "b"]}))
    with pytest.raises(ConfigError, match=r"^--test: its classes \['a', 'b'\] \(\S+\) are not "):
        held_out_shards(str(other), cfg)


def test_missing_shards_are_refused_before_any_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing --test shard was found by its scoring, after every training (hours at the
    documented sizes), with exit 1; a missing data.val one at the first validation."""
    data = tmp_path / "data"
    write_task(data, train=1, val=1, length=301, size=8, seed=0, per_shard=1, test=1)
    given = replace(
        options(tmp_path, f"data.train={data}/train-000000.tar", f"data.val={data}/val-*.tar"),
        test=f"{data}/test-00000{{0,1}}.tar",
    )
    with pytest.raises(ConfigError, match=r"^--test: shard not found: \S+/test-000001\.tar$"):
        checked(given)
    with pytest.raises(ConfigError, match=r"^data\.val: shard not found: \S+/v\.tar$"):
        checked(replace(given, overrides=[*given.overrides, f"data.val={data}/v.tar"], test=""))
    with pytest.raises(ConfigError, match=r"^data\.train: shard not found: \S+/t\.tar$"):
        checked(replace(given, overrides=[*given.overrides, f"data.train={data}/t.tar"], test=""))
    # The README's line where shards/ is not there: --test named, not data.val (its folder was
    # "also in data.val"); a missing folder read "manifest not found: index.json", exit 1.
    out = tmp_path / "out"
    for test in ("shards/", str(tmp_path / "missing")):
        argv = ["data.train=shards/", "data.val=shards/", "--test", test, "--out", str(out)]
        assert main(["bench", "recipes", DEMO, *argv]) == 2
        said = f"distseq: error: --test: shard not found: {test}\n"
        assert capsys.readouterr().err == said
    assert not any(out.rglob("*"))  # no training began


def test_slurm_options_without_slurm_are_refused_not_ignored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "recipes", "c.yaml", "--partition", "gpu", "--time", "02:00:00"]) == 2
    assert (
        capsys.readouterr().err
        == "distseq: error: --partition --time: SLURM options, for --slurm\n"
    )


def test_a_folder_made_with_other_options_or_by_another_distseq_is_refused(tmp_path: Path) -> None:
    """A rerun with other options into the same --out would mix old trainings and new."""
    runs = SeedRuns(options(tmp_path), 0)
    frames = runs.root / "frames"
    frames.mkdir(parents=True)
    (frames / "config.yaml").write_text(runs.made_with("frames").replace("steps: 2", "steps: 3"))
    refused = (
        f"^bench recipes: {re.escape(str(frames))} was made with other options than these, or "
        "by another distseq: give another --out, or delete that folder to make it again$"
    )
    with pytest.raises(ConfigError, match=refused):
        runs._read("frames", runs.made_with("frames"))  # as get() reads it before training
    (frames / "config.yaml").write_text(runs.made_with("frames"))
    assert not runs.finished("frames")  # its config, no result.json: it resumes
    record = {"name": "frames", "made_with": runs.made_with("frames"), "scores": {}}
    (frames / "result.json").write_text(json.dumps(record))  # an older bench's
    with pytest.raises(ConfigError, match=refused):
        runs.finished("frames")


def test_the_jobs_the_recipes_need_and_those_a_job_that_fails_leaves_unrun(
    tmp_path: Path,
) -> None:
    assert jobs_of(["tbptt", "three_stage"]) == ["frames", "head", "stage3", "tbptt"]
    assert jobs_of(["per_frame", "two_stage"]) == ["frames", "head"]
    args = options(tmp_path)
    jobs = Jobs(args, SlurmOptions(folder=str(tmp_path / "%j")))
    jobs.waits = {
        "seed-0/frames": [],
        "seed-0/head": ["seed-0/frames"],
        "seed-0/stage3": ["seed-0/frames", "seed-0/head"],
        "seed-0/tbptt": [],
        "seed-1/head": ["seed-1/frames"],
    }
    queued = ["seed-0/head", "seed-0/stage3", "seed-0/tbptt", "seed-1/head"]
    jobs.jobs = dict.fromkeys(queued)  # type: ignore[assignment]  # which are queued, no more
    assert jobs._waiting_on("seed-0/frames") == ["seed-0/head", "seed-0/stage3"]
    assert jobs._waiting_on("seed-0/head") == ["seed-0/stage3"]
    assert jobs._waiting_on("seed-0/tbptt") == []
    # A queued job is waited for by a rerun with the same options only (seeds and recipes aside).
    same = replace(args, seeds=[0, 1], recipes=["tbptt"], json=True)
    assert options_of(same) == options_of(args) != options_of(replace(args, steps=3))


def fake_sacct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    """A ``sacct`` first on PATH, running ``body``: what submitit and the bench read."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    (folder / "sacct").write_text(f"#!/bin/sh\n{body}")
    (folder / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


def test_a_rerun_waits_only_for_a_job_queued_with_its_options_in_a_state_sacct_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no sacct at all
    with pytest.raises(ConfigError, match=r"^bench recipes --slurm reads its jobs' states with sa"):
        check_sacct()
    disabled = "sacct: error: Slurm accounting storage is disabled"
    fake_sacct(tmp_path, monkeypatch, f'echo "{disabled}" >&2; exit 1\n')
    with pytest.raises(
        ConfigError, match=f"which says: {disabled} \\(SLURM's accounting must be on"
    ):
        check_sacct()

    args = options(tmp_path)
    # Job ids no cluster of the suite reaches: submitit caches the states of ended jobs.
    states = {"990001": "RUNNING", "990002": "UNKNOWN", "990003": "CANCELLED by 0"}
    states["990004"] = "PENDING"
    lines = "".join(f'echo "{job}|{state}|ds-h1"\n' for job, state in states.items())
    fake_sacct(tmp_path, monkeypatch, f'echo "JobID|State|NodeList"\n{lines}')
    keys = ["seed-0/frames", "seed-0/head", "seed-0/stage3", "seed-0/tbptt"]
    record = {
        key: {"job": job, "options": options_of(args)}
        for key, job in zip(keys, states, strict=True)
    }
    record["seed-0/tbptt"]["options"] = "another bench's"
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "jobs.json").write_text(json.dumps(record))
    jobs = Jobs(args, SlurmOptions(folder=str(tmp_path / "slurm" / "%j")))
    found = jobs._alive("seed-0/frames")
    assert found is not None and found.job_id == "990001"
    with pytest.raises(TrainingError, match=r"sacct does not say the state of job 990002 \(seed-0"):
        jobs._alive("seed-0/head")
    assert jobs._alive("seed-0/stage3") is None  # ended: submitted anew
    with pytest.raises(ConfigError, match=r"job 990004 \(seed-0/tbptt\) was queued with other op"):
        jobs._alive("seed-0/tbptt")
    assert jobs._alive("seed-1/frames") is None  # never queued


class FakeJob:
    """A submitit job as the bench's wait reads it: ended or not, its state, its node."""

    def __init__(self, job_id: str, state: str) -> None:
        self.job_id, self.state, self.cancelled = job_id, state, False
        self.paths = SimpleNamespace(stderr=f"slurm/{job_id}/log.err")

    def done(self) -> bool:
        return self.state != "PENDING"

    def get_info(self) -> dict[str, str]:
        return {"NodeList": "ds-h1"}

    def cancel(self, check: bool = True) -> None:
        self.cancelled = True


def test_a_job_that_ends_unfinished_cancels_those_that_wait_on_it_and_is_named(
    tmp_path: Path,
) -> None:
    jobs = Jobs(options(tmp_path), SlurmOptions(folder=str(tmp_path / "%j")))
    frames, head, stage3 = FakeJob("7", "FAILED"), FakeJob("8", "PENDING"), FakeJob("9", "PENDING")
    jobs.jobs = {"seed-0/frames": frames, "seed-0/head": head, "seed-0/stage3": stage3}  # type: ignore[dict-item]
    jobs.waits = {
        "seed-0/frames": [],
        "seed-0/head": ["seed-0/frames"],
        "seed-0/stage3": ["seed-0/frames", "seed-0/head"],
    }
    # SLURM would keep the two that wait on it pending forever: they are cancelled, and said.
    with pytest.raises(TrainingError) as error:
        jobs.wait()
    assert str(error.value) == (
        "bench recipes --slurm: 3 of 3 jobs did not finish: job 7 (seed-0/frames) FAILED (log: "
        "slurm/7/log.err); seed-0/head not run: it waited on seed-0/frames; seed-0/stage3 not "
        "run: it waited on seed-0/frames. Run the same command again: the finished trainings "
        "are read back, the others resume from their last checkpoints"
    )
    assert head.cancelled and stage3.cancelled and not frames.cancelled
