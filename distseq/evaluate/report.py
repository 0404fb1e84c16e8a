"""The pictures of a run and one ``report.html`` that shows them, as ``distseq report`` makes them.

Curves from ``metrics.jsonl`` (loss, validation metrics, frames/s and time waiting for data,
peak memory where it was recorded; a key recorded once is a number on the page, not a curve of
one dot), and, from the run's latest checkpoint on its validation videos: the confusion matrix,
a phase ribbon (truth, prediction, errors) for each of the worst videos by accuracy, worst
first, and a table of every video's accuracy.
"""

from __future__ import annotations

import html
import json
import statistics
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
# Ribbons drawn: the worst videos'. A ribbon is a 10-inch figure of its own; a Breakfast test
# split drew hundreds, one under the other, and the demo 128, where the few worst say most.
RIBBONS = 8


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


def make_report(run: Path, out: Path, split: str = "", ribbons: int = RIBBONS) -> list[Path]:
    """Write the PNGs and report.html into ``out``; returns the PNGs, in the page's order.
    ``split``: the shards of the ribbons and the confusion matrix; empty, the run's data.val.
    ``ribbons``: how many of the worst videos get one."""
    if not run.is_dir():
        raise ConfigError(f"{run}: no such run directory")
    records = _records(run)
    out.mkdir(parents=True, exist_ok=True)
    made: list[tuple[str, Path]] = []
    notes = []

    def curve(name: str, title: str, ylabel: str, *keys: str) -> None:
        series = _series(records, *keys)
        # One record is a number, not a curve: one dot on an axis of every step says less.
        drawn = {k: v for k, v in series.items() if len(v[0]) > 1}
        for key, (steps, values) in series.items():
            if key not in drawn and not key.startswith("val_"):  # val_*: the page's table
                notes.append(f"{title}: {key} {values[0]:.4g} at step {steps[0]}, its one record.")
        if drawn:
            curves(out / f"{name}.png", drawn, ylabel)
            made.append((title, out / f"{name}.png"))

    curve("loss", "Loss", "loss per real frame", "loss", "val_loss")
    scores = [f"val_{m}" for m in VALIDATION if m != "loss"]  # on the loss's scale, above
    curve("validation", "Validation", "score", *scores)
    curve("speed", "Training speed", "frames/s", "frames_per_s")
    curve("data_wait", "Share of step time waiting for data", "fraction", "data_wait_fraction")
    curve("memory", "Peak device memory", "bytes", "peak_memory_bytes")
    if not any("peak_memory_bytes" in r for r in records):
        notes.append("Peak device memory is recorded on GPUs; this run had none.")

    loaded = load_checkpointed(run)
    cfg = loaded.config.data
    classes = loaded.classes
    videos: list[tuple[float, str]] = []  # (accuracy, key), the worst first
    drawn: list[tuple[str, Path]] = []
    if split or cfg.val:
        if split:
            cfg = replace(cfg, val=split, manifest="")
            manifest = find_manifest(split, "", "--split")
        else:
            cfg = replace(cfg, val=recorded_shards(cfg.val, "data.val", "--split", "val"))
            manifest = load_manifest(cfg)
        rate = None if manifest.fps is None else manifest.fps / cfg.frame_stride
        counts = [[0] * len(classes) for _ in classes]
        scored = []
        for key, probs, labels in probabilities_by_video(
            loaded.model, val_batches(cfg, manifest), torch.device("cpu")
        ):
            pred, truth = probs.argmax(-1).tolist(), labels.tolist()
            for t, p in zip(truth, pred, strict=True):
                if t >= 0:  # unlabelled frames are left out, as the metrics leave them
                    counts[t][p] += 1
            wrong = [0 <= t != p for t, p in zip(truth, pred, strict=True)]
            accuracy = 1 - sum(wrong) / max(1, sum(t >= 0 for t in truth))
            scored.append((accuracy, str(key), truth, pred, wrong))
        confusion(out / "confusion.png", counts, classes)
        made.append(("Confusion matrix, validation frames", out / "confusion.png"))
        scored.sort(key=lambda v: (v[0], v[1]))  # the worst first; ties in the keys' order
        (out / "ribbons").mkdir(exist_ok=True)
        for accuracy, key, truth, pred, wrong in scored[:ribbons]:
            path = out / "ribbons" / f"{key}.png"
            title = f"{key}: accuracy {accuracy:.3f}"
            ribbon(path, {"truth": truth, "prediction": pred}, classes, rate, wrong, title)
            drawn.append((title, path))
        videos = [(accuracy, key) for accuracy, key, *_ in scored]
    else:
        notes.append("The run has no data.val: no ribbons, no confusion matrix.")
    _write_html(out / "report.html", run, loaded.which, records, made, notes, videos, drawn)
    return [path for _, path in made + drawn]


def _write_html(
    page: Path,
    run: Path,
    which: str,
    records: list[dict[str, float]],
    images: list[tuple[str, Path]],
    notes: list[str],
    videos: list[tuple[float, str]],
    ribbons: list[tuple[str, Path]],
) -> None:
    """The page: the last validation's table, the notes, the pictures; then the videos: a line
    on their accuracies, the ribbons of the worst and a table of every one, the worst first."""
    validations = [r for r in records if "val_accuracy" in r]
    last = validations[-1] if validations else None
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
        once = ", the run's only one" if len(validations) == 1 else ""
        body.append(f"<h2>Validation at step {int(last['step'])}{once}</h2><table>{rows}</table>")  # type: ignore[index]
    body += [f"<p>{html.escape(note)}</p>" for note in notes]
    body += [_image(page, title, path) for title, path in images]
    if videos:
        accuracies = [a for a, _ in videos]
        shown = f"all {len(videos)}" if len(ribbons) == len(videos) else f"the {len(ribbons)} worst"
        body.append(
            f"<h2>Validation videos</h2><p>{len(videos)} videos, accuracy per video: median "
            f"{statistics.median(accuracies):.3f}, from {accuracies[0]:.3f} to "
            f"{accuracies[-1]:.3f}. The phase ribbons of {shown}, the worst first; every "
            "video's accuracy in the table after them.</p>"
        )
        body += [_image(page, title, path) for title, path in ribbons]
        table = "".join(
            f"<tr><td>{i}</td><td>{html.escape(key)}</td><td>{accuracy:.3f}</td></tr>"
            for i, (accuracy, key) in enumerate(videos, 1)
        )
        body.append(
            f"<details><summary>Every video's accuracy ({len(videos)}), the worst first"
            f"</summary><table><tr><th></th><th>video</th><th>accuracy</th></tr>{table}"
            "</table></details>"
        )
    head = f"<meta charset='utf-8'><title>distseq report</title><style>{STYLE}</style>"
    write_atomic(
        page, f"<!doctype html><html><head>{head}</head><body>{''.join(body)}</body></html>\n"
    )


def _image(page: Path, title: str, path: Path) -> str:
    src, alt = html.escape(str(path.relative_to(page.parent))), html.escape(title)
    return f'<h3>{alt}</h3><a href="{src}"><img src="{src}" alt="{alt}"></a>'
