"""The training stream: endless, deterministic for its seed, the same on every resume.

The shard list is shuffled per epoch with a seed shared by all ranks. With at least world x
workers shards, each (rank, worker) slot reads its own slice of them; with fewer, every slot reads
all of them (cheap: nothing is decoded) and keeps every (world x workers)-th sample, so each epoch
is still split exactly once and no slot runs dry -> tar samples -> sample shuffle buffer -> every
``frame_stride``-th frame -> a random window of ``window`` frames -> augmentation drawn once per
window (``augment.py``) and applied to all its frames at their stored size -> resize to ``size``
x ``size`` -> batches padded to the longest window. Only the window's JPEGs are decoded; under a
sequence split (``part``), only this rank's part of them, but with on_error=skip. With
``length_buckets`` N, only windows of the same one of N equal-width length buckets over
1..window share a batch, so short windows are not padded to long ones.

Ordered mode (``ordered``): videos still come from the shuffle buffer, but each is cut into
consecutive windows of ``window`` frames (the last may be shorter). A worker keeps ``batch_size``
lanes: row b of its successive batches carries on one video window after window, and when the
video ends the lane takes the next one and sets ``Batch.starts[b]``. Augmentation is drawn once
per video. (The config refuses ``length_buckets`` here: a lane cannot wait for a bucket.)

DataLoader hands out batch i from worker i % workers, so ``Batch.worker`` = i % workers. Each
batch carries its worker's position after it (``Batch.position``: the RNG state, where the
worker's shards stand, byte offsets of the samples in its shuffle buffer, its pending windows or
lanes): a resumed run passes each worker's last position (:class:`Resume`), and the worker seeks
to those samples and goes on as the uninterrupted stream would, at the same cost at any step.
A position is about 8 KB; the shuffle buffer's samples are read again, a seek each.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import astuple, dataclass, field
from typing import Any

import torch

from distseq.config import DataConfig
from distseq.data import augment
from distseq.data.batch import Batch, Part, collate
from distseq.data.decode import Video, check_sample, decode, jpeg_size, stack
from distseq.data.loader import Stream, loader, on_error, worker_slot
from distseq.data.manifest import Manifest, load_manifest
from distseq.data.tar import Sample, check_shards_exist, expand, read_shard, shard_name
from distseq.errors import DataError


@dataclass
class _Window:
    """Frames [start, start + window) of a video, decoded when first needed."""

    video: Video
    start: int
    jpegs: list[tuple[int, bytes]]
    labels: list[int]
    params: augment.Params | None  # None: features, nothing to augment
    first: bool  # the first window of its video
    frames: torch.Tensor | list[torch.Tensor] | None = None  # decoded and augmented; features

    def decode(self, size: int, held: slice = slice(None)) -> torch.Tensor | list[torch.Tensor]:
        """Its frames in ``held`` (all of them by default), decoded and augmented; all of them
        are kept once decoded."""
        if self.frames is not None:
            return self.frames[held]
        assert self.params is not None  # frames: drawn with the window
        jpegs = self.jpegs[held]
        if not jpegs:  # a slice past this window's end (Part)
            return []
        decoded = decode(jpegs, self.video.where)
        height, width = decoded[0].shape[1:]
        frames: torch.Tensor | list[torch.Tensor] = decoded
        if not augment.changes_nothing(self.params, height, width, size):
            frames = augment.apply(stack(decoded), self.params, size)
        # Unchanged frames stay a list: no copy until the batch.
        if held == slice(None):
            self.frames = frames
        return frames


@dataclass
class _Lane:
    """Ordered mode: the video that one row of a worker's batches walks through."""

    video: Video
    params: augment.Params | None = None  # drawn with its first window; none for features
    start: int = 0  # of its next window


@dataclass
class _Cursor:
    """Where a (rank, worker) slot's samples stand: the next one is at byte ``offset`` (-1: none
    left) of shard ``shard`` of the slot's shards in epoch ``epoch``, after ``read`` samples."""

    epoch: int = 0
    shard: int = 0
    offset: int = 0
    read: int = 0


@dataclass(frozen=True)
class Resume:
    """Where a resumed stream starts: ``batches`` taken before (the workers' turns go on from
    there), and each stream worker's ``Batch.position`` after the last of them it made. A worker
    without one starts from the beginning (it made none of those batches)."""

    batches: int = 0
    positions: dict[int, dict[str, Any]] = field(default_factory=dict)
    # No usable positions (saved before them, or with other data.num_workers): the stream starts
    # anew, shuffled with this tag, so that it does not repeat the run's first batches.
    afresh: str = ""


def resume_problem(
    cfg: DataConfig, positions: dict[int, dict[str, Any]], batches: int
) -> str | None:
    """Why the saved stream ``positions`` cannot continue the stream exactly after ``batches``
    batches (None: they can): each worker that made one of them needs its position, taken over
    the same shards."""
    workers = max(1, cfg.num_workers)
    made = range(min(batches, workers))
    if any(w not in positions for w in made):
        return f"it holds no stream position for each of data.num_workers={cfg.num_workers}"
    shards = _shards_id(expand(cfg.train, "data.train", "train"))
    if any(positions[w]["shards"] != shards for w in made):
        return "data.train lists other shards than when it was saved"
    now = _shaping(cfg)
    changed = {k for w in made for k, v in positions[w]["data"].items() if now.get(k) != v}
    if changed:
        return f"{', '.join(f'data.{k}' for k in sorted(changed))} changed since it was saved"
    return None


# The data keys a position is laid out by (its lanes, windows and buffer): with another value
# it cannot be continued.
_SHAPING = ("window", "batch_size", "shuffle_buffer", "frame_stride", "length_buckets", "ordered")


def _shaping(cfg: DataConfig) -> dict[str, Any]:
    return {key: getattr(cfg, key) for key in _SHAPING}


def _params(values: list[Any] | None) -> augment.Params | None:
    return None if values is None else augment.Params(*values)


def _shards_id(urls: list[str]) -> str:
    """The shard list, by file name: a position names its shards by their index in it."""
    return hashlib.sha1("\n".join(map(shard_name, urls)).encode()).hexdigest()[:16]


class _TrainWorker:
    """One worker's share of a train stream: its samples, RNG, shuffle buffer, error policy and
    position."""

    def __init__(self, stream: _TrainStream, worker: int, workers: int) -> None:
        self.cfg, self.num_classes = stream.cfg, stream.num_classes
        self.feature_dim = stream.feature_dim
        self.urls, self.shards = stream.urls, _shards_id(stream.urls)
        self.index = {url: i for i, url in enumerate(stream.urls)}
        # A bad frame is found where it is decoded. Under a sequence split every rank of a group
        # must skip the same samples, so with on_error=skip each decodes every frame to check
        # them (and holds its part); with raise, a bad frame stops the run on whichever rank
        # decodes it, and each decodes its part alone.
        self.check_whole = stream.part is None or self.cfg.on_error == "skip"
        self.max_bad_run = stream.max_bad_run
        tag = stream.resume.afresh
        self.rng = random.Random(f"distseq-samples:{stream.seed}{tag}:{stream.rank}:{worker}")
        self.cursor = _Cursor()
        self.buffer: list[Sample] = []  # the shuffle buffer
        self.pending: dict[int, list[_Window]] = {}  # random windows, by length bucket
        self.lanes: list[_Lane | None] = [None] * self.cfg.batch_size  # ordered mode
        self.skipped: list[str] = []  # ids of bad samples since the previous batch
        self.bad_run = 0
        position = stream.resume.positions.get(worker)
        if position is not None:
            self._restore(position)
        self.source = stream.samples(worker, workers, self.cursor)

    def position(self) -> dict[str, Any]:
        """Where this worker stands between two batches, in what ``torch.load`` reads back with
        ``weights_only``: samples by (shard index, byte offset), nothing decoded."""
        return {
            "shards": self.shards,
            "data": _shaping(self.cfg),
            "rng": self.rng.getstate(),
            "cursor": list(astuple(self.cursor)),
            "buffer": [[self.index[s.url], s.offset] for s in self.buffer],
            "pending": [
                self._ref(w.video, w.start, w.params) for r in self.pending.values() for w in r
            ],
            "lanes": [
                None if ln is None else self._ref(ln.video, ln.start, ln.params)
                for ln in self.lanes
            ],
            "bad_run": self.bad_run,
        }

    def _ref(self, video: Video, start: int, params: augment.Params | None) -> list[Any]:
        url, offset = video.source
        return [self.index[url], offset, start, None if params is None else list(astuple(params))]

    def _restore(self, position: dict[str, Any]) -> None:
        """Back to ``position``: the samples it names are read again, a seek each."""
        version, state, gauss = position["rng"]
        self.rng.setstate((version, tuple(state), gauss))
        self.cursor = _Cursor(*position["cursor"])
        self.buffer = [self._sample(shard, offset) for shard, offset in position["buffer"]]
        for ref in position["pending"]:
            window = self._restored_window(ref)
            self.pending.setdefault(self._bucket(window), []).append(window)
        for b, ref in enumerate(position["lanes"]):
            if ref is not None:
                shard, offset, start, params = ref
                video = self._video(self._sample(shard, offset))
                self.lanes[b] = _Lane(video, _params(params), start)
        self.bad_run = position["bad_run"]

    def _sample(self, shard: int, offset: int) -> Sample:
        url = self.urls[shard]
        try:
            sample = next(read_shard(url, offset), None)
        except DataError:  # past its end now, or not at a header
            sample = None
        if sample is None or sample.offset != offset:
            raise DataError(
                f"shard {url}: no sample starts at byte {offset}, where the checkpoint's stream "
                "position has one: the shard was rewritten since"
            )
        return sample

    def _restored_window(self, ref: list[Any]) -> _Window:
        shard, offset, start, params = ref
        video = self._video(self._sample(shard, offset))
        window = self._window(video, start, _params(params))
        assert window is not None, "a window its position holds was good when it was saved"
        return window

    def batches(self) -> Iterator[list[_Window]]:
        return self._lanes() if self.cfg.ordered else self._buckets()

    def _buckets(self) -> Iterator[list[_Window]]:
        """A random window per video, batched in shuffle order within its length bucket."""
        cfg = self.cfg
        while True:
            video = self.video()
            start = self.rng.randint(0, max(0, len(video.labels) - cfg.window)) if cfg.window else 0
            window = self._window(video, start, None)
            if window is None:
                continue
            bucket = self._bucket(window)
            rows = self.pending.setdefault(bucket, [])
            rows.append(window)
            if len(rows) == cfg.batch_size:
                yield self.pending.pop(bucket)

    def _bucket(self, window: _Window) -> int:
        buckets = self.cfg.length_buckets
        return (len(window.labels) - 1) * buckets // self.cfg.window if buckets else 0

    def _lanes(self) -> Iterator[list[_Window]]:
        """Ordered mode: row b of each batch carries on lane b's video, window after window."""
        cfg = self.cfg
        while True:
            rows = []
            for b, lane in enumerate(self.lanes):
                while True:
                    if lane is None or lane.start >= len(lane.video.labels):
                        lane = _Lane(self.video())
                    window = self._window(lane.video, lane.start, lane.params)
                    if window is not None:
                        break
                    lane = None  # a bad frame: the rest of its video goes too
                lane.params, lane.start = window.params, lane.start + cfg.window
                self.lanes[b] = lane
                rows.append(window)
            yield rows

    def video(self) -> Video:
        """The next valid video in shuffle order."""
        while True:
            sample = self._next_sample()
            try:
                return self._video(sample)
            except DataError as e:
                self._fail(sample.id, e)

    def _next_sample(self) -> Sample:
        """A sample picked at random from the shuffle buffer, refilled to data.shuffle_buffer
        first: webdataset's shuffle (``initial`` = its size), with its contents in view."""
        while len(self.buffer) < self.cfg.shuffle_buffer:
            self.buffer.append(next(self.source))
        k = self.rng.randint(0, len(self.buffer) - 1)
        self.buffer[k], self.buffer[-1] = self.buffer[-1], self.buffer[k]
        return self.buffer.pop()

    def _video(self, sample: Sample) -> Video:
        return check_sample(sample, self.num_classes, self.cfg.frame_stride, self.feature_dim)

    def _window(self, video: Video, start: int, params: augment.Params | None) -> _Window | None:
        """The window at ``start``, with ``params`` or (None) a fresh draw; None if it is bad.
        Features are neither drawn for nor augmented."""
        cfg = self.cfg
        stop = start + (cfg.window or len(video.labels))
        jpegs = video.jpegs[start:stop]
        try:
            if params is None and video.features is None:
                size = jpeg_size(video.where, jpegs[0])
                params = augment.draw(cfg.augment, self.rng, *size)
            first = start == 0 or not cfg.ordered
            window = _Window(video, start, jpegs, video.labels[start:stop], params, first)
            if video.features is not None:
                window.frames = video.features[start:stop]
            if self.check_whole:
                window.decode(cfg.size)
        except DataError as e:
            self._fail(video.id, e)
            return None
        self.bad_run = 0
        return window

    def _fail(self, sample_id: str, error: DataError) -> None:
        on_error(self.cfg.on_error, error, sample_id, self.skipped)
        self.bad_run += 1
        # More bad samples in a row than the whole train set holds: nothing usable is left; give
        # up rather than spin forever and hang this rank.
        if self.bad_run > self.max_bad_run:
            raise DataError(
                f"skipped {self.bad_run} train samples in a row, no usable data left; last: {error}"
            )


class _TrainStream(Stream):
    def __init__(
        self,
        cfg: DataConfig,
        urls: list[str],
        manifest: Manifest,
        seed: int,
        rank: int,
        world: int,
        resume: Resume,
        part: Part | None,
    ) -> None:
        self.cfg, self.urls, self.num_classes = cfg, urls, manifest.num_classes
        self.feature_dim = manifest.feature_dim  # feature shards: the feature size
        self.seed, self.rank, self.world = seed, rank, world
        self.resume, self.part = resume, part
        total = sum(info.samples for info in manifest.shards.values() if info.split == "train")
        self.max_bad_run = max(total, 1)

    def samples(self, worker: int, workers: int, cursor: _Cursor) -> Iterator[Sample]:
        """The samples of one (rank, worker) slot from ``cursor`` on, forever, moving it past
        each before it is yielded; all slots split each epoch.

        The shard list is shuffled per epoch with the same seed on every rank, so the ranks'
        slices partition each epoch. The rank is fixed in the main process rather than re-read
        in the worker (as wds.split_by_node does, from env vars first), so the split and the RNG
        seeds cannot disagree. With at least as many shards as slots, each slot reads its own
        (order[rank::world][worker::workers]); with fewer, every slot reads them all and keeps
        every slots-th sample, counting over epochs, so each slot gets samples even if an epoch
        has fewer."""
        slots, slot = self.world * workers, self.rank + self.world * worker
        first, step, keep = (slot, slots, 1) if len(self.urls) >= slots else (0, 1, slots)
        while True:
            order = list(range(len(self.urls)))
            random.Random(f"distseq-shards:{self.seed}{self.resume.afresh}:{cursor.epoch}").shuffle(
                order
            )
            mine = order[first::step]
            whole, read = cursor.shard == cursor.offset == 0, cursor.read
            while cursor.shard < len(mine):
                for sample in read_shard(self.urls[mine[cursor.shard]], cursor.offset):
                    cursor.read += 1
                    cursor.offset = -1 if sample.cut else sample.end  # a cut sample comes last
                    if (cursor.read - 1) % keep == slot % keep:
                        yield sample
                cursor.shard, cursor.offset = cursor.shard + 1, 0
            if whole and cursor.read == read:  # an empty shard set would spin without yielding
                names = ", ".join(self.urls[i] for i in mine)
                raise DataError(f"train shards {names} hold no samples")
            cursor.epoch, cursor.shard = cursor.epoch + 1, 0

    def __iter__(self) -> Iterator[Batch]:
        loader_worker, workers = worker_slot()
        # DataLoader takes batch i from its worker i % workers, starting at worker 0. After
        # `batches` batches, worker j plays worker (j + batches) % workers of the uninterrupted
        # stream, from that one's position: batch i here is batch batches + i there.
        worker = (loader_worker + self.resume.batches) % workers
        state = _TrainWorker(self, worker, workers)
        size = self.cfg.size
        for windows in state.batches():
            skipped, state.skipped = state.skipped, []
            part = self.part
            held = part.held(max(len(w.labels) for w in windows)) if part else slice(None)
            rows = [(w.video.key, w.decode(size, held), w.labels, w.first) for w in windows]
            batch = collate(rows, size, skipped, worker, self.feature_dim, part)
            batch.position = state.position()
            yield batch


def train_batches(
    cfg: DataConfig,
    seed: int,
    rank: int = 0,
    world: int = 1,
    resume: Resume | None = None,
    part: Part | None = None,
) -> Iterator[Batch]:
    """Data-parallel rank ``rank`` of ``world``'s infinite stream of training batches;
    deterministic for (seed, rank, world, workers). ``part``: under a sequence split, this rank's
    part of every batch's frames, all it holds and decodes; the same batches otherwise.

    ``resume``: start where a stream stopped, from the positions its batches carried, so a
    resumed run gets the batches an uninterrupted one would (:func:`resume_problem` says whether
    positions can; a seek per sample they name, whatever the step).
    """
    resume = resume or Resume()
    if resume.batches < 0:
        raise ValueError(f"resume.batches={resume.batches}: must be >= 0")
    urls = expand(cfg.train, "data.train", "train")
    check_shards_exist(urls)
    manifest = load_manifest(cfg)
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank} of world={world}: must be in [0, world)")
    stream = _TrainStream(cfg, urls, manifest, seed, rank, world, resume, part)
    return loader(stream, cfg.num_workers)
