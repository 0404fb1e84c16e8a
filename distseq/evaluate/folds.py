"""Several reports as one k-fold result (``distseq eval`` given several models or prediction
folders, one per split): each split's headline numbers, and their mean and std over the splits,
as action-segmentation papers report Breakfast's 4 splits or 50Salads' 5."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from distseq.score.metrics import METRICS, SEGMENT_METRICS

# Action segmentation's columns first (F1@k, edit, frame accuracy), then the phase metrics' means.
COLUMNS = (*SEGMENT_METRICS[1:], "edit", "frame_accuracy", *METRICS)


def headline(report: dict[str, Any]) -> dict[str, float]:
    """One report's numbers of COLUMNS."""
    out = {name: report[name] for name in SEGMENT_METRICS[1:]}
    out["edit"] = report["edit"]["mean"]
    out["frame_accuracy"] = report["frame_level"]["accuracy"]
    out |= {metric: report[metric]["mean"] for metric in METRICS}
    return out


def over_folds(reports: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Each fold's headline numbers, and their mean and std (N - 1) over the folds."""
    rows = [headline(r) for r in reports]

    def spread(values: list[float]) -> dict[str, float]:
        std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        return {"mean": float(np.mean(values)), "std": std}

    return {
        "folds": {name: row for name, row in zip(names, rows, strict=True)},
        **{column: spread([row[column] for row in rows]) for column in COLUMNS},
    }


def folds_table(summary: dict[str, Any]) -> str:
    """One row per fold, then mean ± std, in percent."""

    def pct(x: float) -> str:
        return "n/a" if math.isnan(x) else f"{100 * x:.2f}"

    heads = ["F1@10", "F1@25", "F1@50", "Edit", "Acc", "video acc", "prec", "rec", "jacc", "f1"]
    width = max(14, *(len(name) for name in summary["folds"]))
    lines = [f"{'':{width}}" + "".join(f"{h:>14}" for h in heads)]
    for name, row in summary["folds"].items():
        lines.append(f"{name:{width}}" + "".join(f"{pct(row[c]):>14}" for c in COLUMNS))
    means = [f"{pct(summary[c]['mean'])} ± {pct(summary[c]['std'])}" for c in COLUMNS]
    lines.append(f"{'mean ± std':{width}}" + "".join(f"{m:>14}" for m in means))
    return "\n".join(lines)
