"""``distseq features``: a model's per-frame features once, as feature shards or <video>.npy
(features, frames), equal to the backbone over the whole video at once; resumable; split across
ranks alike."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import ONE, untrained
from distseq.checkpoint.export import Loaded
from distseq.cli import main
from distseq.data.manifest import find_manifest
from distseq.data.val_stream import val_batches
from distseq.errors import ConfigError
from distseq.infer.features import write_features
from distseq.infer.predict import FrameSampling
from distseq.model.backbone import tiny_cnn
from distseq.model.frames import IMAGENET_MEAN, IMAGENET_STD
from distseq.model.video import build_feature_model
from streams import N_TRAIN, N_VAL, PER_SHARD, label_counts_of

SPLIT = "val-{000000..000001}.tar"
HOW = FrameSampling(None, 32, 90, None)  # shards need no recipe: their frames are made


def test_features_equal_the_backbone_over_the_whole_video(shards: Path, tmp_path: Path) -> None:
    loaded = untrained(shards, ["phase0", "phase1", "phase2"])
    urls = f"{shards}/{SPLIT}"
    done = write_features(loaded, [urls], HOW, 4, tmp_path, ONE, "npy")  # chunks of 4 frames
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
    write_features(loaded, [urls], HOW, 4, tmp_path, ONE, "npy")
    first = tmp_path / "val-000000.npy"
    first.unlink()
    (tmp_path / "val-000000.npy.tmp").write_bytes(b"half a file")  # a killed run's leftover
    before = (tmp_path / "val-000001.npy").stat().st_mtime_ns
    done = write_features(loaded, [urls], HOW, 4, tmp_path, ONE, "npy")
    assert (done.videos, done.skipped) == (1, N_VAL - 1)
    assert np.load(first).shape[0] == loaded.model.feature_dim
    assert (tmp_path / "val-000001.npy").stat().st_mtime_ns == before
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("chunk", [1, 100])
def test_the_chunk_changes_nothing(shards: Path, tmp_path: Path, chunk: int) -> None:
    loaded = untrained(shards, ["phase0", "phase1", "phase2"])
    write_features(loaded, [f"{shards}/val-000000.tar"], HOW, chunk, tmp_path / "a", ONE, "npy")
    write_features(loaded, [f"{shards}/val-000000.tar"], HOW, 3, tmp_path / "b", ONE, "npy")
    # The CNN's convolutions over 1 frame and over 3 round apart: by 1.2e-5 on a feature of 0.99
    # on this CPU (with the code before the library API too), so the tolerance is relative too.
    for path in (tmp_path / "a").glob("*.npy"):
        a, b = np.load(path), np.load(tmp_path / "b" / path.name)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _all(shards: Path) -> list[str]:
    """Every shard of the tests' shards: 4 train and 2 val."""
    return [f"{shards}/train-{{000000..000003}}.tar", f"{shards}/{SPLIT}"]


def test_feature_shards_hold_the_backbone_s_features_and_the_labels(
    shards: Path, tmp_path: Path
) -> None:
    loaded = untrained(shards, ["phase0", "phase1", "phase2"])
    done = write_features(loaded, _all(shards), HOW, 4, tmp_path, ONE)
    assert (done.videos, done.skipped) == (N_TRAIN + N_VAL, 0)
    index = json.loads((tmp_path / "index.json").read_text())
    source = find_manifest(f"{shards}/{SPLIT}", "", "x")
    assert index["features"] == loaded.model.feature_dim == 32
    assert index["backbone"] == "tiny_cnn" and index["classes"] == source.classes
    assert {n: s["split"] for n, s in index["shards"].items()} == {
        n: s.split for n, s in source.shards.items()
    }
    assert sum(s["frames"] for s in index["shards"].values()) == done.frames
    counts = label_counts_of("train", N_TRAIN) | label_counts_of("val", N_VAL)
    assert {n: s["labels"] for n, s in index["shards"].items()} == counts
    # Read back as training reads them: features equal the backbone's over each whole video to
    # float16's precision (2^-11 relative), labels equal the frame shards'.
    frames = replace(loaded.config.data, val=f"{shards}/{SPLIT}")
    feats = replace(frames, val=f"{tmp_path}/{SPLIT}", features=True)
    seen = 0
    pairs = zip(
        val_batches(frames, source, 0, 1),
        val_batches(feats, find_manifest(feats.val, "", "x"), 0, 1),
        strict=True,
    )
    for by_frames, by_features in pairs:
        assert by_features.keys == by_frames.keys and by_features.frames.dtype == torch.float16
        assert torch.equal(by_features.labels, by_frames.labels)
        assert torch.equal(by_features.mask, by_frames.mask)
        with torch.no_grad():
            whole = loaded.model.features(by_frames.frames, by_frames.mask)
        stored = by_features.frames.float()
        assert torch.allclose(stored, whole, rtol=2**-10, atol=1e-4)
        seen += sum(1 for key in by_frames.keys if key)
    assert seen == N_VAL
    # The folder distseq shard wrote is every shard its index.json lists: the same feature shards.
    folder = tmp_path / "of_the_folder"
    write_features(loaded, [str(shards)], HOW, 4, folder, ONE)
    made = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert sorted(p.name for p in folder.iterdir()) == made
    assert all((folder / name).read_bytes() == (tmp_path / name).read_bytes() for name in made)


def test_feature_shards_resume_shard_by_shard(shards: Path, tmp_path: Path) -> None:
    loaded = untrained(shards, ["phase0", "phase1", "phase2"])
    write_features(loaded, _all(shards), HOW, 4, tmp_path, ONE)
    index = (tmp_path / "index.json").read_text()
    (tmp_path / "val-000001.tar").unlink()
    (tmp_path / "val-000001.tar.tmp").write_bytes(b"half a shard")  # a killed run's leftover
    before = (tmp_path / "train-000000.tar").stat().st_mtime_ns
    done = write_features(loaded, _all(shards), HOW, 4, tmp_path, ONE)
    assert (done.videos, done.skipped) == (N_VAL - PER_SHARD, 5)  # val-000001's 2; 5 shards
    assert (tmp_path / "train-000000.tar").stat().st_mtime_ns == before
    assert (tmp_path / "index.json").read_text() == index
    assert not list(tmp_path.glob("*.tmp"))


def test_remote_shards_take_their_manifest_from_manifest(shards: Path, tmp_path: Path) -> None:
    # A pipe: URL has no folder to find index.json in: --manifest names it.
    loaded = untrained(shards, ["phase0", "phase1", "phase2"])
    local, remote = tmp_path / "local", tmp_path / "remote"
    write_features(loaded, [f"{shards}/val-000000.tar"], HOW, 4, local, ONE)
    piped = [f"pipe:cat {shards}/val-000000.tar"]
    with pytest.raises(ConfigError, match=r"remote shards .* need a manifest path \(--manifest\)"):
        write_features(loaded, piped, HOW, 4, remote, ONE)
    index = str(shards / "index.json")
    done = write_features(loaded, piped, HOW, 4, remote, ONE, "shards", index)
    assert done.videos == PER_SHARD
    assert (remote / "val-000000.tar").read_bytes() == (local / "val-000000.tar").read_bytes()
    assert json.loads((remote / "index.json").read_text()) == json.loads(
        (local / "index.json").read_text()
    )


def test_feature_shards_need_shards_and_a_model_with_a_backbone(
    shards: Path, tmp_path: Path
) -> None:
    loaded = untrained(shards, ["phase0", "phase1", "phase2"])
    with pytest.raises(ConfigError, match=r"clip.mp4: --format shards reads shards"):
        write_features(loaded, [str(tmp_path / "clip.mp4")], HOW, 4, tmp_path, ONE)
    with pytest.raises(ConfigError, match="are not the model's"):
        write_features(untrained(shards, ["a", "b", "c"]), _all(shards), HOW, 4, tmp_path, ONE)
    cfg = replace(loaded.config, data=replace(loaded.config.data, features=True))
    head = build_feature_model(cfg.model, 3)
    with pytest.raises(ConfigError, match=r"trained on features .* no backbone"):
        write_features(Loaded(head, cfg, loaded.classes, 0), _all(shards), HOW, 4, tmp_path, ONE)


def test_a_torchvision_backbone_by_name_and_weights_without_a_run(
    shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--backbone NAME --weights FILE``: the features of those weights (with their BatchNorm
    statistics, frozen_bn), in feature shards that name the backbone."""
    torch.manual_seed(3)
    cnn = tiny_cnn()
    with torch.no_grad():  # statistics that are not the identity, so that frozen_bn shows
        for bn in (cnn[1], cnn[4]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    weights = tmp_path / "tiny.pt"
    torch.save(cnn.state_dict(), weights)
    out = tmp_path / "features"
    argv = ["features", "--backbone", "tiny_cnn", "--weights", str(weights), "--size", "32"]
    assert main([*argv, f"{shards}/val-000000.tar", "--out", str(out)]) == 0
    assert "wrote 3 videos (" in capsys.readouterr().out
    index = json.loads((out / "index.json").read_text())
    assert (index["backbone"], index["features"]) == ("tiny_cnn", 32)
    cnn.eval()
    cnn[-1] = torch.nn.Identity()  # the classifier, as build_backbone removes it
    frames = replace(untrained(shards, ["phase0", "phase1", "phase2"]).config.data, batch_size=1)
    feats = replace(frames, val=f"{out}/val-000000.tar", features=True)
    frames = replace(frames, val=f"{shards}/val-000000.tar")
    pairs = zip(
        val_batches(frames, find_manifest(frames.val, "", "x")),
        val_batches(feats, find_manifest(feats.val, "", "x")),
        strict=True,
    )
    for by_frames, by_features in pairs:
        x = by_frames.frames[0].contiguous().float() / 255
        mean, std = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
        with torch.no_grad():
            want = cnn((x - mean[:, None, None]) / std[:, None, None])
        assert torch.allclose(by_features.frames[0].float(), want, rtol=2**-10, atol=1e-4)
    assert main([*argv[:3], f"{shards}/val-000000.tar", "--out", str(out)]) == 2
    assert "--backbone tiny_cnn: needs --weights" in capsys.readouterr().err
