"""The action-segmentation datasets' released features (50Salads, Breakfast, GTEA as MS-TCN
distributes them) -> feature shards that ``data.features=true`` trains on.

A release ``ROOT`` holds::

    features/<video>.npy                 float (features, frames): I3D, 2048 a frame
    groundTruth/<video>.txt              one class name per line, one line per frame
    mapping.txt                          "<id> <class name>" lines, ids 0..K-1
    splits/train.split<N>.bundle         ground-truth file names (rgb-01-1.txt), one per line
    splits/test.split<N>.bundle

One fold N becomes ``train-NNNNNN.tar`` (split ``train``: the train bundle's videos) and
``test-NNNNNN.tar`` (split ``test``: the test bundle's), ``videos_per_shard`` videos each in bundle
order, in the format ``distseq features`` writes (``distseq.data.manifest``): per video
``<video>.features.npy``, float16 (frames, features), and ``<video>.labels.json``, the class ids.
MS-TCN has no val set and validates on the test videos; so may ``data.val`` (it takes shards of
any split), and ``distseq eval --split test`` finds them from the run's manifest.

Everything is checked before a shard is written; frame counts must agree exactly (MS-TCN's
loader cuts the longer of features and labels, silently). Each shard is written as
``<name>.tmp`` and renamed when whole, a shard already there is skipped, and ``index.json`` comes
last, so a killed run resumes where it stopped. ``.released.json`` records which videos go into
which shard: a rerun with other options, or another fold, into the same ``--out`` is refused.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn
from tqdm import tqdm

from distseq.data.decode import npy_error
from distseq.data.label_text import read_mapping, read_text, read_video_list
from distseq.data.manifest import (
    FEATURES_MEMBER,
    LABELS_MEMBER,
    Manifest,
    ShardInfo,
    shard_label_counts,
    write_manifest,
)
from distseq.data.sources import safe_stem
from distseq.data.tar import add_member
from distseq.errors import ConfigError, DataError, ModelError, first_line
from distseq.files import write_atomic

PLAN = ".released.json"  # in --out: the shards and the videos each holds
SPLIT_OF_BUNDLE = {"train": "train", "test": "test"}  # bundle -> the split its shards get
DEFAULT_VIDEOS_PER_SHARD = 4


@dataclass(frozen=True)
class Video:
    """One bundle entry, checked: where its features are, their size, and its class ids."""

    key: str  # the sample key: the video's name, made safe (no dots)
    features_file: Path
    shape: tuple[int, int]  # (features, frames) as stored
    labels: list[int]


@dataclass(frozen=True)
class Release:
    classes: list[str]
    feature_dim: int  # the feature size, the same for every video
    shards: dict[str, tuple[str, list[Video]]]  # by shard name: its split and videos


@dataclass(frozen=True)
class Imported:
    videos: int  # in the fold
    written: int  # shards written by this run
    skipped: int  # shards already there
    frames: int  # written by this run
    manifest: Manifest


def read_release(root: Path, fold: int, videos_per_shard: int) -> Release:
    """The fold's videos, every file checked (module docstring), grouped into shards; nothing
    is written."""
    if videos_per_shard < 1:
        raise ConfigError(f"--videos-per-shard {videos_per_shard}: must be >= 1")
    if not root.is_dir():
        raise ConfigError(f"--released {root}: no such folder")
    for sub in ("features", "groundTruth", "splits"):
        if not (root / sub).is_dir():
            raise ConfigError(f"--released {root}: no {sub}/ folder (MS-TCN's release layout)")
    bundles = {b: root / "splits" / f"{b}.split{fold}.bundle" for b in SPLIT_OF_BUNDLE}
    for path in bundles.values():
        if not path.is_file():
            folds = sorted(p.name for p in (root / "splits").glob("train.split*.bundle"))
            raise ConfigError(f"--fold {fold}: no {path} (there are {', '.join(folds) or 'none'})")
    if not (root / "mapping.txt").is_file():
        raise ConfigError(f"--released {root}: no mapping.txt")
    classes = read_mapping(root / "mapping.txt")
    ids = {name: i for i, name in enumerate(classes)}
    listed: dict[str, str] = {}  # video -> its bundle
    shards: dict[str, tuple[str, list[Video]]] = {}
    keys: dict[str, str] = {}
    size: tuple[Path, int] | None = None  # the first video's features file and size
    for bundle, path in bundles.items():
        split = SPLIT_OF_BUNDLE[bundle]
        videos = []
        for stem in read_video_list(path):
            if stem in listed:
                raise DataError(f"{path}: {stem} again (it is in {listed[stem]} already)")
            listed[stem] = path.name
            key = safe_stem(stem)
            if keys.setdefault(key, stem) != stem:
                raise DataError(f"{path}: {stem} and {keys[key]} make the same key {key}")
            video = _check_video(root, stem, key, ids, path)
            if size is None:
                size = (video.features_file, video.shape[0])
            elif video.shape[0] != size[1]:
                raise DataError(
                    f"{video.features_file}: {video.shape[0]} features a frame, but {size[0]} has "
                    f"{size[1]}: one feature size for every video"
                )
            videos.append(video)
        for i in range(0, len(videos), videos_per_shard):
            name = f"{split}-{i // videos_per_shard:06d}.tar"
            shards[name] = (split, videos[i : i + videos_per_shard])
    assert size is not None  # read_video_list refuses an empty bundle
    return Release(classes, size[1], shards)


def _check_video(root: Path, stem: str, key: str, ids: dict[str, int], bundle: Path) -> Video:
    features = root / "features" / f"{stem}.npy"
    truth = root / "groundTruth" / f"{stem}.txt"
    for path in (features, truth):
        if not path.is_file():
            raise DataError(f"{bundle} lists {stem}, but {path} is missing")
    lines = read_text(truth).splitlines()
    while lines and not lines[-1].strip():
        lines.pop()  # a trailing empty line
    labels = []
    for number, line in enumerate(lines, 1):
        name = line.strip()
        if name not in ids:
            what = "an empty line" if not name else f"class {name!r}"
            raise DataError(f"{truth} line {number}: {what} is not in {root / 'mapping.txt'}")
        labels.append(ids[name])
    if not labels:
        raise DataError(f"{truth}: no labels")
    shape = _array_shape(features)
    if shape[1] != len(labels):
        hint = " (is it stored (frames, features)?)" if shape[0] == len(labels) else ""
        raise DataError(
            f"{features}: {shape[1]} frames (of shape {shape}, features x frames), but {truth} "
            f"has {len(labels)} lines: they must be equal{hint}"
        )
    return Video(key, features, shape, labels)


def _array_shape(path: Path) -> tuple[int, int]:
    """The shape of a 2-D float ``.npy``, from its header (the data is mapped, not read)."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"{path}: not a .npy array ({npy_error(e)})") from None
    if not isinstance(array, np.ndarray):  # an .npz archive
        raise DataError(f"{path}: not a .npy array")
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.floating):
        raise DataError(
            f"{path}: {array.dtype} of shape {array.shape}, not 2-D float (features, frames)"
        )
    return int(array.shape[0]), int(array.shape[1])


def _plan(release: Release, fold: int, videos_per_shard: int) -> dict[str, Any]:
    return {
        "fold": fold,
        "videos_per_shard": videos_per_shard,
        "classes": release.classes,
        "features": release.feature_dim,
        "shards": {name: [v.key for v in videos] for name, (_, videos) in release.shards.items()},
    }


def _claim(out: Path, plan: dict[str, Any]) -> None:
    """``out`` for this plan: empty, or written by an import of the same plan."""
    out.mkdir(parents=True, exist_ok=True)
    record = out / PLAN
    if record.is_file():
        try:
            old = json.loads(record.read_text())
        except ValueError as e:
            raise DataError(f"{record}: {first_line(e)}; delete {out} and import again") from None
        if old != plan:
            changed = next((k for k in plan if old.get(k) != plan[k]), "shards")
            raise ConfigError(
                f"{out} holds an import with another {changed} ({record}): rerun with the "
                "original --fold and --videos-per-shard, or choose a new --out"
            )
        return
    if (out / "index.json").exists() or any(out.glob("*.tar")):
        raise ConfigError(
            f"{out} holds shards that this import did not write (no {PLAN}): choose an empty --out"
        )
    write_atomic(record, json.dumps(plan, indent=1) + "\n")


def import_release(
    root: Path, fold: int, out: Path, videos_per_shard: int = DEFAULT_VIDEOS_PER_SHARD
) -> Imported:
    """Write fold ``fold`` of the release ``root`` into ``out`` (module docstring)."""
    release = read_release(root, fold, videos_per_shard)
    _claim(out, _plan(release, fold, videos_per_shard))
    for stray in out.glob("*.tar.tmp"):  # a killed run's
        stray.unlink()
    todo = {n: s for n, s in release.shards.items() if not (out / n).exists()}
    frames = 0
    total = sum(len(v) for _, v in todo.values())
    with tqdm(total=total, unit="video", desc="import", disable=not total) as bar:
        for name, (_, videos) in todo.items():
            frames += _write_shard(out / name, videos, bar)
    shards = {}
    for name, (split, videos) in release.shards.items():
        try:
            samples, count, labels = shard_label_counts(out / name, len(release.classes))
        except (tarfile.TarError, OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(
                f"{out / name}: unreadable ({first_line(e)}): delete it and import again"
            ) from None
        if samples != len(videos):
            raise DataError(
                f"{out / name} holds {samples} videos, {out / PLAN} says {len(videos)}: delete "
                "it and import again"
            )
        shards[name] = ShardInfo(split, samples, count, labels)
    manifest = Manifest(
        release.classes, shards, feature_dim=release.feature_dim, path=out / "index.json"
    )
    backbone = f"released features: {root.resolve()}, fold {fold}"
    write_manifest(manifest.path, manifest, features=release.feature_dim, backbone=backbone)
    count = sum(len(v) for _, v in release.shards.values())
    return Imported(count, len(todo), len(release.shards) - len(todo), frames, manifest)


def _write_shard(path: Path, videos: list[Video], bar: tqdm) -> int:
    """One shard, written beside its name and renamed when whole; its frames."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        frames = _write_tar(tmp, videos, bar)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    return frames


def _write_tar(tmp: Path, videos: list[Video], bar: tqdm) -> int:
    frames = 0
    with open(tmp, "wb") as f:
        with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for video in videos:
                array = np.load(video.features_file, allow_pickle=False)
                if array.shape != video.shape:
                    raise DataError(f"{video.features_file}: changed while being imported")
                with np.errstate(over="ignore"):
                    half = np.ascontiguousarray(array.T, dtype=np.float16)  # (frames, features)
                if not np.isfinite(half).all():
                    raise DataError(
                        f"{video.features_file}: holds NaN, inf or values beyond float16's range "
                        "(65504), which the feature shards store"
                    )
                data = io.BytesIO()
                np.save(data, half, allow_pickle=False)
                add_member(tar, f"{video.key}.{FEATURES_MEMBER}", data.getvalue())
                labels = json.dumps({"labels": video.labels}).encode()
                add_member(tar, f"{video.key}.{LABELS_MEMBER}", labels)
                frames += len(video.labels)
                bar.update()
        f.flush()
        os.fsync(f.fileno())
    return frames


class StoredFeatures(nn.Module):
    """Stands in for the network that made stored features, where no model of distseq's makes
    them (I3D's): ``model.backbone.name=distseq.shard.released:StoredFeatures
    model.backbone.args={features: 2048}`` gives their size, all that a run with
    ``data.features=true`` asks of its backbone. It is never run."""

    def __init__(self, features: int) -> None:
        super().__init__()
        if not (isinstance(features, int) and features > 0):
            raise ValueError(f"features={features!r}: the stored feature size, an int > 0")
        self.feature_dim = features

    def forward(self, frames: Any) -> Any:
        raise ModelError(
            "distseq.shard.released:StoredFeatures makes no features: it is for data.features=true"
        )
