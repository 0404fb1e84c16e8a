"""Checkpoints in one process: crash windows of a save, what is kept, what names a checkpoint,
and files of another format refused."""

from __future__ import annotations

import errno
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from distseq.checkpoint import sharded
from distseq.checkpoint.export import load_exported
from distseq.checkpoint.sharded import (
    FORMAT,
    Best,
    Position,
    TrainState,
    latest_checkpoint,
    read_meta,
    read_rank_state,
    resolve_checkpoint,
    restore_rng,
    restore_training,
    save_checkpoint,
)
from distseq.cli import main
from distseq.config import Config, OptimConfig
from distseq.errors import ConfigError, TrainingError
from distseq.train.optim import build_optimizer


def _state() -> TrainState:
    model = torch.nn.Linear(2, 2)
    optimizer, schedule = build_optimizer(model, OptimConfig(), total_steps=10)
    return TrainState(model, optimizer, schedule, Config(), ["a", "b"])


def test_every_crash_window_of_a_save_leaves_latest_complete(tmp_path: Path) -> None:
    state = _state()
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        save_checkpoint(root, state, Position(step=step), {}, keep_last=2)
    # Killed while writing step 3; killed at step 4 between the rename and the pointer update.
    (root / "step_00000003.tmp").mkdir()
    shutil.copytree(root / "step_00000002", root / "step_00000004")
    (root / "latest.tmp").write_text("step_00000004\n")
    assert latest_checkpoint(root) == root / "step_00000002"
    # Resumed from step 2, the run saves step 3; step 4 is from the run it replaced.
    save_checkpoint(root, state, Position(step=3), {}, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000002", "step_00000003"]
    assert latest_checkpoint(root) == root / "step_00000003"


def test_a_first_save_that_fails_says_why_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "checkpoints"

    def fail(path: Path, data: bytes) -> None:
        raise error

    monkeypatch.setattr(sharded, "write_atomic", fail)
    # A full device before any checkpoint: the need is the tensors', the relaunch starts over.
    error: OSError = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(TrainingError) as full:
        save_checkpoint(root, _state(), Position(step=1), {}, keep_last=2)
    assert "could not be written: the device of" in str(full.value)
    assert str(full.value).endswith("resumes from the start")
    # Any other error is said as it is, the partial save removed either way.
    error = PermissionError(errno.EACCES, "Permission denied")
    with pytest.raises(TrainingError, match=r"step_00000001\.tmp could not be written: .*denied"):
        save_checkpoint(root, _state(), Position(step=1), {}, keep_last=2)
    assert not list(root.iterdir())


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _draws() -> tuple[float, float, list[float]]:
    """The next numbers of the three generators a run draws from (dropout, augmentation)."""
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_a_resume_draws_the_random_numbers_the_saved_run_drew_next(tmp_path: Path) -> None:
    # The fast check of what the torchrun resume tests show bit-exact: every generator's state.
    state = _state()
    _seed(7)
    path = save_checkpoint(tmp_path / "checkpoints", state, Position(step=1), {}, keep_last=1)
    saved_run_next = _draws()
    _seed(8)  # the relaunch draws its own numbers before it restores
    resumed = restore_training(path, _state())
    restore_rng(resumed, read_rank_state(resumed))
    assert _draws() == saved_run_next


def test_a_checkpoint_of_another_format_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save_checkpoint(tmp_path / "checkpoints", _state(), Position(step=1), {}, keep_last=1)
    assert read_meta(path)["format"] == FORMAT
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "format": 2}))
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "model.pt")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"checkpoint {path} is unreadable: format 2, this distseq reads format {FORMAT}" in err
    assert not (tmp_path / "model.pt").exists()


@pytest.mark.parametrize("blob", [{"model": {}, "config": {}, "classes": []}, [1, 2]])
def test_an_exported_file_of_another_format_is_one_line(blob: object, tmp_path: Path) -> None:
    # Exports before format 3 carried no format and the memory wrapper's keys.
    path = tmp_path / "old.pt"
    torch.save(blob, path)
    with pytest.raises(TrainingError, match=rf"exported model {path} has format \w+, this distseq"):
        load_exported(path)


def test_only_the_last_keep_last_checkpoints_stay(tmp_path: Path) -> None:
    state, root = _state(), tmp_path / "checkpoints"
    for step in range(1, 6):
        save_checkpoint(root, state, Position(step=step), {}, keep_last=2)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000004", "step_00000005"]


def test_a_run_its_checkpoints_latest_or_a_step_name_one_checkpoint(tmp_path: Path) -> None:
    state, run = _state(), tmp_path / "run"
    for step in (1, 2):
        save_checkpoint(run / "checkpoints", state, Position(step=step), {}, keep_last=3)
    last = run / "checkpoints" / "step_00000002"
    for given in (run, run / "checkpoints", run / "checkpoints" / "latest", last):
        assert resolve_checkpoint(given) == last, given
    first = run / "checkpoints" / "step_00000001"
    assert resolve_checkpoint(first) == first
    with pytest.raises(ConfigError, match=r"nowhere: no such file or folder; give an exported"):
        resolve_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrainingError, match=r"^no checkpoint at .*empty: expected a run dir"):
        resolve_checkpoint(tmp_path / "empty")
    (run / "checkpoints" / "latest").write_text("step_00000009\n")
    with pytest.raises(TrainingError, match=r"latest names 'step_00000009', not a checkpoint"):
        latest_checkpoint(run / "checkpoints")


def test_the_best_is_the_one_the_latest_checkpoint_records_though_its_pointer_lags(
    tmp_path: Path,
) -> None:
    state, root = _state(), tmp_path / "checkpoints"
    for step, value in ((1, 0.5), (2, 0.7)):
        best = Best(step, value, 0)
        save_checkpoint(root, state, Position(step=step), {}, keep_last=1, best=best)
    save_checkpoint(root, state, Position(step=3), {}, keep_last=1, best=Best(2, 0.7, 1))
    assert sorted(p.name for p in root.iterdir()) == [
        "best", "latest", "step_00000002", "step_00000003"
    ]  # fmt: skip
    # Killed after publishing step 2 and before its pointer: `best` still names step 1, kept.
    shutil.copytree(root / "step_00000002", root / "step_00000001")
    (root / "best").write_text("step_00000001\n")
    assert resolve_checkpoint(root) == root / "step_00000002"
    shutil.rmtree(root / "step_00000002")  # by hand: the run keeps it
    with pytest.raises(TrainingError, match=r"names step_00000002 the best validation's checkp"):
        resolve_checkpoint(root)
