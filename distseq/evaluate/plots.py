"""The pictures of a run beside its phase ribbons (``infer.ribbon``): a confusion matrix and
curves over the steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed, or wanted, on a cluster node

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator


def confusion(path: Path, counts: Sequence[Sequence[int]], classes: Sequence[str]) -> None:
    """Rows: true phase; columns: predicted; each row's share, with the frame counts written in."""
    k = len(classes)
    shares = [[c / max(1, sum(row)) for c in row] for row in counts]
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * k, 0.8 + 0.8 * k))
    ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    for i in range(k):
        for j in range(k):
            colour = "white" if shares[i][j] > 0.5 else "black"
            ax.text(j, i, str(counts[i][j]), ha="center", va="center", color=colour, fontsize=8)
    ax.set_xticks(range(k), classes, rotation=45, ha="right")
    ax.set_yticks(range(k), classes)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def curves(
    path: Path, series: Mapping[str, tuple[Sequence[int], Sequence[float]]], ylabel: str
) -> None:
    """Lines over the training steps, one per entry of ``series``: (steps, values)."""
    fig, ax = plt.subplots(figsize=(7, 3.2) if len(series) == 1 else (8.6, 3.2))
    for name, (steps, values) in series.items():
        ax.plot(steps, values, marker="o" if len(steps) < 20 else None, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if len(series) > 1:  # beside the plot, where it hides no line
        ax.legend(frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
