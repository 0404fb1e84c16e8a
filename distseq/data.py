"""Long frame sequences from WebDataset tar shards, as padded, masked batches.

Shard format (version 1; ``distseq.synthetic`` and ``distseq shard`` both write it)
-----------------------------------------------------------------------------------
A shard is a plain tar file. One sample is one whole sequence (video) with key ``<key>``; the
key must not contain a dot, because webdataset splits member names at the first dot:

- ``<key>.000000.jpg``, ``<key>.000001.jpg``, ... one JPEG per frame, numbered 0..n-1;
- ``<key>.labels.json`` = ``{"labels": [c0, c1, ...]}``, one class id per frame.

No other member is allowed; in particular pickled members (``.pyd``, ``.pickle``, ``.pth``) are
refused, never decoded. ``index.json`` beside the shards describes them::

    {"format": 1, "classes": ["name0", ...],
     "shards": {"train-000000.tar": {"split": "train", "samples": 8, "frames": 512}, ...}}

Pipeline
--------
train (infinite): shard list shuffled per epoch with a seed shared by all ranks -> this rank's
shards -> this worker's shards -> tar samples (webdataset) -> sample shuffle buffer -> random
window of ``frames`` frames (only the window's JPEGs are decoded) -> batches padded to the
longest sequence. val (finite): every rank reads all val shards in order and keeps sample i when
i % world == rank; full sequences; the number of batches is computed from ``index.json`` and
topped up with fully masked batches so every rank yields the same count.

Bad samples raise :class:`DataError` (one line naming shard and sample), or, with
``on_error=skip``, are logged and counted: see :func:`skipped_samples`. Shard-level problems (a
missing or unreadable shard, a bad ``index.json``) always raise.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import re
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist
import webdataset as wds
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2.functional import resize

from distseq.config import ConfigError, DataConfig, OnError

log = logging.getLogger(__name__)

FORMAT = 1
IGNORE_INDEX = -100
_FRAME_RE = re.compile(r"(\d{6})\.jpg")


def _first_line(text: object) -> str:
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


class DataError(ValueError):
    """Bad data; the message is one line that names the shard, sample or file at fault."""

    def __init__(self, message: str) -> None:
        # DataLoader re-raises a worker's exception as type(e)(whole traceback); the traceback's
        # last line is "...DataError: <original message>", so keep just that.
        if "\n" in message:
            last = [line for line in message.splitlines() if line.strip()][-1]
            message = last.split("DataError: ", 1)[-1]
        super().__init__(message)


@dataclass
class Batch:
    frames: torch.Tensor  # uint8 [B, T, 3, H, W]; the model normalises per chunk
    labels: torch.Tensor  # int64 [B, T]; IGNORE_INDEX where padded
    mask: torch.Tensor  # bool [B, T]; True on real frames
    keys: list[str] = field(default_factory=list)  # sample keys; "" for padding rows
    skipped: int = 0  # samples this worker skipped since its previous batch (on_error=skip)

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        return Batch(
            self.frames.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
            self.mask.to(device, non_blocking=non_blocking),
            self.keys,
            self.skipped,
        )

    def pin_memory(self) -> Batch:  # called by DataLoader(pin_memory=True)
        return Batch(
            self.frames.pin_memory(),
            self.labels.pin_memory(),
            self.mask.pin_memory(),
            self.keys,
            self.skipped,
        )


@dataclass
class ShardInfo:
    split: str  # "train" or "val"
    samples: int
    frames: int


@dataclass
class Manifest:
    classes: list[str]
    shards: dict[str, ShardInfo]  # by shard file name (no directory)

    @property
    def num_classes(self) -> int:
        return len(self.classes)


# Samples skipped under on_error=skip, summed in the main process over every stream so far.
_skipped = 0


def skipped_samples() -> int:
    """How many bad samples this process's train and val streams have skipped so far."""
    return _skipped


def write_manifest(manifest: Manifest, path: Path) -> None:
    shards = {name: vars(info) for name, info in manifest.shards.items()}
    doc = {"format": FORMAT, "classes": manifest.classes, "shards": shards}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def _parse_manifest(doc: Any, where: str) -> Manifest:
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
            and info.get("split") in ("train", "val")
            and all(type(info.get(k)) is int and info[k] >= 0 for k in ("samples", "frames"))
        )
        if not ok:
            raise DataError(
                f"manifest {where}: shard {name!r} needs split train|val, samples and frames >= 0"
            )
        shards[name] = ShardInfo(info["split"], info["samples"], info["frames"])
    return Manifest(classes=list(classes), shards=shards)


def _expand(urls: str, key: str) -> list[str]:
    expanded = wds.shardlists.expand_urls(urls) if urls else []
    if not expanded:
        raise ConfigError(f"config key {key}: empty, no shards given")
    return expanded


def _local_path(url: str) -> Path | None:
    parsed = urlparse(url)
    if parsed.scheme == "":
        return Path(url)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return None  # pipe:, http:, ...: webdataset opens these; errors surface when read


def _check_shards_exist(urls: list[str]) -> None:
    for url in urls:
        path = _local_path(url)
        if path is not None and not path.is_file():
            raise DataError(f"shard not found: {url}")


def load_manifest(cfg: DataConfig) -> Manifest:
    """Read ``cfg.manifest``, or ``index.json`` in the directory of the first train shard."""
    if cfg.manifest:
        path = Path(cfg.manifest)
    else:
        first = _local_path(_expand(cfg.train, "data.train")[0])
        if first is None:
            raise ConfigError(
                f"config key data.manifest: must be set for remote shards ({cfg.train})"
            )
        path = first.parent / "index.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"manifest not found: {path} (set data.manifest)") from None
    except (OSError, ValueError) as e:
        raise DataError(f"manifest {path}: {_first_line(e)}") from None
    return _parse_manifest(doc, str(path))


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _worker() -> tuple[int, int]:
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def _read_shard(url: str) -> Iterator[dict[str, Any]]:
    """Raw webdataset samples of one shard (member name -> bytes), read lazily."""
    try:
        yield from wds.tarfile_samples([{"url": url}])
    except Exception as e:  # tarfile, IO and webdataset errors: name the shard, keep one line
        raise DataError(f"shard {url}: cannot read: {_first_line(e)}") from None


def _where(sample: dict[str, Any]) -> str:
    return f"shard {sample['__url__']} sample {sample['__key__']}"


def _members(sample: dict[str, Any], num_classes: int) -> tuple[list[bytes], list[int]]:
    """Validate a raw sample; return its JPEG bytes in frame order and its labels."""
    key = sample["__key__"]
    where = _where(sample)
    jpegs: dict[int, bytes] = {}
    labels_json = None
    for name, value in sample.items():
        if name.startswith("__"):  # webdataset's own bookkeeping (__key__, __url__, ...)
            continue
        if name == "labels.json":
            labels_json = value
            continue
        match = _FRAME_RE.fullmatch(name)
        if match is None:
            raise DataError(
                f"{where}: member {key}.{name} is not allowed (only NNNNNN.jpg and labels.json)"
            )
        jpegs[int(match[1])] = value
    if labels_json is None:
        raise DataError(f"{where}: missing member {key}.labels.json")
    n = len(jpegs)
    if n == 0 or max(jpegs) != n - 1:
        raise DataError(f"{where}: frames must be numbered 000000..{n - 1:06d} without gaps")
    try:
        labels = json.loads(labels_json)["labels"]
    except (ValueError, TypeError, KeyError) as e:
        raise DataError(f"{where}: {key}.labels.json is not {{'labels': [...]}}: {e}") from None
    if not isinstance(labels, list) or not all(type(x) is int for x in labels):
        raise DataError(f"{where}: {key}.labels.json 'labels' must be a list of integers")
    if len(labels) != n:
        raise DataError(f"{where}: {len(labels)} labels for {n} frames")
    bad = [x for x in labels if not 0 <= x < num_classes]
    if bad:
        raise DataError(f"{where}: label {bad[0]} outside the {num_classes} manifest classes")
    return [jpegs[i] for i in range(n)], labels


def _decode(jpegs: list[bytes], first: int, size: int, where: str) -> torch.Tensor:
    out = torch.empty((len(jpegs), 3, size, size), dtype=torch.uint8)
    for i, data in enumerate(jpegs):
        try:
            img = decode_jpeg(
                torch.frombuffer(bytearray(data), dtype=torch.uint8), ImageReadMode.RGB
            )
        except (RuntimeError, ValueError) as e:
            name = f"{first + i:06d}.jpg"
            # torchvision prefixes libjpeg's message with its own source location; drop that.
            reason = re.sub(r"^.*\.cpp:\d+, ", "", _first_line(e))
            raise DataError(f"{where}: frame {name} is not a valid JPEG: {reason}") from None
        if img.shape[-2:] != (size, size):
            img = resize(img, [size, size], antialias=True)
        out[i] = img
    return out


_Item = tuple[str, torch.Tensor, list[int]]  # key, frames uint8 [T, 3, S, S], labels


def _collate(items: list[_Item], size: int, skipped: int) -> Batch:
    """Pad to the longest sequence in the batch; padding is masked out and ignored by the loss."""
    length = max(len(labels) for _, _, labels in items)
    frames = torch.zeros((len(items), length, 3, size, size), dtype=torch.uint8)
    labels = torch.full((len(items), length), IGNORE_INDEX, dtype=torch.int64)
    mask = torch.zeros((len(items), length), dtype=torch.bool)
    for b, (_, x, y) in enumerate(items):
        frames[b, : len(y)] = x
        labels[b, : len(y)] = torch.tensor(y, dtype=torch.int64)
        mask[b, : len(y)] = True
    return Batch(frames, labels, mask, [key for key, _, _ in items], skipped)


def _skip_marker(skipped: int, size: int) -> Batch:
    """A zero-row batch that only carries a skip count home from a worker; never yielded."""
    return Batch(
        torch.zeros((0, 1, 3, size, size), dtype=torch.uint8),
        torch.zeros((0, 1), dtype=torch.int64),
        torch.zeros((0, 1), dtype=torch.bool),
        [],
        skipped,
    )


class _Batcher:
    """Groups items into batches and carries the skip count of the samples in between."""

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self.items: list[_Item] = []
        self.skipped = 0

    def add(self, item: _Item) -> Batch | None:
        self.items.append(item)
        return self.flush() if len(self.items) == self.cfg.batch_size else None

    def skip(self, error: DataError) -> None:
        """Apply the error policy: re-raise, or log and count the bad sample."""
        if self.cfg.on_error != OnError.skip:
            raise error
        log.warning("skipping bad sample: %s", error)
        self.skipped += 1

    def flush(self) -> Batch:
        batch = (
            _collate(self.items, self.cfg.size, self.skipped)
            if self.items
            else _skip_marker(self.skipped, self.cfg.size)
        )
        self.items, self.skipped = [], 0
        return batch


class _TrainStream(IterableDataset[Batch]):
    def __init__(
        self, cfg: DataConfig, urls: list[str], manifest: Manifest, seed: int, rank: int, world: int
    ) -> None:
        self.cfg, self.urls, self.num_classes = cfg, urls, manifest.num_classes
        self.seed, self.rank, self.world = seed, rank, world
        # Skipping more bad samples in a row than the whole train set holds means nothing usable
        # is left; give up rather than spin forever and hang this rank.
        total = sum(info.samples for info in manifest.shards.values() if info.split == "train")
        self.max_bad_run = max(total, 1)

    def _samples(self, worker: int, workers: int) -> Iterator[dict[str, Any]]:
        """Raw samples of this worker's shards, epoch after epoch, forever."""
        for epoch in itertools.count():
            order = list(self.urls)
            # Same seed on every rank, so the ranks' slices partition the shards each epoch. The
            # rank is fixed in the main process rather than re-read in the worker (as
            # wds.split_by_node does, from env vars first), so the split, the shard-count check
            # and the RNG seeds below cannot disagree.
            random.Random(f"distseq-shards:{self.seed}:{epoch}").shuffle(order)
            mine = order[self.rank :: self.world][worker::workers]
            count = 0
            for url in mine:
                for sample in _read_shard(url):
                    count += 1
                    yield sample
            if count == 0:  # an empty shard set would make this loop spin without yielding
                raise DataError(f"train shards {', '.join(mine)} hold no samples")

    def __iter__(self) -> Iterator[Batch]:
        cfg = self.cfg
        worker, workers = _worker()
        rng = random.Random(f"distseq-samples:{self.seed}:{self.rank}:{worker}")
        buf = cfg.shuffle_buffer
        samples = wds.shuffle(buf, initial=buf, rng=rng)(self._samples(worker, workers))
        batcher = _Batcher(cfg)
        bad_run = 0
        for sample in samples:
            try:
                item = self._window(sample, rng)
            except DataError as e:
                batcher.skip(e)
                bad_run += 1
                if bad_run > self.max_bad_run:
                    msg = (
                        f"skipped {bad_run} train samples in a row, no usable data left; last: {e}"
                    )
                    raise DataError(msg) from None
                continue
            bad_run = 0
            batch = batcher.add(item)
            if batch is not None:
                yield batch

    def _window(self, sample: dict[str, Any], rng: random.Random) -> _Item:
        """A random window of at most ``frames`` frames; only its JPEGs are decoded."""
        jpegs, labels = _members(sample, self.num_classes)
        start = rng.randint(0, max(0, len(labels) - self.cfg.frames))
        stop = start + self.cfg.frames
        frames = _decode(jpegs[start:stop], start, self.cfg.size, _where(sample))
        return sample["__key__"], frames, labels[start:stop]


class _ValStream(IterableDataset[Batch]):
    def __init__(
        self, cfg: DataConfig, urls: list[str], num_classes: int, total: int, rank: int, world: int
    ) -> None:
        self.cfg, self.urls, self.num_classes = cfg, urls, num_classes
        self.total, self.rank, self.world = total, rank, world

    def __iter__(self) -> Iterator[Batch]:
        cfg = self.cfg
        worker, workers = _worker()
        batcher = _Batcher(cfg)
        index = 0
        for url in self.urls:
            for sample in _read_shard(url):
                # Every worker of every rank reads every sample (cheap: no decoding) so that the
                # global index, and with it the rank/worker split, is the same everywhere.
                mine = index % self.world == self.rank and (index // self.world) % workers == worker
                index += 1
                if not mine:
                    continue

                try:
                    jpegs, labels = _members(sample, self.num_classes)
                    frames = _decode(jpegs, 0, cfg.size, _where(sample))
                except DataError as e:
                    batcher.skip(e)
                    continue
                batch = batcher.add((sample["__key__"], frames, labels))
                if batch is not None:
                    yield batch
        if index != self.total:
            raise DataError(
                f"val shards {self.urls[0]}... hold {index} samples, index.json says {self.total}"
            )
        if batcher.items or batcher.skipped:
            yield batcher.flush()


def _val_batch_count(total: int, world: int, workers: int, batch_size: int) -> int:
    """Batches the busiest rank yields: each worker batches its own share separately."""
    counts = []
    for rank in range(world):
        n_rank = max(0, (total - rank + world - 1) // world)
        n_workers = [max(0, (n_rank - w + workers - 1) // workers) for w in range(workers)]
        counts.append(sum((n + batch_size - 1) // batch_size for n in n_workers))
    return max(counts)


def _empty_batch(size: int) -> Batch:
    """One fully masked frame: keeps a rank in lockstep with ranks that still have data."""
    return Batch(
        torch.zeros((1, 1, 3, size, size), dtype=torch.uint8),
        torch.full((1, 1), IGNORE_INDEX, dtype=torch.int64),
        torch.zeros((1, 1), dtype=torch.bool),
        [""],
    )


def _loader(dataset: IterableDataset[Batch], num_workers: int) -> Iterator[Batch]:
    """Run the stream in DataLoader workers; add skip counts up here, in the main process."""
    global _skipped
    loader = DataLoader(
        dataset, batch_size=None, num_workers=num_workers, pin_memory=torch.cuda.is_available()
    )
    batches = iter(loader)
    try:
        for batch in batches:
            _skipped += batch.skipped
            if batch.frames.shape[0] > 0:
                yield batch
        return
    except DataError as e:
        message = str(e)
        # A worker's error comes back through a reference cycle (exception -> traceback ->
        # frames -> exception) that holds the DataLoader iterator; freed by a later garbage
        # collection, its workers then take ~5 s to stop. Clear the frames and drop the iterator
        # so they stop now, then raise a fresh one-line error.
        traceback.clear_frames(e.__traceback__)
    del batches, loader
    raise DataError(message)


def train_batches(cfg: DataConfig, seed: int) -> Iterator[Batch]:
    """This rank's infinite stream of training batches; deterministic for (seed, rank, workers)."""
    urls = _expand(cfg.train, "data.train")
    _check_shards_exist(urls)
    manifest = load_manifest(cfg)
    rank, world = _rank_world()
    needed = world * max(1, cfg.num_workers)
    if len(urls) < needed:
        raise DataError(
            f"data.train has {len(urls)} shards but {world} ranks x {max(1, cfg.num_workers)} "
            f"workers need at least {needed} (one per worker); write more, smaller shards"
        )
    stream = _TrainStream(cfg, urls, manifest, seed, rank, world)
    return _loader(stream, cfg.num_workers)


def val_batches(cfg: DataConfig, manifest: Manifest) -> Iterator[Batch]:
    """This rank's share of the val set, full sequences; the same batch count on every rank."""
    if not cfg.val:
        return iter(())
    urls = _expand(cfg.val, "data.val")
    _check_shards_exist(urls)
    total = 0
    for url in urls:
        info = manifest.shards.get(Path(urlparse(url).path).name)
        if info is None:
            raise DataError(f"val shard {url} is not listed in index.json")
        total += info.samples
    rank, world = _rank_world()
    workers = max(1, cfg.num_workers)
    stream = _ValStream(cfg, urls, manifest.num_classes, total, rank, world)
    count = _val_batch_count(total, world, workers, cfg.batch_size)
    return _padded(_loader(stream, cfg.num_workers), count, cfg.size)


def _padded(batches: Iterator[Batch], count: int, size: int) -> Iterator[Batch]:
    done = 0
    for batch in batches:
        done += 1
        yield batch
    for _ in range(count - done):
        yield _empty_batch(size)
