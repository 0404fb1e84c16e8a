"""``distseq eval`` under torchrun: 2 ranks give the report of 1 process, every video once."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_distseq, tiny_config
from distseq.config import load_config
from distseq.train.loop import train
from streams import N_VAL


def test_two_ranks_report_what_one_process_does(tmp_path: Path, shards: Path) -> None:
    config = tiny_config(tmp_path, shards)
    train(load_config(config, ["data.num_workers=0", "data.val="]))
    run = tmp_path / "run"
    split = str(shards / "val-{000000..000001}.tar")  # 5 videos: 3 on rank 0, 2 on 1
    args = ["eval", str(run), "--split", split, "--fps", "1", "--relaxed-seconds", "2", "--json"]
    one = run_distseq(*args, "--out", str(tmp_path / "one"), cwd=tmp_path)
    two = run_distseq(*args, "--out", str(tmp_path / "two"), cwd=tmp_path, torchrun=2)
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    assert json.loads(two.stdout) == json.loads(one.stdout)  # rank 0 alone prints it
    report = json.loads((tmp_path / "two" / "eval.json").read_text())
    assert report["videos"] == N_VAL
    assert len(list((tmp_path / "two").glob("*.csv"))) == N_VAL  # each rank wrote its own
