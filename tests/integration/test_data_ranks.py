"""Data streams on two real gloo ranks: val in lockstep and disjoint, no rank runs dry."""

from __future__ import annotations

from pathlib import Path

from conftest import torchrun
from distseq.data.manifest import load_manifest
from distseq.data.synthetic import encode_sample, sequences
from distseq.data.val_stream import val_batches
from streams import (
    N_VAL,
    PER_SHARD,
    SYN,
    sequences_of,
    stream_config,
    write_shards,
)


def test_two_ranks_val_lockstep_and_disjoint(shards: Path, tmp_path: Path) -> None:
    results = torchrun("data_ranks", 2, tmp_path, str(shards), timeout=120)

    assert len(results[0]["val"]) == len(results[1]["val"]) == 2  # rank 1 has 2 samples + 1 pad
    originals = sequences_of("val", N_VAL)
    got: dict[str, list[int]] = {}
    for res in results:
        for batch in res["val"]:
            for key, labels, mask in zip(
                batch["keys"], batch["labels"], batch["mask"], strict=True
            ):
                if key:
                    assert key not in got, f"{key} seen twice"
                    got[key] = [y for y, m in zip(labels, mask, strict=True) if m]
                else:
                    assert not any(mask)
    assert got == {key: labels for key, (_, labels) in originals.items()}
    # The split is the one that the (rank, world) arguments give in a single process.
    manifest = load_manifest(cfg := stream_config(shards, num_workers=1))
    for rank, res in enumerate(results):
        alone = [b.keys for b in val_batches(cfg, manifest, rank=rank, world=2)]
        assert [b["keys"] for b in res["val"]] == alone

    # Each rank starts in its own half of the epoch's shards (3 sequences per shard).
    first_shards = [{int(k.split("-")[1]) // PER_SHARD for k in r["first_train"]} for r in results]
    assert first_shards[0] and first_shards[1] and not first_shards[0] & first_shards[1]


def test_fewer_shards_than_ranks_x_workers(tmp_path: Path) -> None:
    seqs = [encode_sample(key, x, y) for key, x, y in sequences("train", 8, **SYN)]
    root = tmp_path / "data"
    cfg = write_shards(root, [seqs[:1], seqs[1:3], seqs[3:]])  # 1, 2 and 5 videos
    results = torchrun("unequal_shards", 2, tmp_path, cfg.train, timeout=240)
    for res in results:
        assert [b["ranks"] for b in res["batches"]] == [2] * 12
        assert [b["worker"] for b in res["batches"]] == [0, 1] * 6
    # 4 slots, 8 videos: each worker's 2 first batches are its share of epoch 0, and so on.
    everything = sorted(f"train-{i:06d}" for i in range(8))
    for epoch in range(3):
        keys = [
            key
            for res in results
            for batch in res["batches"][4 * epoch : 4 * epoch + 4]
            for key in batch["keys"]
        ]
        assert sorted(keys) == everything, epoch
