"""A phase ribbon: the phases along a video, one colour-blind-safe colour per phase, as bands
(truth, prediction, errors). ``predict --ribbon`` draws one per video, ``report`` one for each
of the worst validation videos."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed, or wanted, on a cluster node

import matplotlib.pyplot as plt
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

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
