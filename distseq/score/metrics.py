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

The script protocol (``Scoring.protocol == "script"``, ``distseq eval --protocol script``)
reproduces the Cholec80 MATLAB evaluation (``Evaluate.m`` and ``Main.m``) as published numbers
use it, slips included, for the 7 Cholec80 phases in their order:

- its end-of-segment window is tested on a true segment's last w frames but applied to its first
  w: frame k < w of the segment counts as right where frame ``len - w + k`` was predicted one
  phase early;
- its extra allowances for phases 4 to 7 (ids 3 to 6 here): phases 4 and 5 may also be
  predicted two phases early, phases 6 and 7 two phases early or late;
- a phase present but never predicted has precision TP / 0: left out if TP = 0, else infinite and
  clipped to 100 %;
- across phases, the mean (and std) of Jaccard and recall is Matlab's ``mean``, so NaN when one
  phase occurs in no video, and of precision ``nanmean``; it computes no F1 (NaN here).

Segment metrics, as action segmentation reports them (``segments.py``, strict): the edit score's
mean over videos, and F1@10, @25 and @50 from counts summed over videos; in [0, 1] here, as
every other number of the report (the table prints percent).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distseq.score.segments import OVERLAPS, edit_score, f1, segment_counts

METRICS = ("accuracy", "precision", "recall", "jaccard", "f1")
PROTOCOLS = ("distseq", "script")  # this module's docstring: distseq's, and the MATLAB script's
SCRIPT_PHASES = 7  # the script knows Cholec80's phases only
# Action segmentation's (segments.py): the edit score's mean and std over videos, and F1 at each
# IoU of OVERLAPS from TP, FP and FN summed over videos.
SEGMENT_METRICS = ("edit", *(f"f1@{round(100 * k)}" for k in OVERLAPS))


@dataclass(frozen=True)
class Scoring:
    """How frames are judged (module docstring)."""

    window: int = 0  # the relaxed boundary, in frames; 0: strict
    background: frozenset[int] = frozenset()  # class ids that make no segment (segments.py)
    protocol: str = "distseq"  # one of PROTOCOLS


STRICT = Scoring()


def _relaxed(pred: np.ndarray, gt: np.ndarray, scoring: Scoring) -> np.ndarray:
    """Frames whose prediction counts as right under ``scoring`` (module docstring)."""
    correct = pred == gt
    if scoring.window <= 0:
        return correct
    script = scoring.protocol == "script"
    diff = pred - gt
    edges = np.flatnonzero(np.diff(gt)) + 1
    for start, end in zip(np.r_[0, edges], np.r_[edges, len(gt)], strict=True):
        phase, t = int(gt[start]), min(scoring.window, end - start)
        late, early = [-1], [1]
        if script and phase in (3, 4):
            early = [1, 2]
        elif script and phase in (5, 6):
            late, early = [-1, -2], [1, 2]
        # Seen late: the first t frames predicted as the phase before (or two before).
        correct[start : start + t] |= np.isin(diff[start : start + t], late)
        # Seen early: tested on the last t frames; the script marks the first t instead.
        at = start if script else end - t
        correct[at : at + t] |= np.isin(diff[end - t : end], early)
    return correct


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
    # Over the frames, -log of the probability given to the truth: the cross-entropy that the
    # loss takes (unweighted, unsmoothed). 0 where no probabilities were given (prediction files).
    nll: float = 0.0


def count_video(
    key: str,
    predicted: Sequence[int],
    truth: Sequence[int],
    num_classes: int,
    scoring: Scoring = STRICT,
) -> VideoCounts:
    """The counts of one video's per-frame predictions against its truth, judged by
    ``scoring``."""
    pred, gt = np.asarray(predicted, dtype=np.int64), np.asarray(truth, dtype=np.int64)
    if pred.shape != gt.shape or pred.ndim != 1:
        raise ValueError(f"video {key}: {pred.shape} predictions for {gt.shape} labels")
    correct = _relaxed(pred, gt, scoring)
    tp, npred, ntruth, union, strict = [], [], [], [], []
    for p in range(num_classes):
        is_pred, is_true = pred == p, gt == p
        either = is_pred | is_true
        tp.append(int((correct & either).sum()))
        npred.append(int(is_pred.sum()))
        ntruth.append(int(is_true.sum()))
        union.append(int(either.sum()))
        strict.append(int((is_pred & is_true).sum()))
    p, y = pred.tolist(), gt.tolist()
    found = tuple(segment_counts(p, y, k, scoring.background) for k in OVERLAPS)
    edit = edit_score(p, y, scoring.background) / 100
    return VideoCounts(
        key, len(gt), int(correct.sum()), tp, npred, ntruth, union, strict, edit, found
    )


def _ratio(num: int, den: int) -> float:
    return min(1.0, num / den) if den else math.nan


def _f1(precision: float, recall: float) -> float:
    if math.isnan(precision) or math.isnan(recall):
        return math.nan
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def _script_precision(tp: int, predicted: int) -> float:
    # Matlab: TP / 0 is NaN for TP = 0 (left out) and Inf otherwise, which the script clips.
    return _ratio(tp, predicted) if predicted else (1.0 if tp else math.nan)


def video_metrics(v: VideoCounts, protocol: str = "distseq") -> dict[str, list[float] | float]:
    """One video's accuracy and per-phase precision, recall, Jaccard and F1 (NaN: left out)."""
    out: dict[str, list[float] | float] = {"accuracy": v.correct / v.frames if v.frames else 0.0}
    phases = range(len(v.truth))
    present = [v.truth[p] > 0 for p in phases]
    precision = _script_precision if protocol == "script" else _ratio
    prec = [precision(v.tp[p], v.predicted[p]) if present[p] else math.nan for p in phases]
    rec = [_ratio(v.tp[p], v.truth[p]) if present[p] else math.nan for p in phases]
    out["precision"], out["recall"] = prec, rec
    out["jaccard"] = [_ratio(v.tp[p], v.union[p]) if present[p] else math.nan for p in phases]
    # A present phase never found (recall 0) has F1 0 even where its precision is left out.
    out["f1"] = [0.0 if rec[p] == 0 else _f1(prec[p], rec[p]) for p in phases]
    if protocol == "script":
        out["f1"] = [math.nan for _ in phases]
    return out


def _mean_std(values: Sequence[float], skip_nan: bool = True) -> dict[str, float]:
    if not skip_nan and any(math.isnan(x) for x in values):
        return {"mean": math.nan, "std": math.nan}  # Matlab's mean and std of a NaN
    kept = [x for x in values if not math.isnan(x)]
    if not kept:
        return {"mean": math.nan, "std": math.nan}
    std = float(np.std(kept, ddof=1)) if len(kept) > 1 else 0.0
    return {"mean": float(np.mean(kept)), "std": std}


def summarize(
    videos: Sequence[VideoCounts], classes: Sequence[str], protocol: str = "distseq"
) -> dict[str, object]:
    """The report of ``videos``: the field's table, per phase, and frame level (module doc)."""
    per_video = [video_metrics(v, protocol) for v in videos]
    # The script's mix: mean over phases for Jaccard and recall, nanmean for precision.
    skip_nan = {m: protocol != "script" or m == "precision" for m in METRICS}
    report: dict[str, object] = {"videos": len(videos)}
    report["accuracy"] = _mean_std([m["accuracy"] for m in per_video])  # type: ignore[misc]
    per_phase: dict[str, dict[str, float]] = {name: {} for name in classes}
    for metric in METRICS[1:]:
        means = []
        for p, name in enumerate(classes):
            over_videos = _mean_std([m[metric][p] for m in per_video])  # type: ignore[index]
            per_phase[name][metric] = over_videos["mean"]
            means.append(over_videos["mean"])
        report[metric] = _mean_std(means, skip_nan[metric])
    report["per_phase"] = per_phase
    report["frame_level"] = frame_level(videos, len(classes))
    report["edit"] = _mean_std([v.edit for v in videos])
    for i, name in enumerate(SEGMENT_METRICS[1:]):
        tp, fp, fn = (sum(v.segments[i][j] for v in videos) for j in range(3))
        report[name] = f1(tp, fp, fn)
    return report


def frame_level(videos: Sequence[VideoCounts], num_classes: int) -> dict[str, float]:
    """Strict scores over all frames concatenated; macro over the phases seen at all."""
    frames = sum(v.frames for v in videos)
    strict = [sum(v.strict_tp[p] for v in videos) for p in range(num_classes)]
    pred = [sum(v.predicted[p] for v in videos) for p in range(num_classes)]
    true = [sum(v.truth[p] for v in videos) for p in range(num_classes)]
    seen = [p for p in range(num_classes) if pred[p] or true[p]]

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
