"""Phase-recognition metrics as the field reports them: per video, then aggregated the Cholec80 way.

Per video and phase p, with ``correct`` the frames whose prediction counts as right:

- ``correct``: prediction equals truth; with a relaxed window of w frames (``relaxed_seconds``
  x fps), also a prediction of phase p - 1 within the first w frames of a true segment of p (a
  transition seen late) and of p + 1 within its last w frames (seen early). Phases are the class
  ids, which Cholec80 numbers in procedure order, as its evaluation script does. That script's
  extra allowances for its phases 4 to 7 are dataset-specific and not applied. It also has an
  indexing slip: the end-of-segment test is computed over the last w frames but applied to the
  first w; here each window is applied where it is tested.
- TP(p): the correct frames among those predicted p or true p (the script's union rule, so a
  relaxed frame counts for the phase predicted and for the true one). Precision = TP / frames
  predicted p, recall = TP / frames true p, Jaccard = TP / |predicted p or true p|, each at most
  1 (relaxation can push them over; the script caps them too), F1 = 2PR / (P + R).
- Left out (NaN, not 0): every metric of a phase absent from the video's truth, and precision of
  a phase present but never predicted (as the script leaves it out). That phase's F1 is 0, not
  left out: it has no true positive, whatever precision's convention, and leaving it out would
  let a model that always answers one phase score F1 = 1 (a constant predictor on two phases
  scores 0.5). A phase predicted but absent from the truth is no entry of its own, yet its
  frames are wrong predictions: false positives that lower the recall of the true phases there.

Aggregation: each metric per phase per video; its mean over the videos where it is defined, per
phase; then the mean over phases. The spread, as papers report it, is the standard deviation
(N - 1 in the denominator, as Matlab's) over videos for accuracy and over phases for the rest.

Frame-level scores, which other papers report: accuracy and macro precision, recall, F1 and
Jaccard over all frames of all videos concatenated, strict (no relaxation), macro over the
phases that occur in the truth or the predictions, a 0/0 counting as 0 (sklearn's convention).
The frame-level accuracy is action segmentation's "Acc" too.

Segment metrics, as action segmentation reports them (``segments.py``, strict): the edit score's
mean over videos, and F1@10, @25 and @50 from counts summed over videos; in [0, 1] here, as
every other number of the report (the table prints percent).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distseq.evaluate.segments import OVERLAPS, edit_score, f1, segment_counts

METRICS = ("accuracy", "precision", "recall", "jaccard", "f1")
# Action segmentation's (segments.py): the edit score's mean and std over videos, and F1 at each
# IoU of OVERLAPS from TP, FP and FN summed over videos.
SEGMENT_METRICS = ("edit", *(f"f1@{round(100 * k)}" for k in OVERLAPS))


@dataclass(frozen=True)
class VideoCounts:
    """What one video contributes; sums and ratios of these make every reported number."""

    key: str
    frames: int
    correct: int  # relaxed
    tp: list[int]  # per phase, relaxed, by the union rule
    predicted: list[int]  # per phase
    truth: list[int]  # per phase
    union: list[int]  # per phase: frames predicted p or true p
    strict_tp: list[int]  # per phase: predicted p and true p
    edit: float = 0.0  # the segments' edit score (segments.py), in [0, 1]
    segments: tuple[tuple[int, int, int], ...] = ()  # (TP, FP, FN) at each of OVERLAPS


def count_video(
    key: str,
    predicted: Sequence[int],
    truth: Sequence[int],
    classes: int,
    window: int = 0,
    background: frozenset[int] = frozenset(),
) -> VideoCounts:
    """The counts of one video's per-frame predictions against its truth; ``background``: the
    class ids that make no segment of their own (segments.py)."""
    pred, gt = np.asarray(predicted, dtype=np.int64), np.asarray(truth, dtype=np.int64)
    if pred.shape != gt.shape or pred.ndim != 1:
        raise ValueError(f"video {key}: {pred.shape} predictions for {gt.shape} labels")
    correct = pred == gt
    if window > 0:
        # Each true segment [start, end]: its first and last min(window, length) frames.
        edges = np.flatnonzero(np.diff(gt)) + 1
        for start, end in zip(np.r_[0, edges], np.r_[edges, len(gt)], strict=True):
            phase, t = gt[start], min(window, end - start)
            correct[start : start + t] |= pred[start : start + t] == phase - 1
            correct[end - t : end] |= pred[end - t : end] == phase + 1
    tp, npred, ntruth, union, strict = [], [], [], [], []
    for p in range(classes):
        is_pred, is_true = pred == p, gt == p
        either = is_pred | is_true
        tp.append(int((correct & either).sum()))
        npred.append(int(is_pred.sum()))
        ntruth.append(int(is_true.sum()))
        union.append(int(either.sum()))
        strict.append(int((is_pred & is_true).sum()))
    p, y = pred.tolist(), gt.tolist()
    found = tuple(segment_counts(p, y, k, background) for k in OVERLAPS)
    edit = edit_score(p, y, background) / 100
    return VideoCounts(
        key, len(gt), int(correct.sum()), tp, npred, ntruth, union, strict, edit, found
    )


def _ratio(num: int, den: int) -> float:
    return min(1.0, num / den) if den else math.nan


def _f1(precision: float, recall: float) -> float:
    if math.isnan(precision) or math.isnan(recall):
        return math.nan
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def video_metrics(v: VideoCounts) -> dict[str, list[float] | float]:
    """One video's accuracy and per-phase precision, recall, Jaccard and F1 (NaN: left out)."""
    out: dict[str, list[float] | float] = {"accuracy": v.correct / v.frames if v.frames else 0.0}
    phases = range(len(v.truth))
    present = [v.truth[p] > 0 for p in phases]
    prec = [_ratio(v.tp[p], v.predicted[p]) if present[p] else math.nan for p in phases]
    rec = [_ratio(v.tp[p], v.truth[p]) if present[p] else math.nan for p in phases]
    out["precision"], out["recall"] = prec, rec
    out["jaccard"] = [_ratio(v.tp[p], v.union[p]) if present[p] else math.nan for p in phases]
    # A present phase never found (recall 0) has F1 0 even where its precision is left out.
    out["f1"] = [0.0 if rec[p] == 0 else _f1(prec[p], rec[p]) for p in phases]
    return out


def _mean_std(values: Sequence[float]) -> dict[str, float]:
    kept = [x for x in values if not math.isnan(x)]
    if not kept:
        return {"mean": math.nan, "std": math.nan}
    std = float(np.std(kept, ddof=1)) if len(kept) > 1 else 0.0
    return {"mean": float(np.mean(kept)), "std": std}


def summarize(videos: Sequence[VideoCounts], classes: Sequence[str]) -> dict[str, object]:
    """The report of ``videos``: the field's table, per phase, and frame level (module doc)."""
    per_video = [video_metrics(v) for v in videos]
    report: dict[str, object] = {"videos": len(videos)}
    report["accuracy"] = _mean_std([m["accuracy"] for m in per_video])  # type: ignore[misc]
    per_phase: dict[str, dict[str, float]] = {name: {} for name in classes}
    for metric in METRICS[1:]:
        means = []
        for p, name in enumerate(classes):
            over_videos = _mean_std([m[metric][p] for m in per_video])  # type: ignore[index]
            per_phase[name][metric] = over_videos["mean"]
            means.append(over_videos["mean"])
        report[metric] = _mean_std(means)
    report["per_phase"] = per_phase
    report["frame_level"] = frame_level(videos, len(classes))
    report["edit"] = _mean_std([v.edit for v in videos])
    for i, name in enumerate(SEGMENT_METRICS[1:]):
        tp, fp, fn = (sum(v.segments[i][j] for v in videos) for j in range(3))
        report[name] = f1(tp, fp, fn)
    return report


def frame_level(videos: Sequence[VideoCounts], classes: int) -> dict[str, float]:
    """Strict scores over all frames concatenated; macro over the phases seen at all."""
    frames = sum(v.frames for v in videos)
    strict = [sum(v.strict_tp[p] for v in videos) for p in range(classes)]
    pred = [sum(v.predicted[p] for v in videos) for p in range(classes)]
    true = [sum(v.truth[p] for v in videos) for p in range(classes)]
    seen = [p for p in range(classes) if pred[p] or true[p]]

    def div(a: int, b: int) -> float:
        return a / b if b else 0.0

    prec = [div(strict[p], pred[p]) for p in seen]
    rec = [div(strict[p], true[p]) for p in seen]
    f1 = [div(2 * strict[p], pred[p] + true[p]) for p in seen]
    jac = [div(strict[p], pred[p] + true[p] - strict[p]) for p in seen]
    macro = {
        k: float(np.mean(v)) if v else math.nan
        for k, v in zip(METRICS[1:], (prec, rec, jac, f1), strict=True)
    }
    return {"accuracy": div(sum(strict), frames), **macro}
