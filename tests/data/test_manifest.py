"""index.json (data/manifest.py): per-shard label counts, read, written and summed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distseq.data.manifest import FORMAT, Manifest, ShardInfo, parse_manifest, write_manifest
from distseq.errors import DataError


def _doc(**shard: Any) -> dict[str, Any]:
    info = {"split": "train", "samples": 1, "frames": 10, **shard}
    return {"format": FORMAT, "classes": ["a", "b"], "shards": {"train-000000.tar": info}}


def test_label_counts_are_written_read_and_summed(tmp_path: Path) -> None:
    shards = {
        "train-000000.tar": ShardInfo("train", 1, 10, [3, 6]),  # one frame unlabelled
        "train-000001.tar": ShardInfo("train", 2, 5, [5, 0]),
        "val-000000.tar": ShardInfo("val", 1, 4, [1, 3]),
    }
    path = tmp_path / "index.json"
    write_manifest(path, Manifest(["a", "b"], shards))
    doc = json.loads(path.read_text())
    assert doc["shards"]["train-000000.tar"]["labels"] == [3, 6]
    manifest = parse_manifest(doc, str(path))
    assert manifest.shards == shards
    assert manifest.label_counts(["train-000000.tar", "train-000001.tar"]) == [8, 6]
    assert manifest.label_counts([]) == [0, 0]


def test_an_index_without_counts_reads_but_gives_no_class_weights(tmp_path: Path) -> None:
    """index.json files from before the counts keep reading; asking for counts names the
    manifest, the shard and the command that adds them."""
    path = tmp_path / "index.json"
    old = Manifest(["a", "b"], {"train-000000.tar": ShardInfo("train", 1, 10)}, path=path)
    write_manifest(path, old)
    doc = json.loads(path.read_text())
    assert "labels" not in doc["shards"]["train-000000.tar"]
    manifest = parse_manifest(doc, str(path))
    assert manifest.shards["train-000000.tar"].labels is None
    manifest.path = path
    with pytest.raises(DataError) as e:
        manifest.label_counts(["train-000000.tar"])
    message = str(e.value)
    assert "\n" not in message and str(path) in message and "train-000000.tar" in message
    assert "distseq shard" in message and "distseq features" in message
    with pytest.raises(DataError, match=r"no shard 'val-000000\.tar'"):
        manifest.label_counts(["val-000000.tar"])


@pytest.mark.parametrize(
    "labels",
    [
        "3,6",  # not a list
        [3],  # one count, two classes
        [3, 6, 0],
        [3, -1],
        [3, 6.0],
        [True, 6],
        [None, 6],
        [5, 6],  # 11 labelled frames in a shard of 10
    ],
)
def test_a_bad_labels_entry_is_one_line_naming_manifest_and_shard(labels: Any) -> None:
    with pytest.raises(DataError) as e:
        parse_manifest(_doc(labels=labels), "some/index.json")
    message = str(e.value)
    assert "\n" not in message
    assert "some/index.json" in message and "train-000000.tar" in message and "labels" in message
