"""Stopping a run on request: SIGTERM and SIGUSR2 become a checkpoint at the next step boundary;
before the first one, SIGTERM stops the run at once."""

from __future__ import annotations

import signal
import types

from distseq.errors import Stopped


class Interrupted(Stopped):
    """Training stopped early because it was asked to, after every rank saved a checkpoint at
    ``step`` (``saved``), or before the leg's first step, with nothing new to save. Exit code
    143, as every stop on request (``errors.EXIT_STOPPED``)."""

    def __init__(self, step: int, saved: bool = True) -> None:
        super().__init__(
            f"stopped on request after step {step}, saved; run again to resume"
            if saved
            else f"stopped on request before step {step + 1}, nothing new to save; run again "
            "to go on"
        )
        self.step = step


class StoppedAtStart(BaseException):
    """SIGTERM came before the first step: nothing of this run to save. A BaseException, as
    KeyboardInterrupt is, so that no ``except Exception`` on its way (reading a checkpoint, say)
    takes it for an error of its own; the command line says it in one line, exit code 143."""

    def __init__(self) -> None:
        super().__init__(
            "stopped by SIGTERM while starting (before the first step): nothing to save; run "
            "again to start, or to resume from the last checkpoint"
        )


class StopSignals:
    """Turns SIGTERM and SIGUSR2 into a request to stop at the next step with a checkpoint.

    Pass it as ``train(cfg, stop=...)``; ``received`` says which signals came. Until it is first
    polled, at the step boundary before the first step, there is no step to save: SIGTERM raises
    :class:`StoppedAtStart` at once, wherever the run is (the probe of a memory plan, setting up
    the data, restoring a checkpoint), so that a job cancelled or preempted while it starts
    leaves. SIGUSR2 (a time limit ahead) waits for the first step boundary, as later.
    """

    def __init__(self) -> None:
        self.received: set[int] = set()
        self._polled = False
        for sig in (signal.SIGTERM, signal.SIGUSR2):
            signal.signal(sig, self._record)

    def _record(self, signum: int, frame: types.FrameType | None) -> None:
        if signum == signal.SIGTERM and not self._polled:
            raise StoppedAtStart
        self.received.add(signum)

    def __call__(self) -> bool:
        self._polled = True
        return bool(self.received)
