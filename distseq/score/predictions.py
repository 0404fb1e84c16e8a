"""What ``eval`` and ``predict`` write per video: one CSV of per-frame predictions."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import torch

from distseq.files import write_atomic


def write_predictions(
    path: Path, probabilities: torch.Tensor, classes: list[str], fps: float | None
) -> None:
    """``frame, time_s, phase, <one probability per class>`` for probabilities [T, K]; time_s
    is empty where the frame rate is unknown."""
    text = io.StringIO()
    out = csv.writer(text, lineterminator="\n")
    out.writerow(["frame", "time_s", "phase", *classes])
    best = probabilities.argmax(-1).tolist()
    for frame, row in enumerate(probabilities.tolist()):
        time = "" if fps is None else f"{frame / fps:.3f}"
        out.writerow([frame, time, classes[best[frame]], *(f"{p:.6f}" for p in row)])
    write_atomic(path, text.getvalue())
