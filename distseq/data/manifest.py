"""The shard format (version 1) and its manifest, ``index.json``.

``distseq.data.synthetic`` and ``distseq shard`` both write it. A shard is a plain tar file. One
sample is one whole sequence (video) with key ``<key>``; the key must not contain a dot, because
member names are split at the first dot:

- ``<key>.000000.jpg``, ``<key>.000001.jpg``, ... one JPEG per frame, numbered 0..n-1, all of one
  size;
- ``<key>.labels.json`` = ``{"labels": [c0, c1, ...]}``, one class id per frame.

No other member is allowed; in particular pickled members (``.pyd``, ``.pickle``, ``.pth``) are
refused, never decoded. ``index.json`` beside the shards describes them::

    {"format": 1, "classes": ["name0", ...],
     "shards": {"train-000000.tar": {"split": "train", "samples": 8, "frames": 512}, ...}}

Each shard's ``"labels"`` (optional: index.json files from before it lack it) counts its frames
of each class id, one count per class, unlabelled frames (-1) left out; ``Manifest.label_counts``
sums them over shards, for class weights. ``distseq shard`` adds ``fps``, ``size`` and
``sources``; readers ignore keys they do not know.

Feature shards (``distseq features``, read with ``data.features=true``) hold, in place of the
frames, one member ``<key>.features.npy``: float16 of shape (frames, features), a plain ``.npy``
read with ``allow_pickle=False``. Their manifest adds ``"features": F`` (the feature size) and
``"backbone"`` (the model that made them)."""

from __future__ import annotations

import json
import re
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from distseq.config import DataConfig
from distseq.data.tar import expand, local_path, named
from distseq.errors import ConfigError, DataError, first_line
from distseq.files import write_atomic

FORMAT = 1
LABELS_MEMBER = "labels.json"  # a sample's labels, beside its frames
FEATURES_MEMBER = "features.npy"  # a feature shard's sample: float16 (frames, features)
FRAME_MEMBER_RE = re.compile(r"(\d{6})\.jpg")
SPLITS = ("train", "val", "test")  # the test split is for distseq eval --split test only
JPEG_QUALITY = 90  # of the frames distseq makes: distseq shard's default, the synthetic shards'


def frame_member(number: int) -> str:
    """A sample's member name (after ``<key>.``) for its frame ``number``, counted from 0."""
    return f"{number:06d}.jpg"


@dataclass
class ShardInfo:
    split: str  # one of SPLITS
    samples: int
    frames: int
    # Frames of each class id (unlabelled ones not counted); None: an index.json from before
    # distseq recorded them.
    labels: list[int] | None = None

    def to_json(self) -> dict[str, Any]:
        """Its entry in index.json (and in distseq shard's commit records)."""
        doc: dict[str, Any] = {"split": self.split, "samples": self.samples, "frames": self.frames}
        if self.labels is not None:
            doc["labels"] = self.labels
        return doc


def count_labels(labels: Iterable[int], counts: list[int]) -> list[int]:
    """Add one to ``counts[c]`` for each label c, leaving unlabelled frames (< 0) out; returns
    ``counts``. A label past the classes is refused."""
    for c in labels:
        if c >= len(counts):
            raise DataError(f"label {c} is not a class id of the {len(counts)} classes")
        if c >= 0:
            counts[c] += 1
    return counts


def shard_label_counts(path: Path, num_classes: int) -> tuple[int, int, list[int]]:
    """A shard's samples, frames and frames per class, read back from its ``labels.json``
    members (nothing else is read)."""
    samples, frames, counts = 0, 0, [0] * num_classes
    with tarfile.open(path) as tar:
        for member in tar:
            if member.name.endswith(f".{LABELS_MEMBER}"):
                f = tar.extractfile(member)
                assert f is not None
                labels = json.loads(f.read())["labels"]
                samples += 1
                frames += len(labels)
                count_labels(labels, counts)
    return samples, frames, counts


@dataclass
class Manifest:
    classes: list[str]
    shards: dict[str, ShardInfo]  # by shard file name (no directory)
    # How distseq shard made the frames (synthetic data has none of these): frames/s, square
    # size and JPEG quality, so that distseq predict can make a new video's frames the same way.
    fps: float | None = None
    size: int | None = None
    quality: int | None = None
    # Feature shards: the feature size (index.json's "features"); None: frame shards.
    feature_dim: int | None = None
    path: Path = Path("index.json")  # where it was read from or is written to

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def label_counts(self, names: Iterable[str]) -> list[int]:
        """Frames of each class id in the shards ``names`` (keys of ``shards``), summed: what
        class weights are computed from."""
        total = [0] * self.num_classes
        for name in names:
            info = self.shards.get(name)
            if info is None:
                raise DataError(f"{self.path} lists no shard {name!r}")
            if info.labels is None:
                raise DataError(
                    f"{self.path}: shard {name} has no label counts (made before distseq "
                    "recorded them): re-run the distseq shard or distseq features command that "
                    "wrote it, which adds them"
                )
            total = [a + b for a, b in zip(total, info.labels, strict=True)]
        return total


def write_manifest(path: Path, manifest: Manifest, **extra: Any) -> None:
    """Write ``index.json`` atomically; ``extra`` keys (``distseq shard``'s) come after."""
    shards = {name: info.to_json() for name, info in manifest.shards.items()}
    doc = {"format": FORMAT, "classes": manifest.classes, "shards": shards, **extra}
    write_atomic(path, json.dumps(doc, indent=1) + "\n")


def parse_manifest(doc: Any, where: str) -> Manifest:
    """A manifest from ``index.json``'s parsed JSON; ``where`` names it in errors."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DataError(f"manifest {where}: expected a JSON object with format={FORMAT}")
    classes = doc.get("classes")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        raise DataError(f"manifest {where}: 'classes' must be a non-empty list of strings")
    raw = doc.get("shards")
    if not isinstance(raw, dict):
        raise DataError(f"manifest {where}: 'shards' must be an object")
    shards = {}
    for name, info in raw.items():
        ok = (
            isinstance(info, dict)
            and info.get("split") in SPLITS
            and all(type(info.get(k)) is int and info[k] >= 0 for k in ("samples", "frames"))
        )
        if not ok:
            raise DataError(
                f"manifest {where}: shard {name!r} needs a split of {SPLITS}, samples and frames "
                ">= 0"
            )
        labels = info.get("labels")
        counts_ok = labels is None or (
            isinstance(labels, list)
            and len(labels) == len(classes)
            and all(type(n) is int and n >= 0 for n in labels)
            and sum(labels) <= info["frames"]
        )
        if not counts_ok:
            raise DataError(
                f"manifest {where}: shard {name!r}: 'labels' must be {len(classes)} counts >= 0 "
                f"(one per class, at most its {info['frames']} frames in all), not {_short(labels)}"
            )
        shards[name] = ShardInfo(info["split"], info["samples"], info["frames"], labels)
    fps, size, quality, features = (doc.get(k) for k in ("fps", "size", "quality", "features"))
    for key, value, kind in (
        ("fps", fps, int | float),
        ("size", size, int),
        ("quality", quality, int),
        ("features", features, int),
    ):
        if value is not None and not (isinstance(value, kind) and value > 0):
            raise DataError(f"manifest {where}: {key!r} must be a number > 0, not {value!r}")
    rate = None if fps is None else float(fps)
    return Manifest(list(classes), shards, rate, size, quality, features)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_manifest(cfg: DataConfig) -> Manifest:
    """Read ``cfg.manifest``, or ``index.json`` in the directory of the first train shard; its
    kind of shards (frames or features) must be the one ``data.features`` says."""
    manifest = find_manifest(cfg.train, cfg.manifest, "data.train")
    check_kind(manifest, cfg.features)
    return manifest


def check_kind(manifest: Manifest, features: bool) -> None:
    """Refuse frame shards where a model takes features (data.features), and the other way."""
    if features and manifest.feature_dim is None:
        raise ConfigError(
            f"data.features=true, but {manifest.path} describes frame shards; make feature "
            "shards with distseq features"
        )
    if not features and manifest.feature_dim is not None:
        raise ConfigError(
            f"{manifest.path} describes feature shards ({manifest.feature_dim} a frame), but "
            "data.features=false: a model trained on frames cannot read them"
        )


def _not_a_shard_folder(folder: Path, key: str, setting: str) -> str:
    """What a folder given as shards lacks: shards, or the index.json beside them."""
    tars = len(list(folder.glob("*.tar")))
    if not tars:
        return (
            f"{named(key)}: {folder} holds no shards (no .tar file and no index.json): make them "
            "with distseq shard"
        )
    return (
        f"{named(key)}: {folder} holds {tars} .tar files but no index.json: give them as "
        f"'{folder}/*.tar' with their manifest in {setting}"
    )


def find_manifest(urls: str, manifest: str, key: str, setting: str = "data.manifest") -> Manifest:
    """Read ``manifest``, or, if empty, ``index.json`` beside the first of the shards ``urls``
    (config key ``key``, or a command's argument, named in errors; ``setting``: what sets the
    manifest, named where it is needed)."""
    if manifest:
        path = Path(manifest)
    else:
        part = urls.split("::")[0]
        folder = local_path(part) if part else None  # "" is no folder: expand refuses it
        if folder is None or not folder.is_dir():  # else a shard folder (data.tar.expand)
            first = local_path(expand(part, key)[0])
            if first is None:
                raise ConfigError(
                    f"{named(key)}: remote shards ({urls}) need a manifest path ({setting})"
                )
            folder = first.parent
        elif not (folder / "index.json").exists():
            raise ConfigError(_not_a_shard_folder(folder, key, setting))
        path = folder / "index.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"manifest not found: {path} (set {setting})") from None
    except (OSError, ValueError) as e:
        raise DataError(f"manifest {path}: {first_line(e)}") from None
    return replace(parse_manifest(doc, str(path)), path=path)
