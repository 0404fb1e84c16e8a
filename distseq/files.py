"""Durable, atomic file writes: what every published file of distseq goes through; and the
output folders users name.

A reader sees the old file or the new one, never a part: the bytes go to ``<name>.tmp``, are
fsynced, and only then renamed over ``<name>``; the directory is fsynced after the rename. Without
the first fsync, a file renamed just before a node crash can read back empty; without the second,
the rename itself can be lost.
"""

from __future__ import annotations

import os
from pathlib import Path

from distseq.errors import ConfigError


def output_folder(path: str | Path, option: str = "--out") -> Path:
    """``path``, a folder that exists or can be made, as ``option`` gives it; refused in one line
    where it, or a folder above it, is a file (``mkdir`` raised FileExistsError, a traceback)."""
    path = Path(path)
    there = next(p for p in (path, *path.parents) if p.exists())  # "." at the latest
    if not there.is_dir():
        names = "it is" if there == path else f"{there} is"
        raise ConfigError(f"{option} {path}: {names} a file, not a folder; give a folder")
    return path


def write_atomic(path: Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` (str is written as UTF-8), durably and atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make the renames and new entries of directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
