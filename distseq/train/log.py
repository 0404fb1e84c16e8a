"""The metrics log: ``metrics.jsonl`` (one JSON record per line) and the same records as
TensorBoard scalars under ``tensorboard/``, both written by the main rank only."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

from distseq.files import write_atomic


def _recorded_by(line: str, step: int) -> bool:
    """Whether a metrics line records ``step`` or an earlier one."""
    try:
        return int(json.loads(line)["step"]) <= step
    except (ValueError, KeyError, TypeError):  # a line torn by a killed process
        return False


def scalar_tag(key: str) -> str:
    """TensorBoard's name of a metrics key: ``val_jaccard`` -> ``val/jaccard``, ``loss`` ->
    ``train/loss``, so that each stage's curves share a section."""
    return "val/" + key.removeprefix("val_") if key.startswith("val_") else "train/" + key


class MetricsLog:
    """Writes on the main rank; other ranks write nothing."""

    def __init__(self, out_dir: Path, enabled: bool, after_step: int) -> None:
        self.enabled = enabled
        if enabled:
            path = out_dir / "metrics.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            # A resumed run trains the steps after its checkpoint again: drop their records
            # (and a fresh run's stale ones) so that the log reads as one uninterrupted run.
            lines = path.read_text().splitlines() if path.exists() else []
            kept = [line for line in lines if _recorded_by(line, after_step)]
            write_atomic(path, "".join(line + "\n" for line in kept))
            self.file = path.open("a")
            # purge_step: TensorBoard hides what an earlier leg wrote from that step on.
            self.board = SummaryWriter(str(out_dir / "tensorboard"), purge_step=after_step + 1)

    def write(self, record: Mapping[str, object]) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        step = int(record["step"])  # type: ignore[call-overload]
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and math.isfinite(value):
                self.board.add_scalar(scalar_tag(key), value, step)
        self.board.flush()

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            self.board.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
