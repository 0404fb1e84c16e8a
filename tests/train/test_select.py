"""train.select and train.patience: the kept checkpoint is the best of the validations (a warm
start's step 0 among them), an early stop comes where the patience runs out, and a resume keeps
both the best and the count; what loads a run takes its best."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import tiny_config
from distseq.checkpoint.export import load_checkpointed
from distseq.checkpoint.sharded import resolve_checkpoint
from distseq.config import load_config
from distseq.errors import ConfigError
from distseq.train.loop import train
from distseq.train.select import Selection

# Every step validated. lr 1e-9: the weights barely move, so the accuracy stays the same and no
# validation after the first beats it.
EVERY = ["train.eval_every=1", "train.save_every=0", "train.keep_last=1"]
STILL = ["optim.lr=1e-9", "train.select=max val_accuracy", "train.patience=2", "train.steps=10"]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def checkpoints(run: Path) -> set[str]:
    return {p.name for p in (run / "checkpoints").iterdir()}


def pointer(run: Path, name: str) -> str:
    return (run / "checkpoints" / name).read_text().strip()


def test_a_score_validation_never_logs_is_refused_without_data_val(
    tmp_path: Path, shards: Path
) -> None:
    """It passed with a notice ("no data.val to validate on"): refused, as with data.val, since
    no data.val makes it valid."""
    config = tiny_config(tmp_path, shards)
    refused = r"^config key train\.select='max val_bogus': validation logs no val_bogus; one of "
    with pytest.raises(ConfigError, match=refused):
        train(load_config(config, ["data.val=", "train.select=max val_bogus"]))
    assert not (tmp_path / "run" / "checkpoints").exists()  # before any step


@pytest.mark.parametrize("select,best", [("max val_loss", "min"), ("min val_jaccard", "max")])
def test_a_selection_of_the_worst_validation_is_refused(select: str, best: str) -> None:
    """Kept the worst checkpoint silently, found out after the run."""
    metric = select.split()[1]
    refused = f"^config key train\\.select='{select}': would keep the worst validation's "
    with pytest.raises(ConfigError, match=refused + f"checkpoint: give '{best} {metric}'$"):
        Selection.of(select, 0)
    assert Selection.of(f"{best} {metric}", 0).highest == (best == "max")


@pytest.mark.slow
def test_the_best_validation_is_kept_beside_the_last(tmp_path: Path, shards: Path) -> None:
    config = tiny_config(tmp_path, shards)
    train(load_config(config, [*EVERY, "train.steps=5", "train.select=min val_loss"]))
    run = tmp_path / "run"
    losses = {r["step"]: r["val_loss"] for r in records(run) if "val_loss" in r}
    assert sorted(losses) == [1, 2, 3, 4, 5]
    best = min(losses, key=lambda s: (losses[s], s))  # the lowest; a tie: the earliest
    assert pointer(run, "best") == f"step_{best:08d}" and pointer(run, "latest") == "step_00000005"
    # keep_last=1 prunes all but the last, and the best stays beside it.
    assert checkpoints(run) == {"best", "latest", f"step_{best:08d}", "step_00000005"}
    assert resolve_checkpoint(run) == run / "checkpoints" / f"step_{best:08d}"
    loaded = load_checkpointed(run)
    assert loaded.step == best
    assert loaded.which.startswith(f"step {best}, the best validation (min val_loss: ")


@pytest.mark.slow
def test_a_relaunch_whose_best_checkpoint_is_gone_says_so_and_selects_again(
    tmp_path: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The relaunch trained on silently, and its checkpoints' meta.json named the deleted
    folder: export failed on the finished run."""
    config = tiny_config(tmp_path, shards)
    run, still = tmp_path / "run", [*EVERY, "optim.lr=1e-9", "train.steps=5"]
    train(load_config(config, [*still, "train.stop_after=3"]))
    assert pointer(run, "best") == "step_00000001"  # the accuracy stays: the first is kept
    shutil.rmtree(run / "checkpoints" / "step_00000001")
    capsys.readouterr()
    train(load_config(config, still))
    gone = run / "checkpoints" / "step_00000001"
    said = f"{gone}, the best validation's checkpoint (step 1), is gone: the selection starts "
    assert said in capsys.readouterr().err
    assert pointer(run, "best") == "step_00000004"  # the first validation after the launch
    meta = json.loads((run / "checkpoints" / "step_00000005" / "meta.json").read_text())
    assert meta["best"]["step"] == 4
    assert load_checkpointed(run).step == 4  # as export takes it


@pytest.mark.slow
def test_patience_stops_the_run_and_a_resume_counts_on(
    tmp_path: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    config = tiny_config(tmp_path, shards)
    train(load_config(config, [*EVERY, *STILL, f"train.out_dir={one}"]))
    # Validation 1 is the best; 2 and 3 do not beat it: patience 2 is spent at step 3.
    assert [r["step"] for r in records(one) if "loss" in r] == [1, 2, 3]
    assert pointer(one, "best") == "step_00000001" and pointer(one, "latest") == "step_00000003"
    # The same run stopped after step 2 and relaunched: the count goes on from 1, not 0.
    train(load_config(config, [*EVERY, *STILL, f"train.out_dir={two}", "train.stop_after=2"]))
    train(load_config(config, [*EVERY, *STILL, f"train.out_dir={two}"]))
    assert [r["step"] for r in records(two) if "loss" in r] == [1, 2, 3]
    assert pointer(two, "best") == "step_00000001" and pointer(two, "latest") == "step_00000003"
    # A run that stopped early, relaunched, ends at once.
    capsys.readouterr()
    train(load_config(config, [*EVERY, *STILL, f"train.out_dir={two}"]))
    assert [r["step"] for r in records(two) if "loss" in r] == [1, 2, 3]
    assert "the run stopped early at step 3; best: max val_accuracy" in capsys.readouterr().out

    # A warm start from that run takes its best (step 1) and is validated at step 0, where it
    # is as good as anything after: the step-0 checkpoint is kept as the best.
    warm = [f"train.out_dir={tmp_path / 'warm'}", f"train.init_from=[{one}]", "train.patience=1"]
    train(load_config(config, [*EVERY, *STILL, *warm]))
    said = f"train.init_from {one} (step 1, the best validation (max val_accuracy: "
    assert said in capsys.readouterr().out
    assert 0 in {r["step"] for r in records(tmp_path / "warm") if "val_accuracy" in r}
    assert pointer(tmp_path / "warm", "best") == "step_00000000"
    assert [r["step"] for r in records(tmp_path / "warm") if "loss" in r] == [1]
