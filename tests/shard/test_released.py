"""``distseq shard --released ROOT --fold N``: MS-TCN's release of an action-segmentation
dataset (features/*.npy, groundTruth/, mapping.txt, splits/) -> feature shards, checked first,
resumable, and trained on."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from distseq.cli import main
from distseq.errors import ConfigError, DataError
from distseq.shard.released import import_release
from distseq.train.loop import train

# The feature training tests' config of a features run (tests/train lies beside this folder).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from test_feature_training import _features_config

CLASSES = ["cut_tomato", "mix"]
F = 8
FRAMES = {"rgb-01-1": 7, "rgb-01-2": 5, "rgb-02-1": 6, "rgb-02-2": 4}
TRAIN, TEST = ["rgb-01-1", "rgb-01-2", "rgb-02-1"], ["rgb-02-2"]
# With 2 videos a shard: train-000000 (rgb-01-1, rgb-01-2), train-000001, test-000000.
SHARDS = {"train-000000.tar": TRAIN[:2], "train-000001.tar": TRAIN[2:], "test-000000.tar": TEST}
TRAIN_BUNDLE = "train.split1.bundle"


@dataclass
class Release:
    root: Path
    features: dict[str, np.ndarray]  # (F, frames) float32, as the .npy files hold them
    truth: dict[str, list[str]]  # class names, a frame each


def make_release(root: Path) -> Release:
    """A tiny release in MS-TCN's layout; the train bundle and a ground truth end in an empty
    line, as some do."""
    rng = np.random.default_rng(0)
    for sub in ("features", "groundTruth", "splits"):
        (root / sub).mkdir(parents=True)
    (root / "mapping.txt").write_text("".join(f"{i} {c}\n" for i, c in enumerate(CLASSES)))
    features, truth = {}, {}
    for v, (stem, n) in enumerate(FRAMES.items()):
        features[stem] = rng.standard_normal((F, n)).astype(np.float32) * 3
        np.save(root / "features" / f"{stem}.npy", features[stem])
        truth[stem] = [CLASSES[(t // 2 + v) % 2] for t in range(n)]
        end = "\n\n" if v == 2 else "\n"  # one with a trailing empty line
        (root / "groundTruth" / f"{stem}.txt").write_text("\n".join(truth[stem]) + end)
    (root / "splits" / TRAIN_BUNDLE).write_text("".join(f"{s}.txt\n" for s in TRAIN) + "\n")
    (root / "splits" / "test.split1.bundle").write_text("".join(f"{s}.txt\n" for s in TEST))
    return Release(root, features, truth)


def shard(*argv: object) -> int:
    return main(["shard", *map(str, argv)])


def do_import(release: Release, out: Path) -> int:
    return shard("--released", release.root, "--fold", 1, "--out", out, "--videos-per-shard", 2)


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]


@pytest.fixture
def release(tmp_path: Path) -> Release:
    return make_release(tmp_path / "release")


def test_the_shards_hold_the_release_s_features_and_labels(
    release: Release, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    assert do_import(release, out) == 0
    for name, stems in SHARDS.items():
        stored = members(out / name)
        assert list(stored) == [f"{s}.{m}" for s in stems for m in ("features.npy", "labels.json")]
        for stem in stems:
            feats = np.load(io.BytesIO(stored[f"{stem}.features.npy"]), allow_pickle=False)
            assert feats.dtype == np.float16 and feats.shape == (FRAMES[stem], F)
            np.testing.assert_allclose(feats, release.features[stem].T, rtol=2**-11, atol=0)
            labels = json.loads(stored[f"{stem}.labels.json"])["labels"]
            assert labels == [CLASSES.index(c) for c in release.truth[stem]]

    index = json.loads((out / "index.json").read_text())
    assert index["classes"] == CLASSES and index["features"] == F and "backbone" in index
    assert list(index["shards"]) == list(SHARDS)
    for name, stems in SHARDS.items():
        names = [c for s in stems for c in release.truth[s]]
        assert index["shards"][name] == {
            "split": "test" if name.startswith("test") else "train",
            "samples": len(stems),
            "frames": len(names),
            "labels": [names.count(c) for c in CLASSES],
        }


def test_a_rerun_writes_only_what_is_missing(release: Release, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert do_import(release, out) == 0
    index = (out / "index.json").read_bytes()
    first = (out / "train-000000.tar").read_bytes()
    (out / "train-000000.tar").unlink()
    (out / "train-000000.tar.tmp").write_bytes(b"half a shard")  # a killed run's leftover
    (out / "test-000000.tar.tmp").write_bytes(b"another")
    before = {n: (out / n).stat().st_mtime_ns for n in ("train-000001.tar", "test-000000.tar")}
    done = import_release(release.root, 1, out, 2)
    assert (done.written, done.skipped, done.frames) == (1, 2, FRAMES["rgb-01-1"] + 5)
    assert {n: (out / n).stat().st_mtime_ns for n in before} == before
    assert (out / "train-000000.tar").read_bytes() == first  # the same bytes again
    assert (out / "index.json").read_bytes() == index
    assert not list(out.glob("*.tmp"))
    (out / "test-000000.tar").write_bytes(b"not a tar")  # not ours: said, not overwritten
    with pytest.raises(DataError, match=r"test-000000\.tar: unreadable"):
        import_release(release.root, 1, out, 2)
    # Another grouping into the same --out would mix two imports: refused.
    with pytest.raises(ConfigError, match="videos_per_shard"):
        import_release(release.root, 1, out, 3)


def _break(release: Release, case: str) -> tuple[str, int]:
    """Spoil the release one way; what the error line must name, and the exit code."""
    root = release.root
    if case == "mapping ids":
        (root / "mapping.txt").write_text("0 cut_tomato\n2 mix\n")
        return f"{root / 'mapping.txt'}: ids must be 0..1", 1
    if case == "mapping twice":
        (root / "mapping.txt").write_text("0 cut_tomato\n1 mix\n1 stir\n")
        return f"{root / 'mapping.txt'} line 3", 1
    if case == "no features":
        (root / "features" / "rgb-01-2.npy").unlink()
        return f"lists rgb-01-2, but {root / 'features' / 'rgb-01-2.npy'} is missing", 1
    if case == "no truth":  # of a test video: checked before any train shard is written
        (root / "groundTruth" / "rgb-02-2.txt").unlink()
        return f"{root / 'groundTruth' / 'rgb-02-2.txt'} is missing", 1
    if case == "unknown class":
        truth = root / "groundTruth" / "rgb-02-1.txt"
        truth.write_text("mix\nmix\nstir\nmix\nmix\nmix\n")
        return f"{truth} line 3: class 'stir' is not in", 1
    if case == "frame count":
        path = root / "features" / "rgb-01-1.npy"
        np.save(path, np.zeros((F, 9), np.float32))
        return f"{path}: 9 frames (of shape (8, 9), features x frames), but", 1
    if case == "transposed":
        path = root / "features" / "rgb-01-1.npy"
        np.save(path, np.zeros((7, F), np.float32))
        return "has 7 lines: they must be equal (is it stored (frames, features)?)", 1
    if case == "not 2-D":
        path = root / "features" / "rgb-02-2.npy"
        np.save(path, np.zeros(F * 4, np.float32))
        return f"{path}: float32 of shape (32,), not 2-D float", 1
    if case == "not float":
        path = root / "features" / "rgb-02-2.npy"
        np.save(path, np.zeros((F, 4), np.int64))
        return f"{path}: int64 of shape (8, 4), not 2-D float", 1
    if case == "pickled":
        path = root / "features" / "rgb-02-2.npy"
        np.save(path, np.array([{"a": 1}] * 4, dtype=object), allow_pickle=True)
        return f"{path}: not a .npy array (Array can't be memory-mapped: Python objects", 1
    if case == "random bytes":  # numpy reads them as pickled, and advised allow_pickle
        path = root / "features" / "rgb-02-2.npy"
        path.write_bytes(np.random.default_rng(0).bytes(300))
        return f"{path}: not a .npy array (it holds pickled Python objects, which distseq ", 1
    if case == "feature size":
        path = root / "features" / "rgb-02-2.npy"
        np.save(path, np.zeros((F + 1, 4), np.float32))
        return f"{path}: 9 features a frame, but", 1
    if case == "in both bundles":
        (root / "splits" / "test.split1.bundle").write_text("rgb-02-2.txt\nrgb-01-1.txt\n")
        return "rgb-01-1 again", 1
    assert case == "no fold"
    (root / "splits" / TRAIN_BUNDLE).rename(root / "splits" / "train.split2.bundle")
    return "--fold 1: no", 2


CASES = [
    "mapping ids",
    "mapping twice",
    "no features",
    "no truth",
    "unknown class",
    "frame count",
    "transposed",
    "not 2-D",
    "not float",
    "pickled",
    "random bytes",
    "feature size",
    "in both bundles",
    "no fold",
]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_release_is_one_line_and_nothing_is_written(
    case: str, release: Release, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    culprit, code = _break(release, case)
    capsys.readouterr()
    out = tmp_path / "out"
    assert do_import(release, out) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and culprit in err, err
    assert "allow_pickle" not in err  # distseq never unpickles, and never advises it
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--fps", "5"], "--fps: not an option of --released"),
        (["--mapping", "m.txt"], "--mapping: not an option of --released"),
        (["videos/"], "--released reads no videos: drop videos"),
        (["--fold", "0"], "--fold 0: must be >= 1"),
        (["--videos-per-shard", "0"], "--videos-per-shard 0: must be >= 1"),
    ],
)
def test_options_that_mean_nothing_to_a_release_are_refused(
    argv: list[str],
    message: str,
    release: Release,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fold = [] if "--fold" in argv else ["--fold", 1]
    assert shard("--released", release.root, *fold, "--out", tmp_path / "o", *argv) == 2
    assert message in capsys.readouterr().err
    assert shard("--fold", 1, "--out", tmp_path / "o", "v.mp4", "--labels", "l") == 2
    assert "--fold 1: is for --released ROOT" in capsys.readouterr().err


def test_an_out_with_other_shards_is_refused(release: Release, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "train-000000.tar").write_bytes(b"")
    with pytest.raises(ConfigError, match="choose an empty --out"):
        import_release(release.root, 1, out, 2)


def test_values_float16_cannot_hold_are_refused(release: Release, tmp_path: Path) -> None:
    path = release.root / "features" / "rgb-02-2.npy"
    np.save(path, np.full((F, 4), 1e6, np.float32))
    with pytest.raises(DataError, match="beyond float16's range"):
        import_release(release.root, 1, tmp_path / "out", 2)
    assert not list((tmp_path / "out").glob("test-*"))  # no half shard either


def test_a_run_trains_on_them_validates_on_the_test_videos_and_eval_finds_them(
    release: Release, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert do_import(release, out) == 0
    run = tmp_path / "run"
    cfg = _features_config(
        out,
        run,
        f"data.train={out}/train-{{000000..000001}}.tar",
        f"data.val={out}/test-000000.tar",  # MS-TCN validates on the test split
        "model.head.kind=lstm",
        "parallel.mode=none",
        "model.backbone.name=distseq.shard.released:StoredFeatures",
        "model.backbone.args={features: 8}",
        "train.steps=2",
        "train.eval_every=2",
    )
    metrics = train(cfg)
    assert metrics["step"] == 2 and 0.0 <= metrics["val_accuracy"] <= 1.0
    capsys.readouterr()
    assert main(["eval", str(run), "--split", "test", "--json", "--out", str(tmp_path / "e")]) == 0
    report = json.loads((tmp_path / "e" / "eval.json").read_text())
    assert report["videos"] == len(TEST)
