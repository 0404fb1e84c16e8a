"""``distseq bench protocols``: how far apart the two protocols of ``distseq eval`` are (distseq's
documented one and the Cholec80 MATLAB script's), on Cholec80-shaped videos with simulated
predictions, written as Cholec80's files and scored through ``eval --predictions``' library.

The videos: the 7 phases in order at 1 frame/s, each lasting its Cholec80 mean (below) times a
factor drawn from 0.5 to 1.5, phase 6 skipped in one video of ten, and a return from phase 5 to
4 in one of five (the jumps the script's extra allowances are for). The predictions: each phase
change seen up to ``shift`` seconds early or late (normal, std ``shift``), and inside each phase
flickers of a neighbouring phase, 3 to 10 s long, one per 200 s on average. The seed makes it
the same set each time.
"""

from __future__ import annotations

import json
import math
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distseq.data.cholec80 import CHOLEC80_PHASES
from distseq.evaluate.judging import Judging
from distseq.evaluate.scored_files import score_files
from distseq.score.metrics import METRICS, PROTOCOLS

# Mean phase durations in Cholec80 (seconds), as reported with the dataset (Twinanda et al.
# 2016, table 1), rounded.
MEAN_SECONDS = (125, 954, 168, 857, 98, 178, 83)


@dataclass(frozen=True)
class ProtocolsBench:
    videos: int
    shift: float  # std of a phase change's error in seconds
    relaxed_seconds: float
    seed: int
    json: bool


def _truth(rng: random.Random) -> list[int]:
    phases = [p for p in range(7) if not (p == 5 and rng.random() < 0.1)]
    if rng.random() < 0.2:
        phases.insert(phases.index(4) + 1, 3)  # back from packaging to dissection
    labels: list[int] = []
    for p in phases:
        seconds = MEAN_SECONDS[p] * rng.uniform(0.5, 1.5)
        if labels and labels[-1] == 4 and p == 3:
            seconds = rng.uniform(10, 40)  # a short return
        labels += [p] * max(1, round(seconds))
    return labels


def _predicted(truth: list[int], shift: float, rng: random.Random) -> list[int]:
    pred = list(truth)
    for k in range(1, len(truth)):
        if truth[k] != truth[k - 1]:
            moved = round(rng.gauss(0, shift))
            start, end = sorted((k, k + moved))
            start, end = max(0, start), min(len(pred), end)
            # early (moved < 0): the next phase from k + moved; late: the previous until k + moved
            pred[start:end] = [truth[k] if moved < 0 else truth[k - 1]] * (end - start)
    for _ in range(len(truth) // 200):
        at, length = rng.randrange(len(truth)), rng.randint(3, 10)
        neighbour = min(6, max(0, truth[at] + rng.choice((-1, 1))))
        pred[at : at + length] = [neighbour] * len(pred[at : at + length])
    return pred


def _write(path: Path, labels: list[int]) -> None:
    rows = "".join(f"{k}\t{CHOLEC80_PHASES[y]}\n" for k, y in enumerate(labels))
    path.write_text("Frame\tPhase\n" + rows)


def bench_protocols(opts: ProtocolsBench) -> None:
    rng = random.Random(opts.seed)
    with tempfile.TemporaryDirectory() as tmp:
        truth, pred = Path(tmp) / "truth", Path(tmp) / "pred"
        truth.mkdir()
        pred.mkdir()
        for v in range(1, opts.videos + 1):
            labels = _truth(rng)
            _write(truth / f"video{v:02d}-phase.txt", labels)
            _write(pred / f"video{v:02d}-phase.txt", _predicted(labels, opts.shift, rng))
        mapping = list(CHOLEC80_PHASES)
        reports: dict[str, dict[str, Any]] = {
            protocol: score_files(
                pred, truth, mapping, Judging(opts.relaxed_seconds, protocol), 1.0, print
            )
            for protocol in PROTOCOLS
        }
    rows = {metric: {p: reports[p][metric] for p in PROTOCOLS} for metric in METRICS}
    if opts.json:
        print(json.dumps({"videos": opts.videos, "metrics": rows}, indent=1))
        return
    print(
        f"{opts.videos} Cholec80-shaped videos at 1 fps, simulated predictions (changes off by "
        f"{opts.shift:g} s std), relaxed boundary {opts.relaxed_seconds:g} s; mean ± std, %"
    )
    print(f"{'':12}{'distseq':>16}{'script':>16}{'script - distseq':>18}")

    def pct(x: float) -> str:
        return "n/a" if math.isnan(x) else f"{100 * x:.2f}"

    for metric, row in rows.items():
        a, b = row["distseq"], row["script"]
        cells = [
            f"{pct(x['mean'])} ± {pct(x['std'])}" if not math.isnan(x["mean"]) else "n/a"
            for x in (a, b)
        ]
        gap = pct(b["mean"] - a["mean"])
        print(f"{metric:12}{cells[0]:>16}{cells[1]:>16}{gap:>18}")
