"""Segment metrics (segments.py) against values worked out by hand, as MS-TCN's eval.py
computes them (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest

from distseq.score.metrics import count_video, summarize
from distseq.score.segments import edit_score, levenshtein, segment_counts, segments


def test_segments_are_runs_and_background_splits_nothing() -> None:
    assert segments([2, 2, 0, 0, 1, 2]) == ([2, 0, 1, 2], [0, 2, 4, 5], [2, 4, 5, 6])
    # Class 0 as background: its runs are no segments; the 2s either side of it stay two.
    assert segments([2, 0, 0, 2, 1], frozenset({0})) == ([2, 2, 1], [0, 3, 4], [1, 4, 5])
    assert segments([]) == ([], [], [])


def test_the_edit_score() -> None:
    # truth a a b b c c: segments a b c; prediction a b b b c a: a b c a. One deletion makes
    # the one into the other: 100 x (1 - 1/4) = 75.
    assert levenshtein([0, 1, 2, 0], [0, 1, 2]) == 1 and levenshtein([], [1, 2]) == 2
    assert edit_score([0, 1, 1, 1, 2, 0], [0, 0, 1, 1, 2, 2]) == 75.0
    # Nothing to edit where neither side has a segment (all background).
    assert edit_score([0, 0], [0, 0], frozenset({0})) == 100.0


@pytest.mark.parametrize(
    ("predicted", "overlap", "counts"),
    [
        # truth 0 0 0 0 1 1 1 1: segments 0 [0, 4) and 1 [4, 8).
        # 0 [0, 3): IoU 3/4; 1 [3, 8): IoU 4/5. Both match at every threshold.
        ([0, 0, 0, 1, 1, 1, 1, 1], 0.5, (2, 0, 0)),
        # 0 [0, 1): IoU 1/4, a match at 0.25 (>=) but not at 0.5; 1 [1, 8): IoU 4/7.
        ([0, 1, 1, 1, 1, 1, 1, 1], 0.25, (2, 0, 0)),
        ([0, 1, 1, 1, 1, 1, 1, 1], 0.5, (1, 1, 1)),
    ],
)
def test_f1_counts(predicted: list[int], overlap: float, counts: tuple[int, int, int]) -> None:
    assert segment_counts(predicted, [0, 0, 0, 0, 1, 1, 1, 1], overlap) == counts


def test_a_true_segment_matches_once_and_labels_must_agree() -> None:
    # truth 0 0 0 0 0: one segment. Prediction 0 [0, 2), 1 [2, 3), 0 [3, 5): the first 0 takes
    # the match (IoU 2/5 at 0.1), the 1 has no segment of its label (IoU 0), the second 0 finds
    # it taken: TP 1, FP 2, FN 0. At 0.5 nothing matches: TP 0, FP 3, FN 1.
    assert segment_counts([0, 0, 1, 0, 0], [0] * 5, 0.1) == (1, 2, 0)
    assert segment_counts([0, 0, 1, 0, 0], [0] * 5, 0.5) == (0, 3, 1)
    # A predicted segment where the truth has none (all background) is a false positive.
    assert segment_counts([1, 1], [0, 0], 0.1, frozenset({0})) == (0, 1, 0)


def test_background_runs_are_left_out_of_both() -> None:
    # truth bg bg a a bg b b, prediction bg a a a bg b bg (bg = 0): a [1, 4) against a [2, 4),
    # IoU 2/3; b [5, 6) against b [5, 7), IoU 1/2: both match at 0.5, edit 100.
    truth, predicted = [0, 0, 1, 1, 0, 2, 2], [0, 1, 1, 1, 0, 2, 0]
    assert segment_counts(predicted, truth, 0.5, frozenset({0})) == (2, 0, 0)
    assert edit_score(predicted, truth, frozenset({0})) == 100.0
    # The 0s as segments too: truth 0 1 0 2, prediction 0 1 0 2 0. The first 0 [0, 1) matches
    # 0 [0, 2) at 1/2, the middle 0 [4, 5) its own exactly; the last 0 [6, 7) overlaps no 0.
    assert segment_counts(predicted, truth, 0.5) == (4, 1, 0)


def test_counts_are_summed_over_videos_before_the_f1() -> None:
    # Video A: truth 0 0 0 0 1 1 1 1, prediction 0 1 1 1 1 1 1 1: at 0.5, TP 1 FP 1 FN 1;
    # edit 100. Video B: truth a a b b c c, prediction a b b b c a: at 0.5 the a [0, 1) has IoU
    # 1/2, the b [1, 4) 2/3, the c [4, 5) 1/2 and the last a [5, 6) 0: TP 3, FP 1, FN 0; edit 75.
    # F1@50 from the sums (4, 2, 1): 8 / (8 + 3) = 8/11; the mean of the videos' F1s, 1/2 and
    # 6/7, would be 0.68. Edit: mean (100 + 75) / 2 = 87.5, std 17.68 (N - 1).
    a = count_video("a", [0, 1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1], 3)
    b = count_video("b", [0, 1, 1, 1, 2, 0], [0, 0, 1, 1, 2, 2], 3)
    report = summarize([a, b], ["x", "y", "z"])
    assert report["f1@50"] == pytest.approx(8 / 11)
    assert report["f1@10"] == pytest.approx(2 * 5 / (2 * 5 + 1))  # B's last a still unmatched
    edit = report["edit"]
    assert edit["mean"] == pytest.approx(0.875)  # type: ignore[index]
    assert edit["std"] == pytest.approx(25 / math.sqrt(2) / 100)  # type: ignore[index]
