"""``distseq eval`` on a short real training run: the numbers training logged, eval.json, CSVs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import tiny_config
from distseq.checkpoint.export import export
from distseq.cli import main
from distseq.config import load_config
from distseq.train.loop import train
from streams import N_VAL, write_stream_shards


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, shards: Path) -> Path:
    """3 steps on videos of 9 to 14 frames, validated at the end."""
    root = tmp_path_factory.mktemp("eval")
    config = tiny_config(root, shards)
    train(load_config(config, ["data.num_workers=0"]))
    return root / "run"


def logged(run: Path) -> dict[str, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in records if "val_accuracy" in r)


def evaluate(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["eval", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_eval_gives_what_training_validated(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = evaluate(capsys, str(run))
    val = logged(run)
    assert report["videos"] == N_VAL and report["relaxed_frames"] == 0
    assert report["frame_level"]["accuracy"] == pytest.approx(val["val_accuracy"], abs=1e-12)
    assert report["accuracy"]["mean"] == pytest.approx(val["val_video_accuracy"], abs=1e-12)
    assert report["jaccard"]["mean"] == pytest.approx(val["val_jaccard"], abs=1e-12)
    assert report["edit"]["mean"] == pytest.approx(val["val_edit"], abs=1e-12)
    assert report["f1@50"] == pytest.approx(val["val_f1@50"], abs=1e-12)
    assert set(report) >= {"fps", "precision", "recall", "f1", "per_phase", "frame_level"}
    assert json.loads((run / "eval" / "eval.json").read_text()) == report
    # One CSV per video: a row per frame, probabilities summing to 1, the phase their argmax.
    files = sorted((run / "eval").glob("*.csv"))
    assert [f.stem for f in files] == [f"val-{i:06d}" for i in range(N_VAL)]
    frames = 0
    for file in files:
        rows = list(csv.DictReader(file.open()))
        frames += len(rows)
        assert [int(r["frame"]) for r in rows] == list(range(len(rows)))
        for r in rows:
            probs = {name: float(r[name]) for name in ("phase0", "phase1", "phase2")}
            assert sum(probs.values()) == pytest.approx(1, abs=1e-5)
            assert r["phase"] == max(probs, key=probs.__getitem__) and r["time_s"] == ""
    assert 9 * N_VAL <= frames <= 14 * N_VAL


@pytest.mark.slow
def test_an_exported_model_and_a_relaxed_window(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exported = tmp_path / "model.pt"
    export(run, exported)
    strict = evaluate(capsys, str(exported), "--out", str(tmp_path / "e"))
    # The exported file holds the checkpoint's weights: the same report to the last digit, but
    # for which model it names.
    direct = evaluate(capsys, str(run), "--out", str(tmp_path / "r"))
    assert strict.pop("model") == "exported at step 3" and direct.pop("model").startswith("step 3")
    assert strict == direct
    relaxed = evaluate(
        capsys, str(exported), "--fps", "2", "--relaxed-seconds", "1", "--out", str(tmp_path / "x")
    )
    assert (relaxed["fps"], relaxed["relaxed_frames"]) == (2.0, 2)
    assert relaxed["accuracy"]["mean"] >= strict["accuracy"]["mean"]
    assert relaxed["frame_level"] == strict["frame_level"]  # frame level is strict always
    assert relaxed["f1@10"] == strict["f1@10"]  # and so are the segments
    # phase0 as background: its runs are no segments, which changes the segment counts only.
    background = evaluate(capsys, str(run), "--background", "phase0", "--out", str(tmp_path / "b"))
    assert background["background"] == ["phase0"] and strict["background"] == []
    assert background["frame_level"] == strict["frame_level"]


def test_bad_requests_are_one_line(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", str(run), "--relaxed-seconds", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the frame rate" in err and "--fps" in err
    other = write_stream_shards(tmp_path / "other")
    index = json.loads((other / "index.json").read_text())
    (other / "index.json").write_text(json.dumps({**index, "classes": ["a", "b", "c"]}))
    assert main(["eval", str(run), "--split", str(other / "val-{000000..000001}.tar")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "classes ['a', 'b', 'c'] are not the model's" in err
    assert main(["eval", str(run), "--background", "nothing"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--background nothing: not one of the classes" in err
    assert main(["eval", str(run), "--protocol", "script", "--fps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "for its 7 phases in procedure order; these are 3" in err
    assert main(["eval", str(run), "--mapping", str(run / "config.yaml")]) == 2
    assert "--mapping is for --predictions" in capsys.readouterr().err


def test_several_models_are_folds(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same model twice: each fold's numbers are its eval's, their std 0.
    single = evaluate(capsys, str(run), "--out", str(tmp_path / "one"))
    summary = evaluate(capsys, str(run), str(run), "--out", str(tmp_path / "two"))
    assert summary["sources"] == [str(run), str(run)]
    assert summary["folds"]["fold1"]["edit"] == single["edit"]["mean"]
    assert summary["frame_accuracy"] == {"mean": single["frame_level"]["accuracy"], "std": 0.0}
    assert json.loads((tmp_path / "two" / "fold2" / "eval.json").read_text()) == single


def test_features_of_a_run_through_the_command(
    run: Path, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["features", str(run), f"{shards}/val-000000.tar", "--out", str(tmp_path / "npy")]
    assert main([*argv, "--format", "npy"]) == 0
    model, said = capsys.readouterr().out.splitlines()
    # The run's checkpoint it took: the best validation's, here the last step's too.
    assert model.startswith(f"model {run}: step 3, the best validation (max val_accuracy: ")
    assert model.endswith("), the run's last")
    assert said.startswith("wrote 3 videos (") and "0 videos already there" in said
    names = sorted(p.name for p in (tmp_path / "npy").iterdir())
    assert names == [f"val-{i:06d}.npy" for i in range(3)]
    assert main([*argv, "--format", "npy"]) == 0
    assert "wrote 0 videos (0 frames)" in capsys.readouterr().out
    argv[-1] = str(tmp_path / "shards")
    assert main(argv) == 0  # shards by default
    assert "wrote 3 videos (" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == [
        "index.json",
        "val-000000.tar",
    ]
    assert main(argv) == 0
    assert "1 shards already there" in capsys.readouterr().out
