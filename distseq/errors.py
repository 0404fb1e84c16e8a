"""The errors users cause, each printed by the command line as one line, and that one line.

``ConfigError`` and ``ModelError`` exit with code 2, ``DataError`` and ``TrainingError`` with
code 1, ``Stopped`` (a run stopped on request, its work saved) with 143 (``exit_code``): under
``distseq train`` (``cli.py``), torchrun and ``distseq submit``'s jobs alike.
"""

from __future__ import annotations

import os

EXIT_FAILURE = 1
EXIT_CONFIG = 2
# 128 + SIGTERM, what a shell reports for a process that SIGTERM ended: a run stopped on request
# (SIGTERM or SIGUSR2) with nothing lost, never a failure.
EXIT_STOPPED = 128 + 15


def first_line(what: object) -> str:
    """The first non-blank line of an error's or a text's words; the error's type if none."""
    lines = [line.strip() for line in str(what).splitlines() if line.strip()]
    if lines:
        return lines[0]
    return type(what).__name__ if isinstance(what, BaseException) else ""


class ConfigError(ValueError):
    """A bad config; the message is one line that names the key or file."""


class DataError(ValueError):
    """Bad data; the message is one line that names the shard, sample or file at fault."""

    def __init__(self, message: str) -> None:
        # DataLoader re-raises a worker's exception as type(e)(whole traceback); the traceback's
        # last line is "...DataError: <original message>", so keep just that.
        if "\n" in message:
            last = [line for line in message.splitlines() if line.strip()][-1]
            message = last.split("DataError: ", 1)[-1]
        super().__init__(message)


class TrainingError(RuntimeError):
    """The run cannot go on (or a checkpoint cannot be read or written); the message is one line."""


class Stopped(TrainingError):
    """The run stopped because it was asked to (SIGTERM, SIGUSR2), with its work saved: not a
    failure. A ``TrainingError`` still, so that code around a run (the bench) passes it on."""


class ModelError(ValueError):
    """A model or its input that breaks the contract of ``distseq.ChunkedModel`` (a backbone's or
    a head's output, frames of the wrong dtype or shape); the message is one line naming the
    shapes."""


def exit_code(error: BaseException) -> int | None:
    """The exit code of an error users cause (this module's), None for any other."""
    if isinstance(error, Stopped):
        return EXIT_STOPPED
    if isinstance(error, ConfigError | ModelError):
        return EXIT_CONFIG
    if isinstance(error, DataError | TrainingError):
        return EXIT_FAILURE
    return None


def error_line(message: str, stopped: bool = False) -> str:
    """``message`` as this process's one error line, naming its rank under torchrun or SLURM; a
    stop on request (``stopped``), its work saved, is no error and is not called one."""
    rank = os.environ.get("RANK")
    where = "" if rank is None else f" (rank {rank})"
    return f"distseq{where}: {message}" if stopped else f"distseq: error{where}: {message}"
