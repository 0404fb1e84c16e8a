"""The errors users cause, each printed by the command line as one line, and that one line.

``ConfigError`` and ``ModelError`` exit with code 2, ``DataError`` and ``TrainingError`` with
code 1 (``cli.py``).
"""

from __future__ import annotations


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


class ModelError(ValueError):
    """A model or its input that breaks the contract of ``distseq.ChunkedModel`` (a backbone's or
    a head's output, frames of the wrong dtype or shape); the message is one line naming the
    shapes."""
