"""The script protocol (``--protocol script``): Cholec80's MATLAB evaluation, slips included.

Hand-worked cases first, then the whole report against ``matlab_reference``: a line-by-line
Python rendering of ``Evaluate.m`` (1-based, segment by segment, as Matlab runs it) and of
``Main.m``'s aggregation, on random videos."""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest

from distseq.score.metrics import Scoring, count_video, summarize, video_metrics

SCRIPT = "script"


def accuracy(pred: list[int], truth: list[int], window: int, protocol: str) -> float:
    counts = count_video("v", pred, truth, 7, Scoring(window, protocol=protocol))
    return video_metrics(counts, protocol)["accuracy"]  # type: ignore[return-value]


def test_the_end_window_marks_the_first_frames() -> None:
    # Truth 0 0 0 0 1 1 1 1, window 2. Frame 3 is predicted 1 (the next phase, early) and frame 7
    # is predicted 2: each within the last 2 frames of its segment. distseq forgives both: 8/8.
    # The script tests the last 2 frames but marks the first 2 (frames 1 and 5, already
    # right), so frames 3 and 7 stay wrong: 6/8.
    pred, truth = [0, 0, 0, 1, 1, 1, 1, 2], [0, 0, 0, 0, 1, 1, 1, 1]
    assert accuracy(pred, truth, 2, "distseq") == 1.0
    assert accuracy(pred, truth, 2, SCRIPT) == 6 / 8
    # Frame 0 wrong too (predicted 3), frame 3 early: the test at frame 3 (k = 1 of the last 2)
    # marks frame 1, which is right anyway; frame 0 (k = 0) is tested at frame 2, which is right.
    assert accuracy([3, 0, 0, 1], [0, 0, 0, 0], 2, SCRIPT) == 2 / 4
    # Frame 0 wrong, frame 2 early: the test at frame 2 (k = 0) marks frame 0: now right.
    assert accuracy([3, 0, 1, 0], [0, 0, 0, 0], 2, SCRIPT) == 3 / 4


@pytest.mark.parametrize(
    ("phase", "pred", "script"),
    [
        (3, 5, 1.0),  # phase 4 may be predicted two phases early (as 6)
        (4, 6, 1.0),  # phase 5 too (as 7)
        (5, 3, 1.0),  # phase 6 may be predicted two phases late (as 4)
        (6, 4, 1.0),  # phase 7 too (as 5)
        (5, 0, 0.0),  # five phases late: never
        (2, 4, 0.0),  # phase 3 two phases early: only 4 to 7 have the extra allowance
        (1, 0, 1.0),  # one phase late: every phase
    ],
)
def test_the_extra_allowances_of_phases_4_to_7(phase: int, pred: int, script: float) -> None:
    # A 2-frame segment inside a window of 2: every frame is in both windows.
    assert accuracy([pred, pred], [phase, phase], 2, SCRIPT) == script
    distseq = 1.0 if abs(pred - phase) == 1 else 0.0  # one phase early or late only
    assert accuracy([pred, pred], [phase, phase], 2, "distseq") == distseq


def test_a_phase_never_predicted_can_have_precision_100() -> None:
    # Truth 0 0 1 1 1, prediction 0 0 0 2 2, window 1. Phase 1's first frame is predicted 0 (one
    # late): right. Its TP is 1, but it is never predicted: 1 / 0 = Inf in Matlab, which the
    # script clips to 100 %. distseq leaves it out (NaN); both give recall 1/3.
    counts = count_video("v", [0, 0, 0, 2, 2], [0, 0, 1, 1, 1], 7, Scoring(1, protocol=SCRIPT))
    script = video_metrics(counts, SCRIPT)
    assert script["precision"][1] == 1.0 and script["recall"][1] == pytest.approx(1 / 3)  # type: ignore[index]
    assert math.isnan(video_metrics(counts)["precision"][1])  # type: ignore[index]
    # Phase 2 is predicted but absent: no entry of its own, in either protocol.
    assert math.isnan(script["precision"][2])  # type: ignore[index]
    # The script computes no F1.
    assert all(math.isnan(x) for x in script["f1"])  # type: ignore[union-attr]


def test_mean_for_jaccard_and_recall_nanmean_for_precision() -> None:
    # Two videos of phases 0 and 1 only: phases 2 to 6 occur in no video, so their per-phase
    # means are NaN; Matlab's mean over phases of Jaccard and recall is then NaN, and nanmean
    # of precision is over phases 0 and 1. distseq takes the mean over the phases that occur.
    videos = [
        count_video("a", [0, 0, 1, 1], [0, 0, 1, 1], 7, Scoring(0, protocol=SCRIPT)),
        count_video("b", [0, 1, 1, 1], [0, 0, 1, 1], 7, Scoring(0, protocol=SCRIPT)),
    ]
    classes = [f"p{i}" for i in range(7)]
    script = summarize(videos, classes, SCRIPT)
    assert math.isnan(script["jaccard"]["mean"]) and math.isnan(script["recall"]["mean"])  # type: ignore[index]
    # Precision: phase 0 is 1 in a and 1/1 in b, phase 1 is 1 in a and 2/3 in b: per phase 1
    # and 5/6, their mean 11/12.
    assert script["precision"]["mean"] == pytest.approx(11 / 12)  # type: ignore[index]
    assert math.isnan(script["f1"]["mean"])  # type: ignore[index]
    distseq = summarize(videos, classes)
    # Jaccard: phase 0 is 1 and 1/2, phase 1 is 1 and 2/3: (3/4 + 5/6) / 2.
    assert distseq["jaccard"]["mean"] == pytest.approx((3 / 4 + 5 / 6) / 2)  # type: ignore[index]


def matlab_reference(videos: list[tuple[list[int], list[int]]], fps: int) -> dict[str, float]:
    """Evaluate.m per video and Main.m's means, written out as Matlab runs them (1-based ids,
    segments found per phase, the early-transition mask applied to the first t frames)."""
    jac, prec, rec, acc = [], [], [], []
    for pred0, truth0 in videos:
        gt = np.array(truth0) + 1
        pred = np.array(pred0) + 1
        diff = pred - gt
        updated = np.zeros(len(gt))
        for phase in range(1, 8):
            runs, start = [], None
            for i, g in enumerate([*gt, 0]):  # bwconncomp of gt == phase, in 1-D
                if g == phase and start is None:
                    start = i
                elif g != phase and start is not None:
                    runs.append((start, i - 1))
                    start = None
            for start, end in runs:
                cur = diff[start : end + 1].copy()
                t = min(10 * fps, len(cur))
                head, tail = cur[:t].copy(), cur[len(cur) - t :].copy()
                if phase in (4, 5):
                    cur[:t][head == -1] = 0
                    cur[:t][(tail == 1) | (tail == 2)] = 0
                elif phase in (6, 7):
                    cur[:t][(head == -1) | (head == -2)] = 0
                    cur[:t][(tail == 1) | (tail == 2)] = 0
                else:
                    cur[:t][head == -1] = 0
                    cur[:t][tail == 1] = 0
                updated[start : end + 1] = cur
        j, p, r = [], [], []
        for phase in range(1, 8):
            if not (gt == phase).any():
                j.append(math.nan), p.append(math.nan), r.append(math.nan)
                continue
            union = (pred == phase) | (gt == phase)
            tp = int((updated[union] == 0).sum())
            j.append(tp / union.sum() * 100)
            npred = int((pred == phase).sum())
            p.append(tp * 100 / npred if npred else (math.inf if tp else math.nan))
            r.append(tp * 100 / (gt == phase).sum())
        jac.append(j), prec.append(p), rec.append(r)
        acc.append((updated == 0).sum() / len(gt) * 100)
    J, P, R = (np.minimum(np.array(m).T, 100) for m in (jac, prec, rec))  # phases x videos
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # nanmean of all NaN: Matlab is quiet
        jp, pp, rp = (np.nanmean(m, axis=1) for m in (J, P, R))
    return {
        "jaccard": float(np.mean(jp)),
        "precision": float(np.nanmean(pp)) if not np.isnan(pp).all() else math.nan,
        "precision_std": matlab_std([x for x in pp if not math.isnan(x)]),
        "recall": float(np.mean(rp)),
        "accuracy": float(np.mean(acc)),
        "accuracy_std": matlab_std(acc),
    }


def matlab_std(values: list[float]) -> float:
    """Matlab's std (N - 1), which is 0 for one value and NaN for none."""
    if not values:
        return math.nan
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def random_video(rng: random.Random) -> tuple[list[int], list[int]]:
    """Cholec80-like: phases in order with some skipped and returned to, predictions noisy
    near the boundaries and sometimes far off."""
    truth: list[int] = []
    for phase in range(7):
        if rng.random() < 0.85:
            truth += [phase] * rng.randint(1, 12)
        if phase in (3, 4, 5) and rng.random() < 0.3:
            truth += [rng.choice([3, 4, 5])] * rng.randint(1, 5)
    if not truth:
        truth = [0]
    pred = [min(6, max(0, y + rng.choice([0, 0, 0, 0, 1, -1, 2, -2]))) for y in truth]
    return pred, truth


def test_the_report_equals_the_matlab_script_on_random_videos() -> None:
    rng = random.Random(0)
    classes = [f"p{i}" for i in range(7)]
    checked = 0
    for _ in range(200):
        videos = [random_video(rng) for _ in range(rng.randint(1, 6))]
        fps = rng.choice([0, 1])  # window 0 or 10 frames
        scoring = Scoring(10 * fps, protocol=SCRIPT)
        counts = [count_video(str(i), p, y, 7, scoring) for i, (p, y) in enumerate(videos)]
        report = summarize(counts, classes, SCRIPT)
        want = matlab_reference(videos, fps)
        got = {
            "jaccard": report["jaccard"]["mean"],  # type: ignore[index]
            "precision": report["precision"]["mean"],  # type: ignore[index]
            "precision_std": report["precision"]["std"],  # type: ignore[index]
            "recall": report["recall"]["mean"],  # type: ignore[index]
            "accuracy": report["accuracy"]["mean"],  # type: ignore[index]
            "accuracy_std": report["accuracy"]["std"],  # type: ignore[index]
        }
        for key, value in want.items():
            if math.isnan(value):
                assert math.isnan(got[key]), key
            else:
                assert 100 * got[key] == pytest.approx(value, abs=1e-9), key
                checked += 1
    assert checked > 600  # most cases have finite numbers to compare
