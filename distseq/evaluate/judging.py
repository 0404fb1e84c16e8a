"""A trained model judged on a split's whole videos, as ``distseq eval`` does: the field's phase
metrics (``metrics.py``) as one table, ``eval.json`` and one predictions CSV per video."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from distseq.checkpoint.export import Loaded
from distseq.config import DataConfig
from distseq.data.manifest import SPLITS, Manifest, check_kind, find_manifest
from distseq.data.tar import recorded_shards
from distseq.data.val_stream import val_batches
from distseq.errors import ConfigError
from distseq.files import write_atomic
from distseq.parallel import DistInfo
from distseq.score.metrics import (
    METRICS,
    PROTOCOLS,
    SCRIPT_PHASES,
    SEGMENT_METRICS,
    Scoring,
)
from distseq.score.predictions import write_predictions
from distseq.score.validate import validate

SCRIPT_RELAXED_SECONDS = 10.0  # Evaluate.m's oriT = 10 * fps


@dataclass(frozen=True)
class Judging:
    """How ``distseq eval`` judges, as given on its command line (``metrics.Scoring``'s source)."""

    relaxed_seconds: float | None = None  # None: the protocol's (the script's 10 s, else off)
    protocol: str = "distseq"  # one of metrics.PROTOCOLS
    background: Sequence[str] = ()  # names of the classes that make no segment


def scoring_of(judging: Judging, classes: list[str], rate: float | None) -> tuple[Scoring, dict]:
    """The ``Scoring`` of ``judging`` for ``classes`` at ``rate`` frames/s, and the report's
    first keys saying how it judged."""
    if judging.protocol not in PROTOCOLS:
        raise ConfigError(f"--protocol {judging.protocol}: expected one of {', '.join(PROTOCOLS)}")
    if judging.protocol == "script" and len(classes) != SCRIPT_PHASES:
        raise ConfigError(
            f"--protocol script is Cholec80's MATLAB evaluation, for its {SCRIPT_PHASES} phases "
            f"in procedure order; these are {len(classes)}: {classes}"
        )
    unknown = sorted(set(judging.background) - set(classes))
    if unknown:
        raise ConfigError(f"--background {unknown[0]}: not one of the classes {classes}")
    relaxed = judging.relaxed_seconds
    if relaxed is None:
        relaxed = SCRIPT_RELAXED_SECONDS if judging.protocol == "script" else 0.0
    if relaxed < 0:
        raise ConfigError(f"--relaxed-seconds {relaxed}: must be >= 0")
    if relaxed and rate is None:
        raise ConfigError(
            f"a relaxed window of {relaxed:g} s needs the frame rate, which no index.json "
            "gives here (distseq shard records it): pass --fps, or --relaxed-seconds 0"
        )
    window = round(relaxed * rate) if rate and relaxed else 0
    ignored = frozenset(classes.index(name) for name in judging.background)
    header = {
        "classes": classes,
        "protocol": judging.protocol,
        "fps": rate,
        "relaxed_seconds": relaxed,
        "relaxed_frames": window,
        "background": sorted(judging.background),
    }
    return Scoring(window, ignored, judging.protocol), header


def evaluate(
    loaded: Loaded,
    split: str,
    manifest_path: str,
    judging: Judging,
    fps: float | None,
    out: Path,
    info: DistInfo,
) -> dict[str, object]:
    """The report of ``loaded`` on the videos of ``split`` (``val``: the model's own validation
    shards; ``train`` or ``test``: those of the model's manifest; else a shard pattern),
    written to ``out``; this rank's share, all ranks' report."""
    cfg = loaded.config.data
    urls, manifest = split_shards(cfg, split, manifest_path)
    check_kind(manifest, cfg.features)
    if manifest.classes != loaded.classes:
        raise ConfigError(
            f"--split {urls}: its classes {manifest.classes} are not the model's {loaded.classes}"
        )
    # A model trained on every Nth stored frame is judged on them, at that rate.
    rate = fps or manifest.fps
    rate = None if rate is None else rate / cfg.frame_stride
    judge, header = scoring_of(judging, loaded.classes, rate)
    model = loaded.model.to(info.device)
    out.mkdir(parents=True, exist_ok=True)

    def keep(key: str, probabilities: torch.Tensor) -> None:
        write_predictions(out / f"{key}.csv", probabilities, loaded.classes, rate)

    data = replace(cfg, val=urls, manifest=str(manifest.path))
    batches = val_batches(data, manifest, info.rank, info.world)
    report = {**header, **validate(model, batches, info.device, loaded.classes, judge, keep)}
    report["model"] = loaded.which
    if info.is_main:
        write_report(out, report)
    return report


def split_shards(cfg: DataConfig, split: str, manifest_path: str) -> tuple[str, Manifest]:
    """The shards of ``--split`` and their manifest: ``val``, the model's data.val; ``train`` or
    ``test``, the shards of that split in the model's manifest (beside its data.train shards,
    where ``distseq shard`` wrote them); anything else, a shard pattern."""
    manifest_path = manifest_path or (cfg.manifest if split in SPLITS else "")
    if split == "val":
        urls = recorded_shards(cfg.val, "data.val", "--split", "val")
        return urls, find_manifest(urls, manifest_path, "--split")
    if split not in SPLITS:
        return split, find_manifest(split, manifest_path, "--split")
    train = recorded_shards(cfg.train, "data.train", "--split", "train")
    manifest = find_manifest(train, manifest_path, "--split")
    names = [name for name, info in manifest.shards.items() if info.split == split]
    if not names:
        raise ConfigError(
            f"--split {split}: the model's manifest {manifest.path} lists no {split} shards "
            "(distseq shard --test-list or --standard-split writes them)"
        )
    return "::".join(str(manifest.path.parent / name) for name in names), manifest


def write_report(out: Path, report: dict[str, object]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "eval.json", json.dumps(report, indent=1, allow_nan=True) + "\n")


def table(report: dict[str, Any]) -> str:
    """The report as papers lay it out: mean ± std in percent, then per phase, then frame level."""
    classes = report["classes"]

    def pct(x: float) -> str:
        return "   n/a" if math.isnan(x) else f"{100 * x:6.2f}"

    relaxed = report["relaxed_seconds"]
    lines = [f"model: {report['model']}"] if report.get("model") else []
    lines += [
        f"{report['videos']} videos, fps {report['fps']}, relaxed boundary "
        + (f"{relaxed} s ({report['relaxed_frames']} frames)" if relaxed else "off")
        + f", {report['protocol']} protocol",
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
