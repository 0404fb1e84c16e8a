"""The pictures of a run: phase ribbons (phases along a video, one colour-blind-safe colour per
phase), a confusion matrix, and curves over the steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed, or wanted, on a cluster node

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

# Okabe and Ito's palette, safe for the common colour-vision deficiencies; beyond 8 phases,
# matplotlib's tab20 follows.
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")


def phase_colours(count: int) -> list[str]:
    extra = [matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab20"](range(20))]
    return [*OKABE_ITO, *extra][:count]


ERROR_COLOURS = ListedColormap(["#EEEEEE", "#D55E00"])  # right, wrong


def ribbon(
    path: Path,
    rows: Mapping[str, Sequence[int]],
    classes: Sequence[str],
    fps: float | None,
    errors: Sequence[bool] | None = None,
    title: str = "",
) -> None:
    """One horizontal band per entry of ``rows`` (e.g. truth, prediction), coloured by phase
    (white where a row has no phase: an unlabelled frame); with ``errors``, a last band that
    marks the wrong frames."""
    colours = ListedColormap(phase_colours(len(classes))).with_extremes(under="white")
    length = max(len(r) for r in rows.values())
    bands = len(rows) + (errors is not None)
    top = 0.35 + 0.25 * bool(title)  # inches for the legend and the title
    height = 0.55 * bands + 0.6 + top
    fig, axes = plt.subplots(bands, 1, figsize=(10, height), squeeze=False, sharex=True)
    extent = (0, length / fps if fps else length, 0, 1)
    for ax, (name, phases) in zip(axes[: len(rows), 0], rows.items(), strict=True):
        ax.imshow(
            [list(phases)],
            aspect="auto",
            cmap=colours,
            vmin=-0.5,
            vmax=len(classes) - 0.5,
            interpolation="nearest",
            extent=extent,
        )
        ax.set_yticks([])
        ax.set_ylabel(name, rotation=0, ha="right", va="center")
    if errors is not None:
        ax = axes[-1, 0]
        wrong = [[float(e) for e in errors]]
        ax.imshow(wrong, aspect="auto", cmap=ERROR_COLOURS, vmin=0, vmax=1, extent=extent)
        ax.set_yticks([])
        ax.set_ylabel("errors", rotation=0, ha="right", va="center")
    axes[-1, 0].set_xlabel("time (s)" if fps else "frame")
    handles = [Patch(color=colours(i), label=c) for i, c in enumerate(classes)]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(classes), 7), frameon=False)
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - top / height))
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
