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

DataLoader hands out batch i from worker i % workers, so ``Batch.worker`` = i % workers. A resumed
run passes ``skip_batches`` (and the ids its skipped batches reported as bad): each worker then
reads, validates and draws from its RNGs exactly as before, but decodes only the samples that
were bad, until it has passed over its share of the skipped batches.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import torch
import webdataset as wds

from distseq.config import DataConfig
from distseq.data import augment
from distseq.data.batch import Batch, Part, collate
from distseq.data.decode import Video, check_sample, decode, jpeg_size, stack
from distseq.data.loader import Stream, loader, on_error, worker_slot
from distseq.data.manifest import Manifest, load_manifest
from distseq.data.tar import Sample, check_shards_exist, expand, read_shard
from distseq.errors import DataError


@dataclass
class _Window:
    """Frames [start, start + window) of a video, decoded when first needed."""

    key: str
    where: str
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
        decoded = decode(jpegs, self.where)
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


class _TrainWorker:
    """One worker's share of a train stream: its samples, RNG, error policy and fast-forward."""

    def __init__(self, stream: _TrainStream, worker: int, workers: int, todo: int) -> None:
        self.cfg, self.num_classes, self.bad = stream.cfg, stream.num_classes, stream.bad
        self.feature_dim = stream.feature_dim
        # A bad frame is found where it is decoded. Under a sequence split every rank of a group
        # must skip the same samples, so with on_error=skip each decodes every frame to check
        # them (and holds its part); with raise, a bad frame stops the run on whichever rank
        # decodes it, and each decodes its part alone.
        self.check_whole = stream.part is None or self.cfg.on_error == "skip"
        self.max_bad_run = stream.max_bad_run
        self.rng = random.Random(f"distseq-samples:{stream.seed}:{stream.rank}:{worker}")
        buf = self.cfg.shuffle_buffer
        shuffle = wds.shuffle(buf, initial=buf, rng=self.rng)
        self.samples: Iterator[Sample] = shuffle(stream.samples(worker, workers))
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
            video = self.video()
            start = self.rng.randint(0, max(0, len(video.labels) - cfg.window)) if cfg.window else 0
            window = self._window(video, start, None)
            if window is None:
                continue
            buckets = cfg.length_buckets
            bucket = (len(window.labels) - 1) * buckets // cfg.window if buckets else 0
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
                        lane = _Lane(self.video())
                    window = self._window(lane.video, lane.start, lane.params)
                    if window is not None:
                        break
                    lane = None  # a bad frame: the rest of its video goes too
                lane.params, lane.start = window.params, lane.start + cfg.window
                lanes[b] = lane
                rows.append(window)
            yield rows

    def video(self) -> Video:
        """The next valid video in shuffle order."""
        while True:
            sample = next(self.samples)
            try:
                return check_sample(
                    sample, self.num_classes, self.cfg.frame_stride, self.feature_dim
                )
            except DataError as e:
                self._fail(sample.id, e)

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
            window = _Window(video.key, video.where, jpegs, video.labels[start:stop], params, first)
            if video.features is not None:
                window.frames = video.features[start:stop]
            # Passing over batches, decode only the samples that were bad then, to see if they
            # are bad here: a window of a long video can be fine where another one was not.
            if (not self.todo and self.check_whole) or video.id in self.bad:
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
        skip: int,
        bad: frozenset[str],
        part: Part | None,
    ) -> None:
        self.cfg, self.urls, self.num_classes = cfg, urls, manifest.num_classes
        self.feature_dim = manifest.feature_dim  # feature shards: the feature size
        self.seed, self.rank, self.world = seed, rank, world
        self.skip, self.bad, self.part = skip, bad, part
        total = sum(info.samples for info in manifest.shards.values() if info.split == "train")
        self.max_bad_run = max(total, 1)

    def _epochs(self, first: int, step: int) -> Iterator[Sample]:
        """Samples of shards first, first + step, ... of each epoch's shard order, forever."""
        for epoch in itertools.count():
            order = list(self.urls)
            # Same seed on every rank, so the ranks' slices partition each epoch. The rank is
            # fixed in the main process rather than re-read in the worker (as wds.split_by_node
            # does, from env vars first), so the split and the RNG seeds cannot disagree.
            random.Random(f"distseq-shards:{self.seed}:{epoch}").shuffle(order)
            count = 0
            for url in order[first::step]:
                for sample in read_shard(url):
                    count += 1
                    yield sample
            if count == 0:  # an empty shard set would make this loop spin without yielding
                raise DataError(f"train shards {', '.join(order[first::step])} hold no samples")

    def samples(self, worker: int, workers: int) -> Iterator[Sample]:
        """The samples of one (rank, worker) slot, forever; all slots split each epoch."""
        slots, slot = self.world * workers, self.rank + self.world * worker
        if len(self.urls) >= slots:
            return self._epochs(slot, slots)  # = order[rank::world][worker::workers]
        # Fewer shards than slots: every slot reads them all and keeps every slots-th sample. The
        # count runs on over epochs, so each slot gets samples even if an epoch has fewer.
        return itertools.islice(self._epochs(0, 1), slot, None, slots)

    def __iter__(self) -> Iterator[Batch]:
        loader_worker, workers = worker_slot()
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
            part = self.part
            held = part.held(max(len(w.labels) for w in windows)) if part else slice(None)
            rows = [(w.key, w.decode(size, held), w.labels, w.first) for w in windows]
            yield collate(rows, size, skipped, worker, self.feature_dim, part)


def train_batches(
    cfg: DataConfig,
    seed: int,
    rank: int = 0,
    world: int = 1,
    skip_batches: int = 0,
    bad: Collection[str] = (),
    part: Part | None = None,
) -> Iterator[Batch]:
    """Data-parallel rank ``rank`` of ``world``'s infinite stream of training batches;
    deterministic for (seed, rank, world, workers). ``part``: under a sequence split, this rank's
    part of every batch's frames, all it holds and decodes; the same batches otherwise.

    ``skip_batches``: start right after the stream's first so many batches, which are read and
    drawn for but not decoded, so a resumed run gets the batches an uninterrupted one would.
    ``bad``: the ids in ``Batch.skipped`` of those batches; only these samples are decoded while
    passing over them, to find where they failed.
    """
    if skip_batches < 0:
        raise ValueError(f"skip_batches={skip_batches}: must be >= 0")
    urls = expand(cfg.train, "data.train", "train")
    check_shards_exist(urls)
    manifest = load_manifest(cfg)
    if not 0 <= rank < world:
        raise ValueError(f"rank={rank} of world={world}: must be in [0, world)")
    stream = _TrainStream(
        cfg, urls, manifest, seed, rank, world, skip_batches, frozenset(bad), part
    )
    return loader(stream, cfg.num_workers)
