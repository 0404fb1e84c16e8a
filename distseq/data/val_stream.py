"""The validation stream: every video once, whole, split across ranks, in lockstep.

Every rank reads all val shards in order and keeps sample i when i % world == rank; full
sequences (every ``frame_stride``-th frame), no augmentation. The number of batches is computed
from ``index.json`` and topped up with fully masked batches, so every rank yields the same count
and none waits alone in a collective.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from distseq.config import DataConfig
from distseq.data.batch import Batch, Part, Row, collate, empty_batch
from distseq.data.decode import Video, check_sample, decode
from distseq.data.loader import Stream, loader, on_error, worker_slot
from distseq.data.manifest import Manifest
from distseq.data.tar import check_shards_exist, expand, read_shard, shard_name
from distseq.errors import DataError


class _ValStream(Stream):
    def __init__(
        self,
        cfg: DataConfig,
        urls: list[str],
        manifest: Manifest,
        total: int,
        rank: int,
        world: int,
        part: Part | None,
    ) -> None:
        self.cfg, self.urls, self.num_classes = cfg, urls, manifest.num_classes
        self.feature_dim = manifest.feature_dim  # feature shards: the feature size
        self.total, self.rank, self.world, self.part = total, rank, world, part

    def __iter__(self) -> Iterator[Batch]:
        cfg = self.cfg
        worker, workers = worker_slot()
        videos: list[tuple[Video, torch.Tensor | list[torch.Tensor] | None]] = []
        skipped: list[str] = []
        index, cut = 0, False
        for url in self.urls:
            for sample in read_shard(url):
                # Every worker of every rank reads every sample (cheap: no decoding) so that the
                # global index, and with it the rank/worker split, is the same everywhere.
                mine = index % self.world == self.rank and (index // self.world) % workers == worker
                index += 1
                cut = cut or bool(sample.cut)
                if not mine:
                    continue
                try:
                    video = check_sample(
                        sample, self.num_classes, cfg.frame_stride, self.feature_dim
                    )
                    frames: torch.Tensor | list[torch.Tensor] | None = video.features
                    # Decoded in part, at the batch, where a bad frame stops the run anyway
                    # (train_stream's check_whole).
                    if frames is None and (self.part is None or cfg.on_error == "skip"):
                        frames = decode(video.jpegs, video.where, cfg.size)
                except DataError as e:
                    on_error(cfg.on_error, e, sample.id, skipped)
                    continue
                videos.append((video, frames))
                if len(videos) == cfg.batch_size:
                    yield self._batch(videos, skipped, worker)
                    videos, skipped = [], []
        # A cut-off shard holds fewer samples than index.json says (the cut one was reported).
        if index > self.total or (index < self.total and not cut):
            raise DataError(
                f"val shards {self.urls[0]}... hold {index} samples, index.json says {self.total}"
            )
        if videos or skipped:
            yield self._batch(videos, skipped, worker)

    def _batch(
        self,
        videos: list[tuple[Video, torch.Tensor | list[torch.Tensor] | None]],
        skipped: list[str],
        worker: int,
    ) -> Batch:
        """The videos' batch: each one's frames, or, under a sequence split, this rank's part
        of them, decoded here unless they were already."""
        part, size = self.part, self.cfg.size
        held = part.held(max(len(v.labels) for v, _ in videos)) if part and videos else slice(None)
        rows: list[Row] = [
            (
                video.key,
                decode(video.jpegs[held], video.where, size) if frames is None else frames[held],
                video.labels,
                True,
            )
            for video, frames in videos
        ]
        return collate(rows, size, skipped, worker, self.feature_dim, part)


def _val_batch_count(total: int, world: int, workers: int, batch_size: int) -> int:
    """Batches the busiest rank yields: each worker batches its own share separately."""
    counts = []
    for rank in range(world):
        n_rank = max(0, (total - rank + world - 1) // world)
        n_workers = [max(0, (n_rank - w + workers - 1) // workers) for w in range(workers)]
        counts.append(sum((n + batch_size - 1) // batch_size for n in n_workers))
    return max(counts)


def val_batches(
    cfg: DataConfig, manifest: Manifest, rank: int = 0, world: int = 1, part: Part | None = None
) -> Iterator[Batch]:
    """Data-parallel rank ``rank`` of ``world``'s share of the val set, full sequences; the same
    batch count on every rank. ``part``: under a sequence split, this rank's part of every
    batch's frames, all it holds and decodes."""
    if not cfg.val:
        return iter(())
    urls = expand(cfg.val, "data.val", "val")
    check_shards_exist(urls)
    total = 0
    for url in urls:
        info = manifest.shards.get(shard_name(url))
        if info is None:
            raise DataError(f"val shard {url} is not listed in index.json")
        total += info.samples
    workers = max(1, cfg.num_workers)
    stream = _ValStream(cfg, urls, manifest, total, rank, world, part)
    count = _val_batch_count(total, world, workers, cfg.batch_size)
    return _padded(
        loader(stream, cfg.num_workers), count, empty_batch(cfg.size, manifest.feature_dim, part)
    )


def _padded(batches: Iterator[Batch], count: int, empty: Batch) -> Iterator[Batch]:
    done = 0
    for batch in batches:
        done += 1
        yield batch
    for _ in range(count - done):
        yield empty
