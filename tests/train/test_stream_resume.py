"""A relaunched run's train stream: from the positions its checkpoint holds, or anew with a line
saying why where they do not fit (stream-level exactness: tests/data/test_streams.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from distseq.config import load_config
from distseq.train.loop import train


@pytest.mark.slow
def test_a_relaunch_with_other_batches_starts_the_stream_anew_and_says_why(
    tmp_path: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tiny_config(tmp_path, shards)
    train(load_config(config, ["train.stop_after=2", "data.num_workers=2"]))
    saved = torch.load(tmp_path / "run/checkpoints/step_00000002/rank0.pt", weights_only=True)
    assert sorted(saved["streams"]) == [0, 1]  # each worker's position after its last batch
    capsys.readouterr()
    train(load_config(config, ["data.num_workers=2", "data.batch_size=3"]))
    out = capsys.readouterr().out
    assert (
        "step_00000002: data.batch_size changed since it was saved: the data stream starts anew "
        "here, so the batches from here on differ from the saved run's"
    ) in out
    assert "step 3: loss" in out
