"""Segment metrics of temporal action segmentation, with the conventions of the MS-TCN
evaluation (``eval.py``, Farha and Gall, CVPR 2019), which Breakfast, 50Salads and GTEA results
are reported with.

- A segment is a maximal run of frames of one label; runs of a background class (``background``,
  by class id) are no segments, and split nothing: the segments on either side stay two.
- Edit score: 100 x (1 - the Levenshtein distance between the predicted and the true sequence of
  segment labels / the longer of the two counts), per video; reported as the mean over videos.
- F1@k: each predicted segment, in order, is matched to the true segment of its label with the
  highest IoU; it is a true positive if that IoU is at least k and that true segment has no
  match yet, else a false positive; true segments left without a match are false negatives.
  TP, FP and FN are summed over all videos before precision, recall and F1.

Two cases the script leaves undefined get a value here: a video with no segment on either side
scores edit 100 (nothing to edit), and a predicted segment where the truth has none is a false
positive.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

OVERLAPS = (0.10, 0.25, 0.50)  # F1@10, F1@25, F1@50


def segments(
    labels: Sequence[int], background: frozenset[int] = frozenset()
) -> tuple[list[int], list[int], list[int]]:
    """(label, start, end) of each segment, end exclusive; background runs left out."""
    names: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    for i, label in enumerate(labels):
        if i > 0 and label == labels[i - 1]:
            continue
        if i > 0 and labels[i - 1] not in background:
            ends.append(i)
        if label not in background:
            names.append(label)
            starts.append(i)
    if labels and labels[-1] not in background:
        ends.append(len(labels))
    return names, starts, ends


def levenshtein(a: Sequence[int], b: Sequence[int]) -> int:
    """The fewest insertions, deletions and substitutions that make ``a`` into ``b``."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, start=1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def edit_score(
    predicted: Sequence[int], truth: Sequence[int], background: frozenset[int] = frozenset()
) -> float:
    """100 x (1 - Levenshtein distance of the segment labels / the longer count)."""
    p, y = segments(predicted, background)[0], segments(truth, background)[0]
    longer = max(len(p), len(y))
    return 100.0 if longer == 0 else 100.0 * (1 - levenshtein(p, y) / longer)


def segment_counts(
    predicted: Sequence[int],
    truth: Sequence[int],
    overlap: float,
    background: frozenset[int] = frozenset(),
) -> tuple[int, int, int]:
    """(TP, FP, FN) of the predicted segments against the true ones at IoU >= ``overlap``."""
    p_label, p_start, p_end = segments(predicted, background)
    y_label, y_start, y_end = (np.asarray(x) for x in segments(truth, background))
    hits = np.zeros(len(y_label), dtype=bool)
    tp = fp = 0
    for label, start, end in zip(p_label, p_start, p_end, strict=True):
        if len(y_label) == 0:
            fp += 1
            continue
        intersection = np.minimum(end, y_end) - np.maximum(start, y_start)
        union = np.maximum(end, y_end) - np.minimum(start, y_start)
        iou = intersection / union * (y_label == label)
        best = int(iou.argmax())
        if iou[best] >= overlap and not hits[best]:
            tp += 1
            hits[best] = True
        else:
            fp += 1
    return tp, fp, int(len(y_label) - hits.sum())


def f1(tp: int, fp: int, fn: int) -> float:
    """F1 of summed counts, in [0, 1]; 0 where there is no true positive."""
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0
