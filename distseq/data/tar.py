"""Reading shards: URLs, lazily streamed tar samples, and a shard cut off mid-file.

A sample's members are consecutive and named ``<key>.<ext>`` (``format.py``); nothing here
decodes them. Tar readers stop silently at a cut-off header, taking it for the end of the
archive; ``read_shard`` tells the two apart and marks the sample a cut falls in.
"""

from __future__ import annotations

import glob
import io
import json
import re
import tarfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING
from urllib.parse import urlparse

import webdataset as wds

from distseq.config import is_remote
from distseq.errors import ConfigError, DataError, first_line

if TYPE_CHECKING:
    from typing import Self


# Of a shard folder: every shard its index.json lists, as predict and features read it.
EVERY_SPLIT = "*"


def named(key: str) -> str:
    """How an error names where shards were given: a config key (``data.train``), else a
    command's argument or option (``INPUT``, ``--split``)."""
    return f"config key {key}" if "." in key else key


def expand(urls: str, key: str, split: str = "") -> list[str]:
    """The shard URLs that ``urls`` (config key or option ``key``, named in errors) gives, in
    order; several ``::``-joined, each a brace pattern (``shards/train-{000000..000099}.tar``,
    as webdataset expands it), a glob of local files (``shards/train-*.tar``, in name order), or
    a shard folder, whose ``index.json`` says which of its shards are ``split``'s (all of them
    for :data:`EVERY_SPLIT`)."""
    expanded: list[str] = []
    for part in urls.split("::") if urls else []:
        if not part:
            raise ConfigError(f"{named(key)}: {urls!r} has an empty part between its ::")
        path = local_path(part)
        if path is not None and path.is_dir():
            expanded += _folder(path, key, split)
            continue
        for url in wds.shardlists.expand_urls(part):  # braces first: {a,b}-*.tar
            path = local_path(url)
            if path is None or path.exists() or not any(c in url for c in "*?["):
                expanded.append(url)  # a file whose name has [ or * is itself
                continue
            found = sorted(glob.glob(str(path)))
            if not found:
                raise ConfigError(f"{named(key)}: {url} matches no file")
            expanded += found
    if not expanded:
        raise ConfigError(f"{named(key)}: empty, no shards given")
    return expanded


def _folder(folder: Path, key: str, split: str) -> list[str]:
    """The shards of ``split`` in ``folder``, as its ``index.json`` lists them, in name order.
    The manifest is checked in full where it is read (data.manifest); this reads its splits."""
    index = folder / "index.json"
    if not split:
        raise ConfigError(
            f"{named(key)}: {folder} is a folder: give its shards, e.g. '{folder}/test-*.tar'"
        )
    which = "lists its shards" if split == EVERY_SPLIT else f"says which shards are {split}'s"
    try:
        shards = json.loads(index.read_text())["shards"]
        splits = {name: info["split"] for name, info in shards.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(
            f"{named(key)}: {folder} is a folder, and its index.json, which {which}, is "
            f"unreadable ({first_line(e)}): not a folder that distseq shard wrote?"
        ) from None
    mine = sorted(name for name, of in splits.items() if split in (of, EVERY_SPLIT))
    if not mine:
        there = ", ".join(sorted(set(splits.values()))) or "none"
        wanted = "" if split == EVERY_SPLIT else f" {split}"
        raise ConfigError(f"{named(key)}: {index} lists no{wanted} shard (its splits: {there})")
    return [str(folder / name) for name in mine]


def is_shard_folder(text: str) -> bool:
    """A local folder that ``distseq shard`` (or ``features``) wrote: its index.json is an object
    that lists shards; a folder of videos with an index.json of its own is not one."""
    path = local_path(text)
    if path is None or not (path / "index.json").is_file():
        return False
    try:
        doc = json.loads((path / "index.json").read_text())
    except (OSError, ValueError):  # said where it is read as the shards' manifest
        return True
    return isinstance(doc, dict) and isinstance(doc.get("shards"), dict)


def local_path(url: str) -> Path | None:
    """The file a shard URL names; None for pipe:, http:, ...: webdataset opens those, and their
    errors surface when they are read."""
    if is_remote(url):
        return None
    return Path(re.sub("^file://?", "", url))  # as webdataset opens it: file:///abs


def recorded_shards(urls: str, key: str, option: str, split: str) -> str:
    """A model's recorded shards (config key ``key``, of ``split``), checked before use: a run
    records them as absolute paths, but they may have moved since; ``option`` overrides them."""
    if not urls:
        raise ConfigError(f"the model's config has no {key}: pass {option} with the shards")
    moved = f"the model's {key} {urls} is not there"
    try:
        found = expand(urls, key, split)
    except ConfigError as e:  # a folder or glob that has moved
        raise ConfigError(
            f"{moved} ({e}): pass {option} with the shards where they are now"
        ) from None
    for url in found:
        path = local_path(url)
        if path is not None and not path.is_file():
            raise ConfigError(
                f"{moved} ({path} does not exist): pass {option} with the shards where they are now"
            )
    return urls


def check_shards_exist(urls: list[str]) -> None:
    for url in urls:
        path = local_path(url)
        if path is not None and not path.is_file():
            raise DataError(f"shard not found: {url}")


def shard_name(url: str) -> str:
    return Path(urlparse(url).path).name


@dataclass
class Sample:
    """One sample of a shard as read: member bytes by extension, nothing decoded."""

    url: str
    key: str
    members: dict[str, bytes]
    cut: str = ""  # the shard is cut off inside this sample: the error message
    # Byte offsets in the shard of its first member's header and of what follows it: where
    # read_shard starts to read it again, or the samples after it (a resumed train stream).
    offset: int = 0
    end: int = 0

    @property
    def id(self) -> str:
        return f"{shard_name(self.url)}/{self.key}"

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


def member_key(name: str) -> tuple[str, str]:
    """A member's sample key and extension: ``dir/key.000001.jpg`` -> (``dir/key``,
    ``000001.jpg``); the key ends at the file name's first dot."""
    head, slash, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return head + slash + stem, ext


def read_shard(url: str, offset: int = 0) -> Iterator[Sample]:
    """The samples of one shard, read lazily, from the sample whose first header is at byte
    ``offset`` (0: the first). A sample's members are consecutive and named ``<key>.<ext>``. If
    the shard is cut off, the sample it ends in comes last, marked ``cut``."""
    sample: Sample | None = None
    try:
        with _open_at(url, offset) as (stream, base), _Tar.open(fileobj=stream, mode="r|*") as tar:
            for info in tar:
                tar.members = []  # a stream is read once: keep no index of its members
                at = base + info.offset
                if at < offset:  # a stream that cannot seek: read up to the sample
                    continue
                if not info.isreg():
                    continue
                key, ext = member_key(info.name)
                if sample is None or key != sample.key:
                    if sample is not None:
                        sample.end = at
                        yield sample
                    sample = Sample(url, key, {}, offset=at)
                if ext.lower() in sample.members:
                    raise DataError(f"{sample.where}: member {info.name} appears twice")
                member = tar.extractfile(info)
                assert member is not None  # a regular file
                sample.members[ext.lower()] = member.read()
            if not isinstance(tar.end, _END_OF_ARCHIVE):
                raise tarfile.ReadError("no end-of-archive mark")
            if sample is not None:
                sample.end = base + tar.offset
    except (OSError, EOFError, tarfile.TarError) as e:  # IO, tar and decompression errors
        if isinstance(e.__context__, GeneratorExit):
            return  # closed before the end, and the pipe: command complained: nothing is lost
        if sample is None:
            raise DataError(f"shard {url}: cannot read: {read_error(e)}") from None
        sample.cut = f"{sample.where}: the shard is cut off in this sample: {read_error(e)}"
    if sample is not None:
        yield sample


@contextmanager
def _open_at(url: str, offset: int) -> Iterator[tuple[IO[bytes], int]]:
    """The shard's bytes, and the offset they start at: a local plain tar seeks to ``offset``,
    so that a resumed stream costs the same at any step; a compressed or remote shard (pipe:,
    http:) starts at 0, and read_shard passes over what comes before ``offset``."""
    path = local_path(url)
    with wds.gopen(url, "rb") as stream:
        base = 0
        if offset and path is not None:
            first_header = stream.read(tarfile.BLOCKSIZE)
            if first_header[257:262] == b"ustar":  # a tar header, not gzip's or zstd's bytes
                base = offset
            stream.seek(base)
        yield stream, base


def longest_sample(urls: list[str], key: str) -> int:
    """The most frames one sample of the local shards ``urls`` (config key ``key``) holds, from
    their tar headers alone: the JPEGs are skipped, not read (a seek each)."""
    longest = 0
    for url in urls:
        path = local_path(url)
        if path is None:
            raise ConfigError(
                f"config key {key}: {url} is remote, and data.window=0 with memory.budget reads "
                "the shards' headers for the longest video: give data.window"
            )
        counts: Counter[str] = Counter()
        try:
            with _Tar.open(path, "r:") as tar:
                for info in tar:
                    tar.members = []  # keep no index: a shard has a member per frame
                    key, ext = member_key(info.name)
                    counts[key] += ext.lower().endswith(".jpg")
        except (OSError, tarfile.TarError) as e:
            raise DataError(f"shard {url}: cannot read: {first_line(e)}") from None
        longest = max([longest, *counts.values()])
    return longest


# curl's exit codes for the failures a shard URL meets (webdataset opens http(s) with curl).
_CURL_EXITS = {6: "host not found", 7: "connection refused", 22: "HTTP error", 28: "timed out"}


def read_error(error: BaseException) -> str:
    """One readable line: webdataset reports a failed ``pipe:`` or curl command as the repr of
    its arguments and its Pipe object."""
    status = re.search(r"exit (\d+) \((?:read|write)\)", str(error))
    if status is None:
        return first_line(error)
    code = int(status[1])
    curl = f" ({_CURL_EXITS[code]})" if "'curl'" in str(error) and code in _CURL_EXITS else ""
    return f"the command exited with status {code}{curl}"


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """``data`` as member ``name`` of ``tar``, with fixed metadata, so that the same input gives
    the same bytes (``distseq shard``, the importer of released features, ``distseq features``)."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode, info.mtime, info.uname, info.gname = 0o444, 0, "distseq", "distseq"
    tar.addfile(info, io.BytesIO(data))
