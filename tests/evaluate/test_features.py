"""``distseq features``: a model's per-frame features once, as <video>.npy (features, frames),
equal to the backbone over the whole video at once; resumable; split across ranks alike."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from test_evaluation import ONE, untrained

from distseq.data.format import find_manifest
from distseq.data.val_stream import val_batches
from distseq.evaluate.features import write_features
from distseq.evaluate.predict import FrameRecipe
from streams import N_VAL

SPLIT = "val-{000000..000001}.tar"
HOW = FrameRecipe(None, 32, 90, None)  # shards need no recipe: their frames are made


def test_features_equal_the_backbone_over_the_whole_video(shards: Path, tmp_path: Path) -> None:
    loaded = untrained(shards, ["phase0", "phase1", "phase2"])
    urls = f"{shards}/{SPLIT}"
    done = write_features(loaded, [urls], HOW, 4, tmp_path, ONE)  # chunks of 4 frames
    assert (done.videos, done.skipped) == (N_VAL, 0) and done.seconds > 0
    cfg = replace(loaded.config.data, val=urls)
    batches = val_batches(cfg, find_manifest(urls, "", "x"), 0, 1)
    seen = 0
    for batch in batches:
        with torch.no_grad():
            whole = loaded.model.features(batch.frames, batch.mask)
        for row, key in enumerate(batch.keys):
            if not key:
                continue
            n = int(batch.mask[row].sum())
            saved = np.load(tmp_path / f"{key}.npy")
            assert saved.shape == (loaded.model.feature_dim, n) and saved.dtype == np.float32
            assert torch.allclose(torch.from_numpy(saved).T, whole[row, :n], atol=1e-5)
            seen += 1
    assert seen == N_VAL == done.videos and done.frames == sum(
        np.load(p).shape[1] for p in tmp_path.glob("*.npy")
    )


def test_a_rerun_skips_what_is_done(shards: Path, tmp_path: Path) -> None:
    loaded = untrained(shards, ["phase0", "phase1", "phase2"])
    urls = f"{shards}/{SPLIT}"
    write_features(loaded, [urls], HOW, 4, tmp_path, ONE)
    first = tmp_path / "val-000000.npy"
    first.unlink()
    (tmp_path / "val-000000.npy.tmp").write_bytes(b"half a file")  # a killed run's leftover
    before = (tmp_path / "val-000001.npy").stat().st_mtime_ns
    done = write_features(loaded, [urls], HOW, 4, tmp_path, ONE)
    assert (done.videos, done.skipped) == (1, N_VAL - 1)
    assert np.load(first).shape[0] == loaded.model.feature_dim
    assert (tmp_path / "val-000001.npy").stat().st_mtime_ns == before
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("chunk", [1, 100])
def test_the_chunk_changes_nothing(shards: Path, tmp_path: Path, chunk: int) -> None:
    loaded = untrained(shards, ["phase0", "phase1", "phase2"])
    write_features(loaded, [f"{shards}/val-000000.tar"], HOW, chunk, tmp_path / "a", ONE)
    write_features(loaded, [f"{shards}/val-000000.tar"], HOW, 3, tmp_path / "b", ONE)
    for path in (tmp_path / "a").glob("*.npy"):
        np.testing.assert_allclose(np.load(path), np.load(tmp_path / "b" / path.name), atol=1e-5)
