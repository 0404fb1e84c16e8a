"""Packing encoded videos into shards (pack.py): whole videos per shard, commit records, and what
a killed run left removed."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from distseq.data.format import ShardInfo
from distseq.shard.pack import Packer, next_indices, read_commits


def video_tar(path: Path, key: str, frames: int, frame_bytes: int) -> Path:
    """A temporary tar as encode writes it: one sample of ``frames`` frames."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        members = [(f"{key}.{t:06d}.jpg", b"x" * frame_bytes) for t in range(frames)]
        for name, data in [*members, (f"{key}.labels.json", b'{"labels": []}')]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_whole_videos_fill_shards_and_each_group_is_committed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / ".done").mkdir(parents=True)
    # Each frame takes 512 + 512 bytes (header and one data block): a video of 3 frames and its
    # labels take 4 KiB, so two do not fit in 6 KiB and every video opens a shard of its own.
    packer = Packer(out, "train", 0, max_bytes=6 * 1024)
    for i in range(3):
        packer.add(video_tar(tmp_path / f"v{i}.tar", f"v{i}", 3, 100), f"v{i}", {"i": i})
    packer.close()
    shards = sorted(p.name for p in out.glob("*.tar"))
    assert shards == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    assert not list(tmp_path.glob("v*.tar"))  # consumed
    records = read_commits(out)
    assert [sorted(r["sources"]) for r in records] == [["v0"], ["v1"], ["v2"]]
    assert records[0]["shards"]["train-000000.tar"] == ShardInfo("train", samples=1, frames=3)
    assert next_indices(records) == {"train": 3, "val": 0, "test": 0}


def test_what_a_killed_run_left_is_removed_and_its_videos_redone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / ".done").mkdir(parents=True)
    packer = Packer(out, "val", 0, max_bytes=1e9)
    packer.add(video_tar(tmp_path / "a.tar", "a", 2, 10), "a", {})
    packer.close()
    (out / "val-000001.tar").write_bytes(b"renamed, never committed")
    (out / "val-000002.tar.tmp").write_bytes(b"open when killed")
    (out / ".work").mkdir()
    # A committed shard that is gone: its record goes, and its videos are redone.
    packer = Packer(out, "val", 3, max_bytes=1e9)
    packer.add(video_tar(tmp_path / "b.tar", "b", 2, 10), "b", {})
    packer.close()
    (out / "val-000003.tar").unlink()
    records = read_commits(out)
    assert [sorted(r["sources"]) for r in records] == [["a"]]
    assert sorted(p.name for p in out.iterdir()) == [".done", "val-000000.tar"]
    assert json.loads((out / ".done" / "val-000000.tar.json").read_text())["sources"] == {"a": {}}
