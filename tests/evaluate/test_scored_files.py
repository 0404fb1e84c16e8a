"""``distseq eval --predictions``: prediction files of three layouts against truth files, matched
by video name, with values worked out by hand; folds; what is missing is said in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from distseq.cli import main
from distseq.data.cholec80 import CHOLEC80_PHASES

P, C = "Preparation", "CalotTriangleDissection"


def truth_and_predictions(root: Path) -> tuple[Path, Path]:
    """Three videos, each predicted in another layout; one truth without prediction and one
    prediction without truth."""
    truth, pred = root / "truth", root / "pred"
    truth.mkdir(parents=True)
    pred.mkdir()
    # Cholec80's annotation layout.
    (truth / "video01-phase.txt").write_text(f"Frame\tPhase\n0\t{P}\n1\t{P}\n2\t{C}\n3\t{C}\n")
    (truth / "video02-phase.txt").write_text(f"Frame\tPhase\n0\t{P}\n1\t{P}\n2\t{P}\n3\t{P}\n")
    # MS-TCN's groundTruth layout, written on Windows.
    (truth / "video03.txt").write_bytes(b"\xef\xbb\xbf" + f"{C}\r\n".encode() * 4)
    (truth / "video04-phase.txt").write_text(f"Frame\tPhase\n0\t{P}\n")
    # distseq's CSV (its header names the classes in id order): P C C C.
    header = "frame,time_s,phase," + ",".join(CHOLEC80_PHASES) + "\n"
    rows = "".join(f"{k},{k}.000,{name},0\n" for k, name in enumerate([P, C, C, C]))
    (pred / "video01.csv").write_text(header + rows)
    # Frame<TAB>Phase with class ids instead of names: P P P C.
    (pred / "video02.txt").write_text("Frame\tPhase\n0\t0\n1\t0\n2\t0\n3\t1\n")
    # MS-TCN's predictions: a header line, then the labels separated by spaces.
    (pred / "video03").write_text(f"### Frame level recognition: ###\n{C} {C} {C} {C}")
    (pred / "video05.txt").write_text(f"{P}\n")
    (pred / "eval.json").write_text("{}")  # not a prediction file: skipped
    return truth, pred


def evaluate(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[dict, str]:
    assert main(["eval", *map(str, argv), "--json"]) == 0
    out = capsys.readouterr().out
    start = out.index("{\n")
    return json.loads(out[start:]), out[:start]


def test_three_layouts_scored_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truth, pred = truth_and_predictions(tmp_path)
    report, said = evaluate(capsys, "--predictions", pred, "--labels", truth)
    assert said.splitlines() == [
        f"video04: no prediction file in {pred}, left out",
        f"video05: no truth file in {truth}, left out",
    ]
    assert report["videos"] == 3 and report["classes"] == list(CHOLEC80_PHASES)
    # video01: truth P P C C, predicted P C C C: 3/4; video02: P P P P against P P P C: 3/4;
    # video03: all 4 right. Frames pooled: 10/12; per video: (3/4 + 3/4 + 1) / 3 = 5/6.
    assert report["frame_level"]["accuracy"] == pytest.approx(10 / 12)
    assert report["accuracy"]["mean"] == pytest.approx(5 / 6)
    # Edit: video01 P C against P C: 100; video02 P against P C: 1 edit of 2 segments, 50;
    # video03: 100. Mean 250 / 3 %.
    assert report["edit"]["mean"] == pytest.approx(2.5 / 3)
    # F1@50: video01 P [0, 1) vs [0, 2) IoU 1/2: TP; C [1, 4) vs [2, 4) IoU 2/3: TP. video02: P
    # [0, 3) vs [0, 4) TP, C a FP. video03: TP. TP 4, FP 1, FN 0: F1 = 8 / 9.
    assert report["f1@50"] == pytest.approx(8 / 9)
    assert json.loads((pred / "eval" / "eval.json").read_text()) == report
    # The script protocol applies as well, at the frame rate given.
    script, _ = evaluate(
        capsys, "--predictions", pred, "--labels", truth, "--protocol", "script", "--fps", 0.1
    )
    assert script["protocol"] == "script" and script["relaxed_frames"] == 1
    # With a 1-frame window, video01's early C at frame 1 is tested at P's last frame but marks
    # its first (right anyway): still 3/4; video02's single P segment ends at frame 3, predicted
    # C (one early): marks frame 0, already right: 3/4. Unchanged: 5/6.
    assert script["accuracy"]["mean"] == pytest.approx(5 / 6)
    assert math.isnan(script["f1"]["mean"])


def test_predictions_at_a_lower_rate_than_the_truth(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truth, pred = tmp_path / "truth", tmp_path / "pred"
    truth.mkdir()
    pred.mkdir()
    # Truth at 25 fps for 50 frames, predictions at 1 fps: frames 0 and 25.
    (truth / "video01-phase.txt").write_text(
        "".join(f"{k}\t{P if k < 25 else C}\n" for k in range(50))
    )
    (pred / "video01-phase.txt").write_text(f"Frame\tPhase\n0\t{P}\n25\t{P}\n")
    report, said = evaluate(capsys, "--predictions", pred, "--labels", truth, "--fps", 1)
    assert said.splitlines() == [
        "classes, in id order (--mapping sets them): " + ", ".join(CHOLEC80_PHASES),
        "video01: 2 of 50 truth frames predicted, scored on those",
    ]
    assert report["frame_level"]["accuracy"] == 0.5


def test_folds_give_each_split_and_their_mean_and_std(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truth, pred = truth_and_predictions(tmp_path)
    better = tmp_path / "better"
    better.mkdir()
    for file in pred.iterdir():
        (better / file.name).write_bytes(file.read_bytes())
    (better / "video02.txt").write_text("0\n0\n0\n0\n")  # now all right: 11 of 12 frames
    out = tmp_path / "folds"
    summary, _ = evaluate(
        capsys, "--predictions", pred, "--predictions", better, "--labels", truth, "--out", out
    )
    assert summary["folds"]["fold1"]["frame_accuracy"] == pytest.approx(10 / 12)
    assert summary["folds"]["fold2"]["frame_accuracy"] == pytest.approx(11 / 12)
    # Mean of 10/12 and 11/12, std (N - 1) |11/12 - 10/12| / sqrt(2).
    assert summary["frame_accuracy"]["mean"] == pytest.approx(10.5 / 12)
    assert summary["frame_accuracy"]["std"] == pytest.approx((1 / 12) / math.sqrt(2))
    assert json.loads((out / "folds.json").read_text()) == summary
    assert (out / "fold1" / "eval.json").is_file() and (out / "fold2" / "eval.json").is_file()
    argv = ["--predictions", str(pred), "--predictions", str(better), "--labels", str(truth)]
    assert main(["eval", *argv, "--out", str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    # Papers' layout: F1@10, @25, @50, Edit, Acc (frame), then the phase metrics' means.
    assert table[-4].split()[:6] == ["F1@10", "F1@25", "F1@50", "Edit", "Acc", "video"]
    assert table[-3].split()[5] == "83.33" and table[-2].split()[5] == "91.67"
    assert table[-1].startswith("mean ± std") and "87.50 ± 5.89" in table[-1]
    assert (
        main(["eval", "--predictions", str(pred), "--labels", str(truth), "--out", str(out)]) == 0
    )
    table = capsys.readouterr().out.splitlines()
    assert table[2].startswith("3 videos, fps None, relaxed boundary off, distseq protocol")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--predictions", "{pred}"], "--predictions and --labels go together"),
        (
            ["--predictions", "{pred}", "--predictions", "{pred}", "--labels", "{truth}"],
            "pass --out",
        ),
        (["--predictions", "{truth}/nothing", "--labels", "{truth}"], "nothing: not a folder"),
        (
            ["--predictions", "{pred}", "--labels", "{truth}", "--mapping", "{truth}/video03.txt"],
            "expected '<id> <name>'",
        ),
        (
            ["--predictions", "{pred}", "--labels", "{truth}", "--relaxed-seconds", "10"],
            "needs the frame rate",
        ),
    ],
)
def test_bad_requests_are_one_line(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truth, pred = truth_and_predictions(tmp_path)
    args = [a.format(pred=pred, truth=truth) for a in argv]
    assert main(["eval", *args]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_a_label_outside_the_classes_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truth, pred = truth_and_predictions(tmp_path)
    (pred / "video03").write_text("### Frame level recognition: ###\nCut Cut Cut Cut")
    (pred / "video01.csv").unlink()  # so the classes come from the truth's names
    assert main(["eval", "--predictions", str(pred), "--labels", str(truth)]) == 1
    err = capsys.readouterr().err
    assert f"{pred / 'video03'}: frame 0's label 'Cut' is not a class of the truth files" in err


def _labels_alone(root: Path, truth_labels: list[str], predicted: list[str]) -> tuple[Path, Path]:
    """One video: truth and predictions in MS-TCN's one-label-a-line layout (no frame numbers),
    with the mapping of its two classes."""
    truth, pred = root / "truth", root / "pred"
    truth.mkdir(parents=True)
    pred.mkdir()
    (truth / "v2.txt").write_text("\n".join(truth_labels) + "\n")
    (pred / "v2.txt").write_text("\n".join(predicted) + "\n")
    (root / "mapping.txt").write_text("0 a\n1 b\n")
    return truth, pred


@pytest.mark.parametrize("lines", [10, 1, 70])
def test_labels_alone_of_another_length_are_refused_not_scored_on_their_first_frames(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: int
) -> None:
    # The case: 60 truth frames (30 a, 30 b) and a cut-off prediction run of 10 lines of
    # a, which was scored 100% on the first 10 truth frames; a file of one line; a longer one.
    truth, pred = _labels_alone(tmp_path, ["a"] * 30 + ["b"] * 30, ["a"] * lines)
    argv = ["eval", "--predictions", str(pred), "--labels", str(truth)]
    assert main([*argv, "--mapping", str(tmp_path / "mapping.txt")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"distseq: error: {pred / 'v2.txt'}: {lines} labels without frame numbers for the 60 "
        "truth frames of its video: a cut-off file, or predictions at another rate? For a label "
        "every Nth truth frame, give --prediction-stride N"
    )


def test_a_stated_stride_scores_the_frames_it_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 10 lines at a stride of 6 are truth frames 0, 6, ..., 54: five in a's half (right), five
    # in b's (predicted a: wrong). Accuracy 5/10, not the 10/10 of the first 10 frames.
    truth, pred = _labels_alone(tmp_path, ["a"] * 30 + ["b"] * 30, ["a"] * 10)
    argv = ["--predictions", pred, "--labels", truth, "--mapping", tmp_path / "mapping.txt"]
    report, said = evaluate(capsys, *argv, "--prediction-stride", 6)
    assert report["frame_level"]["accuracy"] == 0.5
    assert "10 of 60 truth frames predicted, scored on those" in said
    # A stride that does not fit the count is refused too: 60 frames at 7 are 8 or 9 lines.
    assert main(["eval", *map(str, argv), "--prediction-stride", "7"]) == 1
    assert "with --prediction-stride 7, 8 or 9 are expected" in capsys.readouterr().err
    # Frame numbers already say which frames are predicted: the option is refused with them.
    (pred / "v2.txt").write_text("Frame\tPhase\n0\ta\n6\ta\n")
    assert main(["eval", *map(str, argv), "--prediction-stride", "6"]) == 2
    assert "numbers its frames, which say what it predicts" in capsys.readouterr().err


def test_labels_alone_of_the_truth_s_length_are_scored_frame_by_frame(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truth, pred = _labels_alone(tmp_path, ["a"] * 3 + ["b"] * 3, ["a", "a", "b", "b", "b", "b"])
    report, _ = evaluate(
        capsys, "--predictions", pred, "--labels", truth, "--mapping", tmp_path / "mapping.txt"
    )
    assert report["frame_level"]["accuracy"] == pytest.approx(5 / 6)
