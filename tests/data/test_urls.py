"""The loader reads shards given as webdataset URLs (path, file:, pipe: and http via curl), a
glob of local files, or a shard folder."""

from __future__ import annotations

import functools
import shutil
import signal
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from itertools import islice
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from distseq.config import DataConfig
from distseq.data.manifest import find_manifest
from distseq.data.tar import EVERY_SPLIT, expand, is_shard_folder
from distseq.data.train_stream import Resume, train_batches
from distseq.errors import ConfigError, DataError

PATTERN = "train-{000000..000003}.tar"  # the conftest shards: 4 train shards of 2 sequences
BATCHES = 3
TIMEOUT_S = 30


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # keep pytest's output readable
        pass


@pytest.fixture(scope="module")
def http_root(shards: Path) -> Iterator[str]:
    """http://127.0.0.1:PORT serving the shard directory, from a thread of this process."""
    if shutil.which("curl") is None:
        pytest.fail("curl not found: webdataset opens http:// shards with curl")
    handler = functools.partial(_QuietHandler, directory=str(shards))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # curl would send even 127.0.0.1 through a proxy set in the environment.
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")


@pytest.fixture(autouse=True)
def deadline() -> Iterator[None]:
    """Fail, rather than hang, a test whose loader blocks on a shard that never comes."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"loader still blocked after {TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TIMEOUT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _cfg(train: str, manifest: str = "", num_workers: int = 0) -> DataConfig:
    return DataConfig(
        train=train,
        manifest=manifest,
        size=32,
        window=8,
        batch_size=2,
        num_workers=num_workers,
        shuffle_buffer=4,
    )


def _take(cfg: DataConfig) -> list[tuple[list[str], list[list[int]]]]:
    return [(b.keys, b.labels.tolist()) for b in islice(train_batches(cfg, seed=3), BATCHES)]


def _url(kind: str, name: str, shards: Path, request: pytest.FixtureRequest) -> str:
    if kind == "file":
        return f"{shards.as_uri()}/{name}"
    if kind == "pipe":
        return f"pipe:cat {shards}/{name}"
    # Looked up only here, so that without curl just the http cases fail.
    return f"{request.getfixturevalue('http_root')}/{name}"


@pytest.mark.parametrize("kind", ["file", "pipe"])
def test_a_stream_of_shards_it_cannot_seek_in_resumes_too(
    kind: str, shards: Path, request: pytest.FixtureRequest
) -> None:
    """A pipe: shard cannot seek: a resumed stream reads up to the samples its position names."""
    first, last = _url(kind, "train-000000.tar", shards, request).rsplit("train-000000", 1)
    cfg = _cfg(f"{first}train-{{000000..000003}}{last}", str(shards / "index.json"))
    full = list(islice(train_batches(cfg, seed=3), 5))
    positions = {b.worker: b.position for b in full[:3] if b.position}
    assert all(p["buffer"] and any(o for _, o in p["buffer"]) for p in positions.values())
    resumed = train_batches(cfg, seed=3, resume=Resume(3, positions))
    assert [b.keys for b in islice(resumed, 2)] == [b.keys for b in full[3:]]


@pytest.mark.parametrize("kind", ["file", "pipe", "http"])
def test_url_gives_the_same_batches_as_the_path(
    kind: str, shards: Path, request: pytest.FixtureRequest
) -> None:
    expected = _take(_cfg(str(shards / PATTERN)))
    assert len(expected) == BATCHES and all(keys for keys, _ in expected)
    # Only local shards have a directory in which to find index.json by default.
    manifest = "" if kind == "file" else str(shards / "index.json")
    assert _take(_cfg(_url(kind, PATTERN, shards, request), manifest)) == expected


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("kind", ["pipe", "http"])
def test_missing_remote_shard_is_a_one_line_error(
    kind: str, num_workers: int, shards: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(kind, "missing.tar", shards, request)
    cfg = _cfg(url, str(shards / "index.json"), num_workers)
    with pytest.raises(DataError) as info:
        _take(cfg)
    message = str(info.value)
    assert "\n" not in message and url in message, message
    # cat's status 1; curl's 22 is an HTTP error (the 404)
    reason = "status 1" if kind == "pipe" else "status 22 (HTTP error)"
    assert message.endswith(f"cannot read: the command exited with {reason}"), message


def test_a_folder_or_a_glob_gives_the_pattern_s_shards(shards: Path) -> None:
    names = [f"{shards}/train-{i:06d}.tar" for i in range(4)]
    assert expand(str(shards / PATTERN), "data.train") == names
    assert expand(f"{shards}/train-*.tar", "data.train") == names
    both = expand(f"{shards}/{{train,val}}-*.tar", "data.train")  # braces, then the glob
    assert both == [*names, f"{shards}/val-000000.tar", f"{shards}/val-000001.tar"]
    # A list of a glob and a folder, and the manifest of the list: its first part's folder's.
    assert expand(f"{shards}/train-00000[01].tar::{shards}", "data.train", "train") == [
        *names[:2],
        *names,
    ]
    assert find_manifest(f"{shards}/train-*.tar::{shards}", "", "data.train").path == (
        shards / "index.json"
    )
    # A folder: its index.json says which of its shards are of the split asked for.
    assert expand(str(shards), "data.train", "train") == names
    assert expand(str(shards), "data.val", "val") == [f"{shards}/val-00000{i}.tar" for i in (0, 1)]
    # Every split, as predict and features read a folder: every shard it lists, in name order.
    assert expand(str(shards), "INPUT", EVERY_SPLIT) == sorted(str(p) for p in shards.glob("*.tar"))
    assert len(expand(str(shards), "INPUT", EVERY_SPLIT)) == 6
    assert is_shard_folder(str(shards)) and not is_shard_folder(f"{shards}/train-000000.tar")
    assert _take(_cfg(str(shards))) == _take(_cfg(str(shards / PATTERN)))


@pytest.mark.parametrize(
    "urls,split,message",
    [
        ("{shards}", "test", "{shards}/index.json lists no test shard (its splits: train, val)"),
        ("{shards}", "", "INPUT: {shards} is a folder: give its shards, e.g. '{shards}/test-*"),
        ("{shards}/test-*.tar", "test", "INPUT: {shards}/test-*.tar matches no file"),
        ("{shards}::", "train", "INPUT: '{shards}::' has an empty part between its"),
        ("{empty}", "train", "{empty} is a folder, and its index.json, which says which shards"),
        ("{empty}", EVERY_SPLIT, "{empty} is a folder, and its index.json, which lists its shards"),
    ],
)
def test_a_folder_or_glob_without_shards_is_refused_in_one_line(
    urls: str, split: str, message: str, shards: Path, tmp_path: Path
) -> None:
    where = {"shards": shards, "empty": tmp_path}
    with pytest.raises(ConfigError) as info:
        expand(urls.format(**where), "INPUT", split)
    said = str(info.value)
    assert message.format(**where) in said and "\n" not in said
    assert "config key" not in said  # INPUT is a command's argument


def test_a_folder_whose_index_json_lists_no_shards_is_not_a_shard_folder(tmp_path: Path) -> None:
    # A folder of videos may hold an index.json of its own: predict reads it as videos.
    (tmp_path / "index.json").write_text('{"videos": ["a.mp4"]}')
    assert not is_shard_folder(str(tmp_path))
    (tmp_path / "index.json").write_text('{"format": 1, "shards": {}}')
    assert is_shard_folder(str(tmp_path)) and not is_shard_folder(f"pipe:cat {tmp_path}")


@pytest.mark.parametrize("tars", [0, 2])
def test_a_folder_without_index_json_says_what_it_lacks(tars: int, tmp_path: Path) -> None:
    # It said "manifest not found: .../index.json (set data.manifest)" of an empty folder.
    for i in range(tars):
        (tmp_path / f"train-{i:06d}.tar").write_bytes(b"")
    with pytest.raises(ConfigError) as e:
        find_manifest(str(tmp_path), "", "data.train")
    lacks = (
        "holds no shards (no .tar file and no index.json): make them with distseq shard"
        if not tars
        else f"holds 2 .tar files but no index.json: give them as '{tmp_path}/*.tar' with their "
        "manifest in data.manifest"
    )
    assert str(e.value) == f"config key data.train: {tmp_path} {lacks}"
