"""Phase metrics against values worked out by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest

from distseq.score.metrics import Scoring, count_video, summarize, video_metrics

NAN = math.nan


def metrics(pred: list[int], truth: list[int], window: int = 0) -> dict:
    return video_metrics(count_video("v", pred, truth, num_classes=3, scoring=Scoring(window)))


def same(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(
        (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w)
        for g, w in zip(got, want, strict=True)
    )


def test_one_video_strict() -> None:
    # truth 0 0 0 1 1 1, prediction 0 0 1 1 1 2: frames 2 and 5 wrong, accuracy 4/6.
    # phase 0: predicted {0,1}, true {0,1,2}: TP 2, P 2/2, R 2/3, J 2/3, F1 0.8.
    # phase 1: predicted {2,3,4}, true {3,4,5}, union {2..5}: TP 2, P 2/3, R 2/3, J 2/4.
    # phase 2: never true, so left out; its one prediction is what costs phase 1 recall.
    m = metrics([0, 0, 1, 1, 1, 2], [0, 0, 0, 1, 1, 1])
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert same(m["precision"], [1, 2 / 3, NAN])
    assert same(m["recall"], [2 / 3, 2 / 3, NAN])
    assert same(m["jaccard"], [2 / 3, 1 / 2, NAN])
    assert same(m["f1"], [0.8, 2 / 3, NAN])


def test_a_phase_present_but_never_predicted_has_no_precision() -> None:
    m = metrics([0, 0], [0, 1])
    assert same(m["precision"], [1 / 2, NAN, NAN])  # phase 0: TP 1 of 2 predicted
    assert same(m["recall"], [1, 0, NAN]) and same(m["jaccard"], [1 / 2, 0, NAN])
    # Phase 1 was never found: no true positive, so F1 0 (not left out with its precision).
    assert same(m["f1"], [2 / 3, 0, NAN])


def test_a_constant_predictor_on_two_phases_gets_half_the_f1() -> None:
    # As in the demo: each video is all one phase, and the model answers phase 0 everywhere.
    # Video "red" (truth 0 0 0): phase 0 P 1, R 1, F1 1; phase 1 absent, left out.
    # Video "blue" (truth 1 1): phase 1 never predicted: precision left out, recall 0, F1 0;
    # phase 0 absent (only false positives), left out.
    # Per phase over videos: F1 1 for phase 0, 0 for phase 1; mean 0.5. Leaving phase 1's F1
    # out with its precision made it 1.0, for a model that cannot tell the phases apart.
    videos = [count_video("red", [0, 0, 0], [0, 0, 0], 2), count_video("blue", [0, 0], [1, 1], 2)]
    report = summarize(videos, ["red", "blue"])
    assert report["f1"]["mean"] == 0.5  # type: ignore[index]
    assert report["per_phase"]["blue"]["f1"] == 0.0  # type: ignore[index]
    assert report["precision"]["mean"] == 1.0  # type: ignore[index]  # phase 1's is left out
    assert report["recall"]["mean"] == 0.5  # type: ignore[index]


def test_relaxed_window_at_both_ends_of_a_phase() -> None:
    # truth 0 0 0 1 1 1 1 2 2, prediction 0 0 0 0 1 1 2 2 2, window 1 frame: frame 3 starts
    # phase 1 still showing phase 0 (late), frame 6 ends it showing phase 2 (early): both count.
    m = metrics([0, 0, 0, 0, 1, 1, 2, 2, 2], [0, 0, 0, 1, 1, 1, 1, 2, 2], window=1)
    assert m["accuracy"] == 1.0
    # phase 0: TP 4 over 4 predicted and 3 true: P 1, R 4/3 capped to 1.
    assert same(m["precision"], [1, 1, 1]) and same(m["recall"], [1, 1, 1])
    assert same(
        metrics([0, 0, 0, 0, 1, 1, 2, 2, 2], [0, 0, 0, 1, 1, 1, 1, 2, 2])["recall"], [1, 2 / 4, 1]
    )


@pytest.mark.parametrize(
    ("pred", "window", "accuracy"),
    [
        ([1, 1, 2, 2, 2, 2], 1, 1.0),  # phase 1's last frame shows phase 2: forgiven
        ([1, 2, 2, 2, 2, 2], 1, 5 / 6),  # 2 frames early, window 1: frame 1 is not forgiven
        ([1, 2, 2, 2, 2, 2], 2, 1.0),
        ([2, 1, 1, 2, 2, 2], 1, 5 / 6),  # phase 2 at the START of phase 1: not forgiven
        ([1, 1, 1, 1, 2, 2], 1, 1.0),  # phase 2 begins a frame late: forgiven
        ([1, 1, 1, 1, 1, 2], 1, 5 / 6),  # two frames late, window 1: the second is not
    ],
)
def test_each_window_applies_where_it_is_tested(
    pred: list[int], window: int, accuracy: float
) -> None:
    # truth 1 1 1 2 2 2. The widely copied script applies the end-of-phase test to the first
    # frames: it would score the first case 5/6 (frame 2 still wrong) and forgive frame 0 instead.
    assert metrics(pred, [1, 1, 1, 2, 2, 2], window)["accuracy"] == pytest.approx(accuracy)


def test_aggregation_over_videos_then_phases() -> None:
    a = count_video("a", [0, 0, 1, 1, 1, 2], [0, 0, 0, 1, 1, 1], num_classes=3)  # as above
    # b: truth 2 2, prediction 2 0: accuracy 1/2; phase 2: TP 1, P 1/1, R 1/2, J 1/2, F1 2/3.
    b = count_video("b", [2, 0], [2, 2], num_classes=3)
    report = summarize([a, b], ["p0", "p1", "p2"])
    assert report["videos"] == 2
    # accuracy over videos: (4/6 + 1/2) / 2; std with N - 1: |4/6 - 1/2| / sqrt(2)
    assert report["accuracy"] == pytest.approx({"mean": 7 / 12, "std": (1 / 6) / math.sqrt(2)})
    # per phase, over the videos that have it: precision 1 (a), 2/3 (a), 1 (b); their mean and
    # std over phases: 8/9, sqrt(((1/9)^2 + (2/9)^2 + (1/9)^2) / 2)
    assert report["precision"] == pytest.approx({"mean": 8 / 9, "std": math.sqrt(6 / 81 / 2)})
    assert report["per_phase"]["p2"] == pytest.approx(
        {"precision": 1, "recall": 1 / 2, "jaccard": 1 / 2, "f1": 2 / 3}
    )
    assert report["recall"]["mean"] == pytest.approx((2 / 3 + 2 / 3 + 1 / 2) / 3)
    assert report["jaccard"]["mean"] == pytest.approx((2 / 3 + 1 / 2 + 1 / 2) / 3)
    assert report["f1"]["mean"] == pytest.approx((0.8 + 2 / 3 + 2 / 3) / 3)
    # Frame level, strict, 8 frames: TP 2, 2, 1 of predicted 3, 3, 2 and true 3, 3, 2.
    fl = report["frame_level"]
    assert fl["accuracy"] == pytest.approx(5 / 8)
    assert fl["precision"] == pytest.approx((2 / 3 + 2 / 3 + 1 / 2) / 3)
    assert fl["f1"] == pytest.approx((4 / 6 + 4 / 6 + 2 / 4) / 3)
    assert fl["jaccard"] == pytest.approx((2 / 4 + 2 / 4 + 1 / 3) / 3)


def test_lengths_must_match() -> None:
    with pytest.raises(ValueError, match="video v: \\(2,\\) predictions for \\(3,\\) labels"):
        count_video("v", [0, 1], [0, 1, 1], num_classes=2)
