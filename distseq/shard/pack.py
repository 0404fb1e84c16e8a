"""Packing encoded videos into shards, crash-safe: commit records, resume, and index.json.

Layout of ``--out``::

    train-000000.tar, val-000000.tar, ...  finished shards; only ever created by os.replace
    index.json                              the manifest of distseq.data.manifest plus "fps",
                                            "size", "sources"
    .done/options.json                      the options that fix what a sample holds
    .done/<first shard>.json                commit records: a group of shards and their videos
    .work/                                  one temporary tar per video, made by the workers

Workers encode whole videos into ``.work/<stem>.tar``; the main process packs them, in sorted
stem order, into ``NAME.tar.tmp`` and renames each shard when it is full. Shards hold whole
videos (a new shard starts when the next video would push the open one past
``--max-shard-bytes``), except that a video larger than that fills shards of its own, split
between samples. Whenever a shard closes at a video boundary, one record in ``.done`` commits the
shards closed since the last record together with the videos they hold, so a shard never holds
part of an uncommitted video. A re-run skips committed videos, deletes what a killed run left
(``*.tmp``, ``.work``, final-named shards that no record lists) and numbers new shards after the
committed ones. Videos in the shard that was open when a run died are encoded again. index.json
is rebuilt from all commit records, so it also lists videos committed by earlier runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import logging
import os
import re
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distseq.data.manifest import (
    LABELS_MEMBER,
    SPLITS,
    Manifest,
    ShardInfo,
    count_labels,
    shard_label_counts,
    write_manifest,
)
from distseq.data.sources import Source
from distseq.errors import ConfigError, DataError
from distseq.files import write_atomic
from distseq.shard.encode import file_sha256, source_bytes

log = logging.getLogger(__name__)

SHARD_RE = re.compile(r"(train|val|test)-(\d{6})\.tar")


def _span(m: tarfile.TarInfo) -> int:
    """Bytes a member takes in a tar: header(s) plus data padded to 512-byte blocks."""
    return m.offset_data - m.offset + -(-m.size // 512) * 512


def _samples(tar: tarfile.TarFile) -> list[list[tarfile.TarInfo]]:
    samples: list[list[tarfile.TarInfo]] = []
    key = None
    for m in tar.getmembers():
        if m.name.split(".", 1)[0] != key:
            key = m.name.split(".", 1)[0]
            samples.append([])
        samples[-1].append(m)
    return samples


class Packer:
    """Packs whole videos into one split's shards and commits them in groups (module docstring);
    counts each shard's frames of each of ``num_classes`` class ids from the labels it packs."""

    def __init__(
        self, out: Path, split: str, index: int, max_bytes: float, num_classes: int
    ) -> None:
        self.out, self.split, self.index, self.max_bytes = out, split, index, max_bytes
        self.num_classes = num_classes
        self.file: io.BufferedWriter | None = None
        self.tar: tarfile.TarFile | None = None
        self.info = self._new_info()
        self.bytes = 0
        self.group: dict[str, ShardInfo] = {}  # shards closed since the last commit
        self.sources: dict[str, dict[str, Any]] = {}  # videos held by the group and the open shard
        self.shards_written = 0
        self.frames_written = 0

    def _name(self) -> str:
        return f"{self.split}-{self.index:06d}.tar"

    def _new_info(self) -> ShardInfo:
        return ShardInfo(self.split, 0, 0, [0] * self.num_classes)

    def add(self, tar_path: Path, stem: str, source: dict[str, Any]) -> None:
        with tarfile.open(tar_path) as src:
            samples = _samples(src)
            sizes = [sum(_span(m) for m in members) for members in samples]
            if self.tar is not None and self.bytes + sum(sizes) > self.max_bytes:
                self._close_shard()
                self._commit()
            for members, size in zip(samples, sizes, strict=True):
                if self.tar is not None and self.bytes + size > self.max_bytes:
                    self._close_shard()  # this video alone fills shards: commit after its end
                tar = self.tar or self._open_shard()
                for m in members:
                    data = src.extractfile(m)
                    if m.name.endswith(f".{LABELS_MEMBER}") and data is not None:
                        assert self.info.labels is not None
                        count_labels(json.loads(data.read())["labels"], self.info.labels)
                        data.seek(0)
                    tar.addfile(m, data)
                self.bytes += size
                self.info.samples += 1
                self.info.frames += len(members) - 1  # all but labels.json
        self.sources[stem] = source
        tar_path.unlink()

    def _open_shard(self) -> tarfile.TarFile:
        # Stays open across calls of add(): closed by _close_shard() or discard().
        self.file = open(self.out / (self._name() + ".tmp"), "wb")  # noqa: SIM115
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.USTAR_FORMAT)  # noqa: SIM115
        return self.tar

    def _close_shard(self) -> None:
        assert self.tar is not None and self.file is not None
        self.tar.close()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        name = self._name()
        os.replace(self.out / (name + ".tmp"), self.out / name)
        self.group[name] = self.info
        self.shards_written += 1
        self.frames_written += self.info.frames
        self.tar, self.file = None, None
        self.info, self.bytes, self.index = self._new_info(), 0, self.index + 1

    def _commit(self) -> None:
        if not self.group:
            return
        record = {
            "shards": {name: info.to_json() for name, info in self.group.items()},
            "sources": self.sources,
        }
        write_atomic(self.out / ".done" / f"{min(self.group)}.json", json.dumps(record, indent=1))
        self.group, self.sources = {}, {}

    def close(self) -> None:
        if self.tar is not None:
            self._close_shard()
        self._commit()

    def discard(self) -> None:
        """After a failure: drop the open shard; its videos are redone by the next run."""
        if self.tar is not None and self.file is not None:
            self.tar.close()
            self.file.close()
            (self.out / (self._name() + ".tmp")).unlink()
            self.tar = None


def _read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
        shards = {name: ShardInfo(**info) for name, info in record["shards"].items()}
        sources = dict(record["sources"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise DataError(f"{path}: bad commit record ({e}); delete it to redo its videos") from None
    return {"shards": shards, "sources": sources}


@contextlib.contextmanager
def claim(out: Path, settings: dict[str, Any]) -> Iterator[None]:
    """Hold --out for this run: refuse another writer, foreign shards and changed options."""
    out.mkdir(parents=True, exist_ok=True)
    done = out / ".done"
    options = done / "options.json"
    if not options.is_file() and (
        (out / "index.json").exists() or any(SHARD_RE.fullmatch(p.name) for p in out.iterdir())
    ):
        raise ConfigError(
            f"{out} holds shards that distseq shard did not write there (no .done/options.json): "
            "choose an empty --out"
        )
    done.mkdir(exist_ok=True)
    with open(done / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{out}: another distseq shard is writing there") from None
        # Options may change until something is committed under them.
        if options.is_file() and any(done.glob("*.tar.json")):
            old = json.loads(options.read_text())
            for key, value in settings.items():
                if old.get(key) != value:
                    raise ConfigError(
                        f"{out} was written with {key}={old.get(key)!r}, not {value!r}: "
                        "rerun with the original options, or choose a new --out"
                    )
        else:
            write_atomic(options, json.dumps(settings, indent=1))
        yield


def read_commits(out: Path) -> list[dict[str, Any]]:
    """The valid commit records of --out; deletes whatever a killed run left besides them."""
    done = out / ".done"
    records = []
    for path in sorted(done.glob("*.tar.json")):
        record = _read_record(path)
        missing = [name for name in record["shards"] if not (out / name).is_file()]
        if missing:
            log.warning("%s is missing: redoing the videos of %s", out / missing[0], path)
            path.unlink()
            continue
        records.append(record)
    keep = {name for record in records for name in record["shards"]}
    for folder in (out, done):
        for path in folder.iterdir():
            stale = SHARD_RE.fullmatch(path.name) and path.name not in keep
            if path.is_file() and (stale or path.name.endswith(".tmp")):
                path.unlink()
    shutil.rmtree(out / ".work", ignore_errors=True)
    return records


def check_unchanged(source: Source, label_file: Path, record: dict[str, Any], split: str) -> None:
    """A committed video must still be what its shards hold: sharding it again would duplicate."""
    if record["split"] != split:
        raise ConfigError(
            f"{source.stem} was written to {record['split']}, this run puts it in {split}: "
            "rerun with the original inputs, --val and --seed, or choose a new --out"
        )
    what = "since it was sharded; restore it or choose a new --out"
    if record["bytes"] != source_bytes(source):
        raise DataError(f"{source.path}: changed {what}")
    if record["labels_sha256"] != file_sha256(label_file):
        raise DataError(f"{label_file}: changed {what}")


def next_indices(records: list[dict[str, Any]]) -> dict[str, int]:
    """Per split, the number after the highest committed shard."""
    next_index = dict.fromkeys(SPLITS, 0)
    for record in records:
        for name in record["shards"]:
            match = SHARD_RE.fullmatch(name)
            if match is None:
                raise DataError(f"{name}: not a shard name in a commit record of distseq shard")
            next_index[match[1]] = max(next_index[match[1]], int(match[2]) + 1)
    return next_index


def write_index(
    out: Path,
    classes: list[str],
    fps: float,
    size: int,
    quality: int,
    records: list[dict[str, Any]],
) -> None:
    """index.json from all commit records, so it lists the videos of earlier runs too. The label
    counts of shards committed before distseq recorded them are read back from the shards."""
    shards = {name: info for r in records for name, info in r["shards"].items()}
    for name, info in shards.items():
        if info.labels is None:
            info.labels = shard_label_counts(out / name, len(classes))[2]
    sources = {stem: rec for r in records for stem, rec in r["sources"].items()}
    manifest = Manifest(classes, dict(sorted(shards.items())))
    # fps, size and quality let distseq predict make a video's frames exactly as these were made.
    extra = {"fps": fps, "size": size, "quality": quality, "sources": dict(sorted(sources.items()))}
    write_manifest(out / "index.json", manifest, **extra)
