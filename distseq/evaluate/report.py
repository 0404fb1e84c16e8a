"""The pictures of a run and one ``report.html`` that shows them, as ``distseq report`` makes them.

Curves from ``metrics.jsonl`` (loss, validation metrics, frames/s and time waiting for data,
peak memory where it was recorded), and, from the run's latest checkpoint on its validation
videos: a phase ribbon per video (truth, prediction, errors) and the confusion matrix.
"""

from __future__ import annotations

import html
import json
from dataclasses import replace
from pathlib import Path

import torch

from distseq.checkpoint.export import load_checkpointed
from distseq.data.manifest import find_manifest, load_manifest
from distseq.data.tar import recorded_shards
from distseq.data.val_stream import val_batches
from distseq.errors import ConfigError, TrainingError
from distseq.evaluate.plots import confusion, curves
from distseq.files import write_atomic
from distseq.score.ribbon import ribbon
from distseq.score.validate import VALIDATION, probabilities_by_video

STYLE = (
    "body{font-family:sans-serif;max-width:1040px;margin:auto}"
    "img{max-width:100%}td{padding:2px 12px}"
)


def _records(run: Path) -> list[dict[str, float]]:
    path = run / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise TrainingError(f"{path}: cannot read the run's metrics ({e.strerror})") from None
    return [json.loads(line) for line in lines if line.strip()]


def _series(
    records: list[dict[str, float]], *keys: str
) -> dict[str, tuple[list[int], list[float]]]:
    out = {}
    for key in keys:
        points = [(int(r["step"]), float(r[key])) for r in records if key in r]
        if points:
            out[key] = ([s for s, _ in points], [v for _, v in points])
    return out


def make_report(run: Path, out: Path, split: str = "") -> list[Path]:
    """Write the PNGs and report.html into ``out``; returns the PNGs, in the page's order.
    ``split``: the shards of the ribbons and the confusion matrix; empty, the run's data.val."""
    if not run.is_dir():
        raise ConfigError(f"{run}: no such run directory")
    records = _records(run)
    out.mkdir(parents=True, exist_ok=True)
    made: list[tuple[str, Path]] = []

    def curve(name: str, title: str, ylabel: str, *keys: str) -> None:
        series = _series(records, *keys)
        if series:
            curves(out / f"{name}.png", series, ylabel)
            made.append((title, out / f"{name}.png"))

    curve("loss", "Loss", "loss per real frame", "loss", "val_loss")
    scores = [f"val_{m}" for m in VALIDATION if m != "loss"]  # on the loss's scale, above
    curve("validation", "Validation", "score", *scores)
    curve("speed", "Training speed", "frames/s", "frames_per_s")
    curve("data_wait", "Share of step time waiting for data", "fraction", "data_wait_fraction")
    curve("memory", "Peak device memory", "bytes", "peak_memory_bytes")
    notes = []
    if not any("peak_memory_bytes" in r for r in records):
        notes.append("Peak device memory is recorded on GPUs; this run had none.")

    loaded = load_checkpointed(run)
    cfg = loaded.config.data
    classes = loaded.classes
    if split or cfg.val:
        if split:
            cfg = replace(cfg, val=split, manifest="")
            manifest = find_manifest(split, "", "--split")
        else:
            cfg = replace(cfg, val=recorded_shards(cfg.val, "data.val", "--split", "val"))
            manifest = load_manifest(cfg)
        rate = None if manifest.fps is None else manifest.fps / cfg.frame_stride
        counts = [[0] * len(classes) for _ in classes]
        (out / "ribbons").mkdir(exist_ok=True)
        ribbons = []
        for key, probs, labels in probabilities_by_video(
            loaded.model, val_batches(cfg, manifest), torch.device("cpu")
        ):
            pred, truth = probs.argmax(-1).tolist(), labels.tolist()
            for t, p in zip(truth, pred, strict=True):
                if t >= 0:  # unlabelled frames are left out, as the metrics leave them
                    counts[t][p] += 1
            wrong = [0 <= t != p for t, p in zip(truth, pred, strict=True)]
            accuracy = 1 - sum(wrong) / max(1, sum(t >= 0 for t in truth))
            path = out / "ribbons" / f"{key}.png"
            ribbon(
                path,
                {"truth": truth, "prediction": pred},
                classes,
                rate,
                wrong,
                f"{key}: accuracy {accuracy:.3f}",
            )
            ribbons.append((f"{key}", path))
        confusion(out / "confusion.png", counts, classes)
        made.append(("Confusion matrix, validation frames", out / "confusion.png"))
        made += ribbons
    else:
        notes.append("The run has no data.val: no ribbons, no confusion matrix.")
    _write_html(out / "report.html", run, loaded.which, records, made, notes)
    return [path for _, path in made]


def _write_html(
    page: Path,
    run: Path,
    which: str,
    records: list[dict[str, float]],
    images: list[tuple[str, Path]],
    notes: list[str],
) -> None:
    last = next((r for r in reversed(records) if "val_accuracy" in r), None)
    rows = "".join(
        f"<tr><td>{m}</td><td>{last[f'val_{m}']:.4f}</td></tr>"
        for m in VALIDATION
        if last and f"val_{m}" in last
    )
    body = [
        f"<h1>distseq report: {html.escape(str(run))}</h1>",
        f"<p>Checkpoint: {html.escape(which)}.</p>",
    ]
    if rows:
        body.append(f"<h2>Validation at step {int(last['step'])}</h2><table>{rows}</table>")  # type: ignore[index]
    body += [f"<p>{html.escape(note)}</p>" for note in notes]
    for title, path in images:
        src, alt = html.escape(str(path.relative_to(page.parent))), html.escape(title)
        body.append(f'<h3>{alt}</h3><a href="{src}"><img src="{src}" alt="{alt}"></a>')
    head = f"<meta charset='utf-8'><title>distseq report</title><style>{STYLE}</style>"
    write_atomic(
        page, f"<!doctype html><html><head>{head}</head><body>{''.join(body)}</body></html>\n"
    )
