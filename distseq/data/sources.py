"""Inputs as ``distseq shard`` and ``distseq predict`` take them: video files, folders of frame
images, or folders that hold either; each one a :class:`Source` with its sample key."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from distseq.errors import DataError

VIDEO_SUFFIXES = (".avi", ".mkv", ".mov", ".mp4")
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


@dataclass(frozen=True)
class Source:
    stem: str  # sample key: the file or folder name without suffix, made safe for webdataset
    path: Path
    is_folder: bool  # a folder of frame images, not a video file


def safe_stem(stem: str) -> str:
    # webdataset splits member names at the first dot; keep keys to a portable alphabet.
    return re.sub(r"[^0-9A-Za-z_-]", "_", stem)


def _natural(path: Path) -> list[int | str]:
    """Sort key under which frame_2.png comes before frame_10.png."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def image_files(folder: Path) -> list[Path]:
    found = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    return sorted(found, key=_natural)


def _is_video(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in VIDEO_SUFFIXES


def find_sources(inputs: list[Path]) -> list[Source]:
    found: list[Source] = []
    for path in inputs:
        if path.is_file():
            if not _is_video(path):
                raise DataError(f"{path}: not a video ({', '.join(VIDEO_SUFFIXES)})")
            found.append(Source(safe_stem(path.stem), path, False))
        elif path.is_dir():
            if image_files(path):
                found.append(Source(safe_stem(path.name), path, True))
                continue
            inner = [
                c for c in sorted(path.iterdir()) if _is_video(c) or (c.is_dir() and image_files(c))
            ]
            if not inner:
                raise DataError(f"{path}: holds no videos, frame images or frame folders")
            for c in inner:
                found.append(Source(safe_stem(c.stem if c.is_file() else c.name), c, c.is_dir()))
        else:
            raise DataError(f"input not found: {path}")
    by_stem: dict[str, Path] = {}
    for s in found:
        if s.stem in by_stem:
            raise DataError(f"inputs {by_stem[s.stem]} and {s.path} both give sample key {s.stem}")
        by_stem[s.stem] = s.path
    return sorted(found, key=lambda s: s.stem)
