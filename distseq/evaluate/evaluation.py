"""A trained model judged on a split's whole videos, as ``distseq eval`` does: the field's phase
metrics (``metrics.py``) as one table, ``eval.json`` and one predictions CSV per video."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from distseq.checkpoint.export import Loaded
from distseq.data.format import find_manifest
from distseq.data.tar import recorded_shards
from distseq.data.val_stream import val_batches
from distseq.errors import ConfigError
from distseq.evaluate.metrics import METRICS, SEGMENT_METRICS
from distseq.evaluate.outputs import write_predictions
from distseq.evaluate.validate import validate
from distseq.files import write_atomic
from distseq.parallel import DistInfo


def evaluate(
    loaded: Loaded,
    split: str,
    manifest_path: str,
    relaxed_seconds: float,
    fps: float | None,
    out: Path,
    info: DistInfo,
    background: Sequence[str] = (),
) -> dict[str, object]:
    """The report of ``loaded`` on the videos of ``split`` (``val``: the model's own validation
    shards, else a shard pattern), written to ``out``; this rank's share, all ranks' report.
    ``background``: the names of the classes that make no segment (segment metrics)."""
    unknown = sorted(set(background) - set(loaded.classes))
    if unknown:
        raise ConfigError(f"--background {unknown[0]}: not one of the model's {loaded.classes}")
    ignored = frozenset(loaded.classes.index(name) for name in background)
    cfg = loaded.config.data
    urls = recorded_shards(cfg.val, "data.val", "--split") if split == "val" else split
    manifest_path = manifest_path or (cfg.manifest if split == "val" else "")
    manifest = find_manifest(urls, manifest_path, "--split")
    if manifest.classes != loaded.classes:
        raise ConfigError(
            f"--split {urls}: its classes {manifest.classes} are not the model's {loaded.classes}"
        )
    # A model trained on every Nth stored frame is judged on them, at that rate.
    rate = fps or manifest.fps
    rate = None if rate is None else rate / cfg.frame_stride
    if relaxed_seconds and rate is None:
        raise ConfigError(
            "--relaxed-seconds needs the frame rate: index.json has no fps (distseq shard writes "
            "it); pass --fps"
        )
    window = round(relaxed_seconds * rate) if rate and relaxed_seconds else 0
    model = loaded.model.to(info.device)
    out.mkdir(parents=True, exist_ok=True)

    def keep(key: str, probabilities: torch.Tensor) -> None:
        write_predictions(out / f"{key}.csv", probabilities, loaded.classes, rate)

    data = replace(cfg, val=urls, manifest=manifest_path)
    batches = val_batches(data, manifest, info.rank, info.world)
    report = validate(model, batches, info.device, loaded.classes, window, keep, ignored)
    report = {
        "fps": rate,
        "relaxed_seconds": relaxed_seconds,
        "relaxed_frames": window,
        "background": sorted(background),
        **report,
    }
    if info.is_main:
        write_atomic(out / "eval.json", json.dumps(report, indent=1, allow_nan=True) + "\n")
    return report


def table(report: dict[str, Any], classes: list[str]) -> str:
    """The report as papers lay it out: mean ± std in percent, then per phase, then frame level."""

    def pct(x: float) -> str:
        return "   n/a" if math.isnan(x) else f"{100 * x:6.2f}"

    relaxed = report["relaxed_seconds"]
    lines = [
        f"{report['videos']} videos, fps {report['fps']}, relaxed boundary "
        + (f"{relaxed} s ({report['relaxed_frames']} frames)" if relaxed else "off"),
        f"{'':12}{'mean':>8} {'std':>7}",
    ]
    for metric in METRICS:
        value = report[metric]
        mean, std = pct(value["mean"]), pct(value["std"]).strip()
        lines.append(f"{metric:12}{mean:>8} ± {std:>5}")
    lines.append(f"\n{'per phase':16}" + "".join(f"{m:>10}" for m in METRICS[1:]))
    per_phase = report["per_phase"]
    for name in classes:
        row = per_phase[name]
        lines.append(f"{name[:16]:16}" + "".join(f"{pct(row[m]):>10}" for m in METRICS[1:]))
    frame = report["frame_level"]
    lines.append(
        "\nframe level (all frames concatenated, strict, macro over phases): "
        + ", ".join(f"{m} {pct(frame[m]).strip()}" for m in METRICS)
    )
    edit, background = report["edit"], ", ".join(report["background"]) or "none"
    f1s = ", ".join(f"{m.upper()} {pct(report[m]).strip()}" for m in SEGMENT_METRICS[1:])
    lines.append(
        f"segments (strict, background: {background}): edit {pct(edit['mean']).strip()} ± "
        f"{pct(edit['std']).strip()}, {f1s}"
    )
    return "\n".join(lines)
