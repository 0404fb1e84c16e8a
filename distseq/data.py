"""Long frame sequences from WebDataset tar shards, as padded, masked batches.

Shard format (version 1; ``distseq.synthetic`` and ``distseq shard`` both write it)
-----------------------------------------------------------------------------------
A shard is a plain tar file. One sample is one whole sequence (video) with key ``<key>``; the
key must not contain a dot, because member names are split at the first dot:

- ``<key>.000000.jpg``, ``<key>.000001.jpg``, ... one JPEG per frame, numbered 0..n-1, all of one
  size;
- ``<key>.labels.json`` = ``{"labels": [c0, c1, ...]}``, one class id per frame.

No other member is allowed; in particular pickled members (``.pyd``, ``.pickle``, ``.pth``) are
refused, never decoded. ``index.json`` beside the shards describes them::

    {"format": 1, "classes": ["name0", ...],
     "shards": {"train-000000.tar": {"split": "train", "samples": 8, "frames": 512}, ...}}

Pipeline
--------
train (infinite): the shard list is shuffled per epoch with a seed shared by all ranks. With at
least world x workers shards, each (rank, worker) slot reads its own slice of them; with fewer,
every slot reads all of them (cheap: nothing is decoded) and keeps every (world x workers)-th
sample, so each epoch is still split exactly once and no slot runs dry -> tar samples -> sample
shuffle buffer -> every ``frame_stride``-th frame -> a random window of ``frames`` frames ->
augmentation drawn once per window (``distseq.augment``) and applied to all its frames at their
stored size -> resize to ``size`` x ``size`` -> batches padded to the longest window. Only the
window's JPEGs are decoded. With ``length_buckets`` N, only windows of the same one of N
equal-width length buckets over 1..frames share a batch, so short windows are not padded to long
ones.

ordered train mode (``ordered``): videos still come from the shuffle buffer, but each is cut into
consecutive windows of ``frames`` frames (the last may be shorter). A worker keeps ``batch_size``
lanes: row b of its successive batches carries on one video window after window, and when the
video ends the lane takes the next one and sets ``Batch.starts[b]``. Augmentation is drawn once
per video. (The config refuses ``length_buckets`` here: a lane cannot wait for a bucket.)

DataLoader hands out batch i from worker i % workers, so ``Batch.worker`` = i % workers. A resumed
run passes ``skip_batches`` (and the ids its skipped batches reported as bad): each worker then
reads, validates and draws from its RNGs exactly as before, but decodes only the samples that
were bad, until it has passed over its share of the skipped batches.

val (finite): every rank reads all val shards in order and keeps sample i when i % world == rank;
full sequences (every ``frame_stride``-th frame), no augmentation; the number of batches is
computed from ``index.json`` and topped up with fully masked batches so every rank yields the
same count.

Bad samples, a shard cut off mid-way included, raise :class:`DataError` (one line naming shard
and sample), or, with ``on_error=skip``, are logged and reported in ``Batch.skipped`` (training
counts them in its ``skipped_samples`` metric). Shard-level problems (a missing or unreadable
shard, a bad ``index.json``) always raise.
"""

from __future__ import annotations

import io
import itertools
import json
import logging
import random
import re
import tarfile
import traceback
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2.functional import resize

from distseq import augment, sharedmem
from distseq.config import ConfigError, DataConfig, OnError

if TYPE_CHECKING:
    from typing import Self

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


def _unset_starts() -> torch.Tensor:
    return torch.ones(0, dtype=torch.bool)


@dataclass
class Batch:
    frames: torch.Tensor  # uint8 [B, T, 3, H, W], stored channels last; normalised per chunk
    labels: torch.Tensor  # int64 [B, T]; IGNORE_INDEX where padded
    mask: torch.Tensor  # bool [B, T]; True on real frames
    keys: list[str] = field(default_factory=list)  # sample keys; "" for padding rows
    # "<shard file name>/<sample key>" of the samples this worker skipped since its previous
    # batch (on_error=skip)
    skipped: list[str] = field(default_factory=list)
    # bool [B]: True where the row's window is the first of its video, so an RNN that carries its
    # state from batch to batch must reset it. Left out: all True, as outside ordered mode.
    starts: torch.Tensor = field(default_factory=_unset_starts)
    worker: int = 0  # the worker stream that made it; train batch i comes from worker i % workers
    segment: tuple[int, int] = (-1, -1)  # (loader worker, shared-memory segment) frames are in

    def __post_init__(self) -> None:
        if self.starts.numel() == 0:
            self.starts = torch.ones(self.frames.shape[0], dtype=torch.bool)

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        return replace(
            self,
            frames=fn(self.frames),
            labels=fn(self.labels),
            mask=fn(self.mask),
            starts=fn(self.starts),
        )

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:  # called by DataLoader(pin_memory=True)
        return self._map(torch.Tensor.pin_memory)


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
        return Path(re.sub("^file://?", "", url))  # as webdataset opens it: file:///abs
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


def _shard_name(url: str) -> str:
    return Path(urlparse(url).path).name


@dataclass
class _Sample:
    """One sample of a shard as read: member bytes by extension, nothing decoded."""

    url: str
    key: str
    members: dict[str, bytes]
    cut: str = ""  # the shard is cut off inside this sample: the error message

    @property
    def id(self) -> str:
        return f"{_shard_name(self.url)}/{self.key}"

    @property
    def where(self) -> str:
        return f"shard {self.url} sample {self.key}"


# Missing from typeshed: the header error that an all-zero block, the end-of-archive mark, raises.
_END_OF_ARCHIVE: type[Exception] = tarfile.EOFHeaderError  # type: ignore[attr-defined]


class _TarInfo(tarfile.TarInfo):
    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> Self:
        try:
            return super().fromtarfile(tar)
        except tarfile.HeaderError as e:
            # TarFile.next() takes any bad header after the first, a cut-off one included, for
            # the end of the archive; remember which it was.
            if isinstance(tar, _Tar):
                tar.end = e
            raise


class _Tar(tarfile.TarFile):
    tarinfo = _TarInfo
    end: Exception | None = None  # why the member list ended
    members: list[tarfile.TarInfo]  # TarFile's own, missing from typeshed


def _read_shard(url: str) -> Iterator[_Sample]:
    """The samples of one shard, read lazily. A sample's members are consecutive and named
    ``<key>.<ext>``. If the shard is cut off, the sample it ends in comes last, marked ``cut``."""
    sample: _Sample | None = None
    try:
        with wds.gopen(url, "rb") as stream, _Tar.open(fileobj=stream, mode="r|*") as tar:
            for info in tar:
                tar.members = []  # a stream is read once: keep no index of its members
                if not info.isreg():
                    continue
                head, slash, name = info.name.rpartition("/")
                stem, _, ext = name.partition(".")
                if sample is None or head + slash + stem != sample.key:
                    if sample is not None:
                        yield sample
                    sample = _Sample(url, head + slash + stem, {})
                if ext.lower() in sample.members:
                    raise DataError(f"{sample.where}: member {info.name} appears twice")
                member = tar.extractfile(info)
                assert member is not None  # a regular file
                sample.members[ext.lower()] = member.read()
            if not isinstance(tar.end, _END_OF_ARCHIVE):
                raise tarfile.ReadError("no end-of-archive mark")
    except (OSError, EOFError, tarfile.TarError) as e:  # IO, tar and decompression errors
        if isinstance(e.__context__, GeneratorExit):
            return  # closed before the end, and the pipe: command complained: nothing is lost
        if sample is None:
            raise DataError(f"shard {url}: cannot read: {_read_error(e)}") from None
        sample.cut = f"{sample.where}: the shard is cut off in this sample: {_read_error(e)}"
    if sample is not None:
        yield sample


# curl's exit codes for the failures a shard URL meets (webdataset opens http(s) with curl).
_CURL_EXITS = {6: "host not found", 7: "connection refused", 22: "HTTP error", 28: "timed out"}


def _read_error(error: BaseException) -> str:
    """One readable line: webdataset reports a failed ``pipe:`` or curl command as the repr of
    its arguments and its Pipe object."""
    status = re.search(r"exit (\d+) \((?:read|write)\)", str(error))
    if status is None:
        return _first_line(error)
    code = int(status[1])
    curl = f" ({_CURL_EXITS[code]})" if "'curl'" in str(error) and code in _CURL_EXITS else ""
    return f"the command exited with status {code}{curl}"


@dataclass
class _Video:
    """A valid sample, every ``frame_stride``-th frame of it."""

    key: str
    id: str
    where: str
    jpegs: list[tuple[int, bytes]]  # (stored frame number, JPEG)
    labels: list[int]


def _video(sample: _Sample, num_classes: int, stride: int) -> _Video:
    """Validate a sample (cheap: nothing is decoded) and keep every ``stride``-th frame."""
    if sample.cut:
        raise DataError(sample.cut)
    key, where = sample.key, sample.where
    jpegs: dict[int, bytes] = {}
    labels_json = None
    for name, value in sample.members.items():
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
    kept = range(0, n, stride)
    return _Video(key, sample.id, where, [(i, jpegs[i]) for i in kept], labels[::stride])


def _bad_jpeg(where: str, number: int, error: Exception) -> DataError:
    # torchvision prefixes libjpeg's message with its own source location; drop that.
    reason = re.sub(r"^.*\.cpp:\d+, ", "", _first_line(error))
    return DataError(f"{where}: frame {number:06d}.jpg is not a valid JPEG: {reason}")


def _jpeg_size(where: str, jpeg: tuple[int, bytes]) -> tuple[int, int]:
    """(height, width) from the JPEG header alone."""
    number, data = jpeg
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.height, img.width
    except (OSError, SyntaxError, ValueError) as e:
        raise _bad_jpeg(where, number, e) from None


def _decode(
    jpegs: list[tuple[int, bytes]], where: str, size: int | None = None
) -> list[torch.Tensor]:
    """Frames as uint8 [3, H, W] each: resized to ``size`` x ``size``, or, with no size, all at
    the stored size of the first, which the others must share.

    Channels last in memory, as libjpeg writes them: copying into channels-first costs more
    than half the decode, and resizing is 3x faster this way. Not stacked: where nothing else
    changes them, the frames are copied once, straight into the batch.
    """
    out: list[torch.Tensor] = []
    for number, data in jpegs:
        try:
            img = decode_jpeg(
                torch.frombuffer(bytearray(data), dtype=torch.uint8), ImageReadMode.RGB
            )
        except (RuntimeError, ValueError) as e:
            raise _bad_jpeg(where, number, e) from None
        if size is not None and img.shape[-2:] != (size, size):
            img = resize(img, [size, size], antialias=True)
        if out and img.shape != out[0].shape:
            raise DataError(
                f"{where}: frame {number:06d}.jpg is {img.shape[1]}x{img.shape[2]}, frame "
                f"{jpegs[0][0]:06d}.jpg {out[0].shape[1]}x{out[0].shape[2]}"
            )
        out.append(img)
    return out


def _stack(frames: list[torch.Tensor]) -> torch.Tensor:
    """[T, 3, H, W], channels last in memory like the frames."""
    hwc = torch.empty((len(frames), *frames[0].shape[1:], 3), dtype=torch.uint8)
    out = hwc.permute(0, 3, 1, 2)
    for i, frame in enumerate(frames):
        out[i] = frame
    return out


def _on_error(on_error: OnError, error: DataError, sample_id: str, skipped: list[str]) -> None:
    """Apply the error policy: re-raise, or log the bad sample and note its id."""
    if on_error != OnError.skip:
        raise error
    log.warning("skipping bad sample: %s", error)
    skipped.append(sample_id)


# key, frames ([T, 3, S, S] or T of [3, S, S]), labels, starts a video
_Row = tuple[str, torch.Tensor | list[torch.Tensor], list[int], bool]


def _collate(rows: list[_Row], size: int, skipped: list[str], worker: int) -> Batch:
    """Pad to the longest sequence in the batch; padding is masked out and ignored by the loss.
    With no rows, a batch that only carries skipped ids home from a worker; never yielded."""
    length = max((len(y) for _, _, y, _ in rows), default=1)
    # Channels last like the decoded frames; in a worker, in a shared-memory segment it reuses.
    hwc, segment = sharedmem.uint8_buffer((len(rows), length, size, size, 3))
    frames = hwc.permute(0, 1, 4, 2, 3)
    labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.int64)
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for b, (_, x, y, _) in enumerate(rows):
        if isinstance(x, torch.Tensor):
            frames[b, : len(y)] = x
        else:
            for t, frame in enumerate(x):
                frames[b, t] = frame
        frames[b, len(y) :] = 0
        labels[b, : len(y)] = torch.tensor(y, dtype=torch.int64)
        mask[b, : len(y)] = True
    starts = torch.tensor([start for *_, start in rows], dtype=torch.bool)
    keys = [row[0] for row in rows]
    return Batch(frames, labels, mask, keys, skipped, starts, worker, segment)


@dataclass
class _Window:
    """Frames [start, start + frames) of a video, decoded when first needed."""

    key: str
    where: str
    jpegs: list[tuple[int, bytes]]
    labels: list[int]
    params: augment.Params
    first: bool  # the first window of its video
    frames: torch.Tensor | list[torch.Tensor] | None = None  # decoded and augmented

    def decode(self, size: int) -> torch.Tensor | list[torch.Tensor]:
        if self.frames is None:
            frames = _decode(self.jpegs, self.where)
            height, width = frames[0].shape[1:]
            if augment.changes_nothing(self.params, height, width, size):
                self.frames = frames  # nothing to change: no copy until the batch
            else:
                self.frames = augment.apply(_stack(frames), self.params, size)
        return self.frames


@dataclass
class _Lane:
    """Ordered mode: the video that one row of a worker's batches walks through."""

    video: _Video
    params: augment.Params | None = None  # drawn with its first window
    start: int = 0  # of its next window


class _TrainWorker:
    """One worker's share of a train stream: its samples, RNG, error policy and fast-forward."""

    def __init__(self, stream: _TrainStream, worker: int, workers: int, todo: int) -> None:
        self.cfg, self.num_classes, self.bad = stream.cfg, stream.num_classes, stream.bad
        self.max_bad_run = stream.max_bad_run
        self.rng = random.Random(f"distseq-samples:{stream.seed}:{stream.rank}:{worker}")
        buf = self.cfg.shuffle_buffer
        shuffle = wds.shuffle(buf, initial=buf, rng=self.rng)
        self.samples: Iterator[_Sample] = shuffle(stream.samples(worker, workers))
        self.todo = todo  # batches still to pass over undecoded
        self.skipped: list[str] = []  # ids of bad samples since the previous batch
        self.bad_run = 0

    def batches(self) -> Iterator[list[_Window]]:
        return self._lanes() if self.cfg.ordered else self._buckets()

    def _buckets(self) -> Iterator[list[_Window]]:
        """A random window per video, batched in shuffle order within its length bucket."""
        cfg = self.cfg
        pending: dict[int, list[_Window]] = {}
        while True:
            video = self._video()
            start = self.rng.randint(0, max(0, len(video.labels) - cfg.frames))
            window = self._window(video, start, None)
            if window is None:
                continue
            bucket = (len(window.labels) - 1) * cfg.length_buckets // cfg.frames
            rows = pending.setdefault(bucket, [])
            rows.append(window)
            if len(rows) == cfg.batch_size:
                yield pending.pop(bucket)

    def _lanes(self) -> Iterator[list[_Window]]:
        """Ordered mode: row b of each batch carries on lane b's video, window after window."""
        cfg = self.cfg
        lanes: list[_Lane | None] = [None] * cfg.batch_size
        while True:
            rows = []
            for b, lane in enumerate(lanes):
                while True:
                    if lane is None or lane.start >= len(lane.video.labels):
                        lane = _Lane(self._video())
                    window = self._window(lane.video, lane.start, lane.params)
                    if window is not None:
                        break
                    lane = None  # a bad frame: the rest of its video goes too
                lane.params, lane.start = window.params, lane.start + cfg.frames
                lanes[b] = lane
                rows.append(window)
            yield rows

    def _video(self) -> _Video:
        """The next valid video in shuffle order."""
        while True:
            sample = next(self.samples)
            try:
                return _video(sample, self.num_classes, self.cfg.frame_stride)
            except DataError as e:
                self._fail(sample.id, e)

    def _window(self, video: _Video, start: int, params: augment.Params | None) -> _Window | None:
        """The window at ``start``, with ``params`` or (None) a fresh draw; None if it is bad."""
        cfg = self.cfg
        stop = start + cfg.frames
        jpegs = video.jpegs[start:stop]
        try:
            if params is None:
                size = _jpeg_size(video.where, jpegs[0])
                params = augment.draw(cfg.augment, self.rng, *size)
            first = start == 0 or not cfg.ordered
            window = _Window(video.key, video.where, jpegs, video.labels[start:stop], params, first)
            # Passing over batches, decode only the samples that were bad then, to see if they
            # are bad here: a window of a long video can be fine where another one was not.
            if not self.todo or video.id in self.bad:
                window.decode(cfg.size)
        except DataError as e:
            self._fail(video.id, e)
            return None
        self.bad_run = 0
        return window

    def _fail(self, sample_id: str, error: DataError) -> None:
        _on_error(self.cfg.on_error, error, sample_id, self.skipped)
        self.bad_run += 1
        # More bad samples in a row than the whole train set holds: nothing usable is left; give
        # up rather than spin forever and hang this rank.
        if self.bad_run > self.max_bad_run:
            raise DataError(
                f"skipped {self.bad_run} train samples in a row, no usable data left; last: {error}"
            )


class _TrainStream(IterableDataset[Batch]):
    def __init__(
        self,
        cfg: DataConfig,
        urls: list[str],
        manifest: Manifest,
        seed: int,
        rank: int,
        world: int,
        skip: int,
        bad: frozenset[str],
    ) -> None:
        self.cfg, self.urls, self.num_classes = cfg, urls, manifest.num_classes
        self.seed, self.rank, self.world = seed, rank, world
        self.skip, self.bad = skip, bad
        self.pools: sharedmem.Pools | None = None  # set by _loader
        total = sum(info.samples for info in manifest.shards.values() if info.split == "train")
        self.max_bad_run = max(total, 1)

    def _epochs(self, first: int, step: int) -> Iterator[_Sample]:
        """Samples of shards first, first + step, ... of each epoch's shard order, forever."""
        for epoch in itertools.count():
            order = list(self.urls)
            # Same seed on every rank, so the ranks' slices partition each epoch. The rank is
            # fixed in the main process rather than re-read in the worker (as wds.split_by_node
            # does, from env vars first), so the split and the RNG seeds cannot disagree.
            random.Random(f"distseq-shards:{self.seed}:{epoch}").shuffle(order)
            count = 0
            for url in order[first::step]:
                for sample in _read_shard(url):
                    count += 1
                    yield sample
            if count == 0:  # an empty shard set would make this loop spin without yielding
                raise DataError(f"train shards {', '.join(order[first::step])} hold no samples")

    def samples(self, worker: int, workers: int) -> Iterator[_Sample]:
        """The samples of one (rank, worker) slot, forever; all slots split each epoch."""
        slots, slot = self.world * workers, self.rank + self.world * worker
        if len(self.urls) >= slots:
            return self._epochs(slot, slots)  # = order[rank::world][worker::workers]
        # Fewer shards than slots: every slot reads them all and keeps every slots-th sample. The
        # count runs on over epochs, so each slot gets samples even if an epoch has fewer.
        return itertools.islice(self._epochs(0, 1), slot, None, slots)

    def __iter__(self) -> Iterator[Batch]:
        loader_worker, workers = _worker()
        # DataLoader takes batch i from its worker i % workers, starting at worker 0. After
        # `skip` batches, worker j plays worker (j + skip) % workers of the uninterrupted stream
        # and passes over that one's share of them: batch i here is batch skip + i there.
        worker = (loader_worker + self.skip) % workers
        state = _TrainWorker(self, worker, workers, (self.skip - worker + workers - 1) // workers)
        size = self.cfg.size
        for windows in state.batches():
            skipped, state.skipped = state.skipped, []
            if state.todo:
                state.todo -= 1
                continue
            rows = [(w.key, w.decode(size), w.labels, w.first) for w in windows]
            yield _collate(rows, size, skipped, worker)


class _ValStream(IterableDataset[Batch]):
    def __init__(
        self, cfg: DataConfig, urls: list[str], num_classes: int, total: int, rank: int, world: int
    ) -> None:
        self.cfg, self.urls, self.num_classes = cfg, urls, num_classes
        self.total, self.rank, self.world = total, rank, world
        self.pools: sharedmem.Pools | None = None  # set by _loader

    def __iter__(self) -> Iterator[Batch]:
        cfg = self.cfg
        worker, workers = _worker()
        rows: list[_Row] = []
        skipped: list[str] = []
        index, cut = 0, False
        for url in self.urls:
            for sample in _read_shard(url):
                # Every worker of every rank reads every sample (cheap: no decoding) so that the
                # global index, and with it the rank/worker split, is the same everywhere.
                mine = index % self.world == self.rank and (index // self.world) % workers == worker
                index += 1
                cut = cut or bool(sample.cut)
                if not mine:
                    continue
                try:
                    video = _video(sample, self.num_classes, cfg.frame_stride)
                    frames = _decode(video.jpegs, video.where, cfg.size)
                except DataError as e:
                    _on_error(cfg.on_error, e, sample.id, skipped)
                    continue
                rows.append((video.key, frames, video.labels, True))
                if len(rows) == cfg.batch_size:
                    yield _collate(rows, cfg.size, skipped, worker)
                    rows, skipped = [], []
        # A cut-off shard holds fewer samples than index.json says (the cut one was reported).
        if index > self.total or (index < self.total and not cut):
            raise DataError(
                f"val shards {self.urls[0]}... hold {index} samples, index.json says {self.total}"
            )
        if rows or skipped:
            yield _collate(rows, cfg.size, skipped, worker)


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


def _loader(dataset: _TrainStream | _ValStream, num_workers: int) -> Iterator[Batch]:
    """Run the stream in DataLoader workers, with one-line errors."""
    pools = dataset.pools = sharedmem.Pools.for_workers(num_workers) if num_workers else None
    loader = DataLoader(
        dataset, batch_size=None, num_workers=num_workers, pin_memory=torch.cuda.is_available()
    )
    batches = iter(loader)
    try:
        for batch in batches:
            if pools is not None and batch.segment[0] >= 0:
                if not batch.frames.is_pinned():  # pinning for the GPU made a copy already
                    batch = replace(batch, frames=batch.frames.clone())
                pools.release(*batch.segment)
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


def train_batches(
    cfg: DataConfig, seed: int, skip_batches: int = 0, bad: Collection[str] = ()
) -> Iterator[Batch]:
    """This rank's infinite stream of training batches; deterministic for (seed, rank, workers).

    ``skip_batches``: start right after the stream's first so many batches, which are read and
    drawn for but not decoded, so a resumed run gets the batches an uninterrupted one would.
    ``bad``: the ids in ``Batch.skipped`` of those batches; only these samples are decoded while
    passing over them, to find where they failed.
    """
    if skip_batches < 0:
        raise ValueError(f"skip_batches={skip_batches}: must be >= 0")
    urls = _expand(cfg.train, "data.train")
    _check_shards_exist(urls)
    manifest = load_manifest(cfg)
    rank, world = _rank_world()
    stream = _TrainStream(cfg, urls, manifest, seed, rank, world, skip_batches, frozenset(bad))
    return _loader(stream, cfg.num_workers)


def val_batches(cfg: DataConfig, manifest: Manifest) -> Iterator[Batch]:
    """This rank's share of the val set, full sequences; the same batch count on every rank."""
    if not cfg.val:
        return iter(())
    urls = _expand(cfg.val, "data.val")
    _check_shards_exist(urls)
    total = 0
    for url in urls:
        info = manifest.shards.get(_shard_name(url))
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
