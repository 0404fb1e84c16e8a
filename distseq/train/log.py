"""The metrics log, ``metrics.jsonl``: one JSON record per line, on the main rank only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from distseq.files import write_atomic


def _recorded_by(line: str, step: int) -> bool:
    """Whether a metrics line records ``step`` or an earlier one."""
    try:
        return int(json.loads(line)["step"]) <= step
    except (ValueError, KeyError, TypeError):  # a line torn by a killed process
        return False


class MetricsLog:
    """JSON lines on the main rank; other ranks write nothing."""

    def __init__(self, path: Path, enabled: bool, after_step: int) -> None:
        self.enabled = enabled
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            # A resumed run trains the steps after its checkpoint again: drop their records
            # (and a fresh run's stale ones) so that the log reads as one uninterrupted run.
            lines = path.read_text().splitlines() if path.exists() else []
            kept = [line for line in lines if _recorded_by(line, after_step)]
            write_atomic(path, "".join(line + "\n" for line in kept))
            self.file = path.open("a")

    def write(self, record: Mapping[str, object]) -> None:
        if self.enabled:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.enabled:
            self.file.close()
