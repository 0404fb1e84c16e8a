"""bench recipes: its arithmetic and refusals, worked by hand (its runs: tests/integration)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from conftest import REPO
from distseq.bench.recipes import (
    RECIPES,
    SCORES,
    STAGE3,
    RecipesBench,
    Result,
    SeedRuns,
    advice,
    check_recipes,
    from_stage2,
    per_frame_overrides,
    summarize,
)
from distseq.config import load_config
from distseq.errors import ConfigError


def result(recipe: str, seed: int, accuracy: float, seconds: float) -> Result:
    scores = dict.fromkeys(SCORES, 0.5) | {"val_accuracy": accuracy}
    return Result(recipe, seed, 10, seconds, scores, [(10, accuracy)])


def test_mean_and_sample_std_over_seeds() -> None:
    rows = summarize([result("a", 0, 0.6, 10), result("a", 1, 0.8, 30), result("b", 0, 0.7, 5)])
    assert [r.recipe for r in rows] == ["a", "b"]
    assert rows[0].mean["val_accuracy"] == pytest.approx(0.7)
    # Sample std of 0.6 and 0.8: sqrt(((-0.1)^2 + 0.1^2) / 1) = 0.1414.
    assert rows[0].std["val_accuracy"] == pytest.approx(0.02**0.5)
    assert rows[0].mean["seconds"] == 20 and rows[0].std["seconds"] == pytest.approx(200**0.5)
    assert rows[1].std["val_accuracy"] == 0 and rows[1].seeds == 1


def test_the_advice_weighs_the_gap_against_its_standard_error() -> None:
    wide = summarize(
        [result("e2e", s, a, 100) for s, a in enumerate((0.90, 0.92, 0.94))]
        + [result("tbptt", s, a, 40) for s, a in enumerate((0.70, 0.71, 0.72))]
    )
    # Gap 0.21; stds 0.02 and 0.01, so its standard error is sqrt(0.0004/3 + 0.0001/3) = 0.0129.
    assert advice(wide) == (
        "e2e wins: frame accuracy 0.920 against tbptt's 0.710 (+0.210), more than twice the "
        "gap's standard error (0.013); ahead on 3 of 3 seeds"
    )
    close = summarize(
        [result("e2e", s, a, 100) for s, a in enumerate((0.80, 0.85, 0.90))]
        + [result("tbptt", s, a, 40) for s, a in enumerate((0.81, 0.805, 0.80))]
    )
    # Gap 0.045 against sqrt(0.05^2/3 + 0.005^2/3) = 0.0290: above it, within twice it, a tie.
    line = advice(close)
    assert line.startswith("e2e and tbptt tie") and "(0.029)" in line, line
    assert "e2e ahead on 2 of 3 seeds" in line  # 0.80 < 0.81, 0.85 > 0.805, 0.90 > 0.80
    assert line.endswith("tbptt is the cheaper (40 s)")
    near = summarize(
        [result("three", s, 1.0, 300) for s in range(3)]
        + [result("two", s, a, 200) for s, a in enumerate((0.999, 0.999, 0.9995))]
    )
    # Gap 0.0008 with a standard error of 0.0002: still a tie, under CLOSE (0.01).
    assert advice(near) == (
        "three and two tie: frame accuracy 1.000 against two's 0.999 (+0.001) is less than 0.01 "
        "apart; two is the cheaper (200 s)"
    )
    one = summarize([result("e2e", 0, 0.9, 1), result("tbptt", 0, 0.5, 1)])
    assert "on one seed" in advice(one)


def test_the_per_frame_cnn_resets_its_head_s_options() -> None:
    cfg = load_config(None, ["model.head.kind=gru", "model.head.chrono_frames=300"])
    overrides = per_frame_overrides(cfg)
    assert overrides == ["model.head.kind=none", "model.head.chrono_frames=0"]
    assert load_config(None, [*overrides]).model.head.kind == "none"  # valid as it stands
    tcn = load_config(None, ["model.head.kind=mstcn", "model.head.causal=true"])
    assert per_frame_overrides(tcn) == ["model.head.kind=none", "model.head.causal=false"]


DEMO = str(REPO / "distseq" / "demo" / "demo.yaml")


def options(tmp_path: Path, *overrides: str, recipes: tuple[str, ...] = RECIPES) -> RecipesBench:
    shards = [f"data.train={tmp_path}/t.tar", f"data.val={tmp_path}/v.tar"]
    return RecipesBench(
        DEMO, [*shards, *overrides], 2, [0], 64, 1, list(recipes), [], [], str(tmp_path), False
    )


def test_recipes_that_cannot_apply_are_refused_or_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check_recipes(
        options(tmp_path, "model.head.kind=mstcn", "model.head.chrono_frames=0")
    ) == [r for r in RECIPES if r != "tbptt"]
    assert "tbptt left out: model.head.kind=mstcn" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"data\.features=true: the recipes train the CNN"):
        check_recipes(options(tmp_path, "data.features=true"))
    with pytest.raises(ConfigError, match=r"data\.val is empty"):
        check_recipes(options(tmp_path, "data.val="))
    with pytest.raises(ConfigError, match=r"--recipes exact: each must be one of"):
        check_recipes(options(tmp_path, recipes=("exact",)))
    with pytest.raises(ConfigError, match=r"memory\.tbptt_frames=64 in the config"):
        check_recipes(options(tmp_path, "memory.tbptt_frames=64"))
    with pytest.raises(ConfigError, match=r"no recipe left"):
        gru = options(tmp_path, "model.head.bidirectional=true", recipes=("tbptt",))
        check_recipes(gru)
    assert "tbptt left out: a bidirectional RNN" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"--recipes: give each once"):
        check_recipes(options(tmp_path, recipes=("tbptt", "tbptt")))
    # A training's own config is checked before any trains, and says which it is.
    bad = replace(options(tmp_path), stage2=["data.window=-1"])
    with pytest.raises(ConfigError, match=r"^bench recipes, the head training: config key data"):
        check_recipes(bad)


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
    held = Result("three_stage", 0, 30, 1.0, {}, [(0, 0.8), (10, 0.7), (20, 0.9)])
    lost = Result("three_stage", 1, 30, 1.0, {}, [(0, 0.8), (10, 0.85), (20, 0.75)])
    assert from_stage2([held, lost, result("tbptt", 0, 0.5, 1)]) == (
        "three_stage from stage 2's accuracy: seed 0 0.800 -> 0.900 (lowest 0.700); "
        "seed 1 0.800 -> 0.750 (lowest 0.750): ENDED BELOW stage 2 on 1"
    )
    assert from_stage2([held]).endswith("ended below stage 2 on no seed")
    assert from_stage2([result("tbptt", 0, 0.5, 1)]) == ""


def test_the_stage_3_config_holds_the_bench_s_measured_groups() -> None:
    stage3 = load_config(REPO / "configs/stages/3-end-to-end.yaml", ["train.init_from=[]"])
    assert stage3.optim.groups == load_config(None, STAGE3).optim.groups
    assert stage3.optim.lr == load_config(REPO / "configs/cholec-resnet50-lstm.yaml").optim.lr
