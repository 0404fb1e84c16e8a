"""Stopping a run on request: SIGTERM and SIGUSR2 become a checkpoint at the next step boundary."""

from __future__ import annotations

import signal
import types

from distseq.errors import TrainingError


class Interrupted(TrainingError):
    """Training stopped early because it was asked to, after every rank saved a checkpoint."""

    def __init__(self, step: int) -> None:
        super().__init__(f"stopped on request after step {step}, saved; run again to resume")
        self.step = step


class StopSignals:
    """Turns SIGTERM and SIGUSR2 into a request to stop at the next step with a checkpoint.

    Pass it as ``train(cfg, stop=...)``; ``received`` says which signals came.
    """

    def __init__(self) -> None:
        self.received: set[int] = set()
        for sig in (signal.SIGTERM, signal.SIGUSR2):
            signal.signal(sig, self._record)

    def _record(self, signum: int, frame: types.FrameType | None) -> None:
        self.received.add(signum)

    def __call__(self) -> bool:
        return bool(self.received)
