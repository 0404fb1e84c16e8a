"""Sizes in bytes as people write and read them: one table of units for the whole package."""

from __future__ import annotations

import re

from distseq.errors import ConfigError

MIB = 2**20
GB = 10**9
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BUDGET_RE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]*)\s*")


def parse_budget(text: str) -> int | float:
    """``memory.budget`` as bytes (``40GB``, ``512MiB``: an int) or as a fraction of the
    device's memory (``0.5``: a float in (0, 1])."""
    match = _BUDGET_RE.fullmatch(text.lower())
    bad = ConfigError(
        f"config key memory.budget={text!r}: must be bytes with a unit (40GB, 512MiB) or a "
        "fraction of the device in (0, 1]"
    )
    if match is None:
        raise bad
    number, unit = float(match[1]), match[2]
    if not unit and "." in match[1]:
        if not 0 < number <= 1:
            raise bad
        return number
    if unit not in _UNITS or number <= 0:
        raise bad
    return int(number * _UNITS[unit])


def format_size(nbytes: float) -> str:
    """Bytes for people: GB from 0.1 GB up, else MB."""
    return f"{nbytes / GB:.3g} GB" if nbytes >= GB / 10 else f"{nbytes / 10**6:.3g} MB"
