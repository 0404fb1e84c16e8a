"""Packing encoded videos into shards (pack.py): whole videos per shard, commit records, and what
a killed run left removed."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from distseq.data.manifest import ShardInfo
from distseq.shard.pack import Packer, next_indices, read_commits, write_index


def labels_of(frames: int) -> list[int]:
    """``video_tar``'s labels: -1 (unlabelled), 0, 1, -1, 0, ... of 2 classes."""
    return [t % 3 - 1 for t in range(frames)]


def video_tar(path: Path, key: str, frames: int, frame_bytes: int) -> Path:
    """A temporary tar as encode writes it: one sample of ``frames`` frames."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        members = [(f"{key}.{t:06d}.jpg", b"x" * frame_bytes) for t in range(frames)]
        labels = json.dumps({"labels": labels_of(frames)}).encode()
        for name, data in [*members, (f"{key}.labels.json", labels)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_whole_videos_fill_shards_and_each_group_is_committed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / ".done").mkdir(parents=True)
    # Each frame takes 512 + 512 bytes (header and one data block): a video of 3 frames and its
    # labels take 4 KiB, so two do not fit in 6 KiB and every video opens a shard of its own.
    packer = Packer(out, "train", 0, max_bytes=6 * 1024, num_classes=2)
    for i in range(3):
        packer.add(video_tar(tmp_path / f"v{i}.tar", f"v{i}", 3, 100), f"v{i}", {"i": i})
    packer.close()
    shards = sorted(p.name for p in out.glob("*.tar"))
    assert shards == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    assert not list(tmp_path.glob("v*.tar"))  # consumed
    records = read_commits(out)
    assert [sorted(r["sources"]) for r in records] == [["v0"], ["v1"], ["v2"]]
    assert records[0]["shards"]["train-000000.tar"] == ShardInfo("train", 1, 3, labels=[1, 1])
    assert next_indices(records) == {"train": 3, "val": 0, "test": 0}


def test_what_a_killed_run_left_is_removed_and_its_videos_redone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / ".done").mkdir(parents=True)
    packer = Packer(out, "val", 0, max_bytes=1e9, num_classes=2)
    packer.add(video_tar(tmp_path / "a.tar", "a", 2, 10), "a", {})
    packer.close()
    (out / "val-000001.tar").write_bytes(b"renamed, never committed")
    (out / "val-000002.tar.tmp").write_bytes(b"open when killed")
    (out / ".work").mkdir()
    # A committed shard that is gone: its record goes, and its videos are redone.
    packer = Packer(out, "val", 3, max_bytes=1e9, num_classes=2)
    packer.add(video_tar(tmp_path / "b.tar", "b", 2, 10), "b", {})
    packer.close()
    (out / "val-000003.tar").unlink()
    records = read_commits(out)
    assert [sorted(r["sources"]) for r in records] == [["a"]]
    assert sorted(p.name for p in out.iterdir()) == [".done", "val-000000.tar"]
    assert json.loads((out / ".done" / "val-000000.tar.json").read_text())["sources"] == {"a": {}}


def test_each_shard_s_label_counts_are_the_labels_it_holds(tmp_path: Path) -> None:
    """Counted as the samples are packed, unlabelled frames left out; a commit record from
    before the counts has its shard's counted from the shard when index.json is written."""
    out = tmp_path / "out"
    (out / ".done").mkdir(parents=True)
    packer = Packer(out, "train", 0, max_bytes=12 * 1024, num_classes=2)
    for i, frames in enumerate((5, 4, 7)):  # 6 + 5 KiB fit in a shard, 8 open one (1 KiB a member)
        packer.add(video_tar(tmp_path / f"v{i}.tar", f"v{i}", frames, 10), f"v{i}", {})
    packer.close()
    both = labels_of(5) + labels_of(4)
    expected = {
        "train-000000.tar": [both.count(0), both.count(1)],
        "train-000001.tar": [labels_of(7).count(0), labels_of(7).count(1)],
    }
    records = read_commits(out)
    assert {n: i.labels for r in records for n, i in r["shards"].items()} == expected
    old = out / ".done" / "train-000001.tar.json"
    record = json.loads(old.read_text())
    del record["shards"]["train-000001.tar"]["labels"]
    old.write_text(json.dumps(record))
    write_index(out, ["a", "b"], 1.0, 16, 90, read_commits(out))
    index = json.loads((out / "index.json").read_text())
    assert {n: s["labels"] for n, s in index["shards"].items()} == expected
