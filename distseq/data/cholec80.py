"""What distseq knows of the field's datasets: Cholec80's phases in procedure order and the
train/val/test splits that papers use, so that numbers can be put beside published ones."""

from __future__ import annotations

import re

from distseq.errors import ConfigError

# In procedure order, as Cholec80's annotations name them and its MATLAB evaluation numbers them
# 1 to 7 (its extra allowances for phases 4 to 7 rely on this order).
CHOLEC80_PHASES = (
    "Preparation",
    "CalotTriangleDissection",
    "ClippingCutting",
    "GallbladderDissection",
    "GallbladderPackaging",
    "CleaningCoagulation",
    "GallbladderRetraction",
)

# Video numbers of train, val and test. "40-8-32" is the split most papers use (the first 40
# videos to train, 8 to validate, the last 32 to test); "32-8-40" keeps the original 40 test
# videos, validating on 8 of the training half.
STANDARD_SPLITS = {
    "cholec80-40-8-32": (range(1, 41), range(41, 49), range(49, 81)),
    "cholec80-32-8-40": (range(1, 33), range(33, 41), range(41, 81)),
}
_VIDEO_NUMBER = re.compile(r"video_?0*(\d+)", re.IGNORECASE)


def default_class_order(names: set[str]) -> list[str]:
    """Cholec80's order where the names are its phases (which the relaxed boundary and the
    script protocol rely on), else sorted."""
    if names and names <= set(CHOLEC80_PHASES):
        return list(CHOLEC80_PHASES)
    return sorted(names)


def standard_split(name: str, stems: list[str]) -> dict[str, str]:
    """Each stem's split under the standard split ``name``; every one of its videos must be in
    ``stems`` (named video01 ... video80) and nothing else."""
    if name not in STANDARD_SPLITS:
        raise ConfigError(f"--standard-split {name}: expected one of {', '.join(STANDARD_SPLITS)}")
    by_number: dict[int, str] = {}
    for stem in stems:
        match = _VIDEO_NUMBER.fullmatch(stem)
        if match is None:
            raise ConfigError(f"--standard-split {name}: input {stem} is not named videoNN")
        by_number[int(match[1])] = stem
    split = {}
    for part, numbers in zip(("train", "val", "test"), STANDARD_SPLITS[name], strict=True):
        for number in numbers:
            if number not in by_number:
                raise ConfigError(f"--standard-split {name}: no input is video{number:02d}")
            split[by_number.pop(number)] = part
    if by_number:
        extra = by_number[min(by_number)]
        raise ConfigError(f"--standard-split {name}: input {extra} is in none of its splits")
    return split
