"""A model over a split's whole videos: per-frame probabilities, then the phase metrics.

Each rank runs its share of the videos (``data.val_stream``); the counts of every video are
gathered on every rank, each video once, so the report is that of the whole split whatever the
number of ranks and the padding.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from distseq.data.batch import Batch
from distseq.model.head import last_stage
from distseq.parallel import all_gather_objects
from distseq.score.metrics import (
    METRICS,
    SEGMENT_METRICS,
    STRICT,
    Scoring,
    VideoCounts,
    count_video,
    summarize,
)


@torch.no_grad()
def probabilities_by_video(
    model: nn.Module, batches: Iterable[Batch], device: torch.device
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(key, probabilities [T, K] on the CPU, labels [T]) for each real video in ``batches``."""
    was_training = model.training
    model.eval()
    try:
        for batch in batches:
            batch = batch.to(device)
            probs = last_stage(model(batch.frames, batch.mask)).float().softmax(-1).cpu()
            for row, key in enumerate(batch.keys):
                if key:  # "" is a padding row
                    n = int(batch.mask[row].sum())
                    yield key, probs[row, :n], batch.labels[row, :n].cpu()
    finally:
        model.train(was_training)


# What a training run logs of each validation, as ``val_<name>``: per-frame accuracy over all
# labelled frames (as the loss counts them), then the phase metrics' means over the videos, and
# the cross-entropy over all labelled frames (unweighted).
VALIDATION = ("accuracy", "video_accuracy", *METRICS[1:], *SEGMENT_METRICS, "loss")


def validation_scores(report: dict[str, Any]) -> dict[str, float]:
    """``val_<name>`` for each name of VALIDATION, from a report of :func:`validate` (strict:
    no relaxed window)."""
    scores = {"val_accuracy": report["frame_level"]["accuracy"]}
    scores["val_video_accuracy"] = report["accuracy"]["mean"]
    for metric in METRICS[1:]:
        scores[f"val_{metric}"] = report[metric]["mean"]
    scores["val_edit"] = report["edit"]["mean"]
    for metric in SEGMENT_METRICS[1:]:
        scores[f"val_{metric}"] = report[metric]
    scores["val_loss"] = report["loss"]
    return scores


def gather(counts: list[VideoCounts]) -> list[VideoCounts]:
    """Every rank's videos on every rank, in key order."""
    counts = all_gather_objects(counts)
    keys = [c.key for c in counts]
    if len(set(keys)) != len(keys):
        raise ValueError(
            f"a video was counted twice: {sorted(k for k in keys if keys.count(k) > 1)[:3]}"
        )
    return sorted(counts, key=lambda c: c.key)


def validate(
    model: nn.Module,
    batches: Iterable[Batch],
    device: torch.device,
    classes: list[str],
    scoring: Scoring = STRICT,
    on_video: Callable[[str, torch.Tensor], None] | None = None,
    *,
    counted: bool = True,
) -> dict[str, object]:
    """The metrics report (``metrics.summarize``) of ``model`` on the videos of ``batches``,
    judged by ``scoring``; ``on_video(key, probabilities [T, K])`` sees each of this rank's
    videos on the way. ``counted``: False where another rank counts the same videos (a
    sequence group's)."""
    counts = []
    for key, probs, labels in probabilities_by_video(model, batches, device):
        if on_video is not None:
            on_video(key, probs)
        # Unlabelled frames (and padding) are left out; the model still saw them.
        labelled = labels >= 0
        if not labelled.any():
            continue
        pred = probs.argmax(-1)[labelled].tolist()
        truth = labels[labelled]
        given = probs[labelled].gather(1, truth[:, None])
        nll = float(-given.clamp_min(torch.finfo(torch.float32).tiny).log().sum())
        count = count_video(key, pred, truth.tolist(), len(classes), scoring)
        counts.append(replace(count, nll=nll))
    videos = gather(counts if counted else [])
    report = summarize(videos, classes, scoring.protocol)
    frames = sum(v.frames for v in videos)
    report["loss"] = sum(v.nll for v in videos) / frames if frames else math.nan
    return report
