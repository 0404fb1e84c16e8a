"""Pictures of phases: ribbons (phases along a video) with one colour-blind-safe colour each."""

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


def ribbon(
    path: Path, rows: Mapping[str, Sequence[int]], classes: Sequence[str], fps: float | None
) -> None:
    """One horizontal band per entry of ``rows`` (e.g. truth, prediction), coloured by phase."""
    colours = ListedColormap(phase_colours(len(classes)))
    length = max(len(r) for r in rows.values())
    fig, axes = plt.subplots(
        len(rows), 1, figsize=(10, 0.55 * len(rows) + 0.9), squeeze=False, sharex=True
    )
    extent = (0, length / fps if fps else length, 0, 1)
    for ax, (name, phases) in zip(axes[:, 0], rows.items(), strict=True):
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
    axes[-1, 0].set_xlabel("time (s)" if fps else "frame")
    handles = [Patch(color=colours(i), label=c) for i, c in enumerate(classes)]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(classes), 7), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.82))
    fig.savefig(path, dpi=100)
    plt.close(fig)
