"""Shard format, synthetic data, train/val streams and data errors (tiny sizes, CPU only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import warnings
from collections import Counter, defaultdict
from dataclasses import replace
from itertools import islice, pairwise
from pathlib import Path

import pytest
import torch
import webdataset as wds
from torchvision.io import encode_jpeg

from conftest import torchrun
from distseq import data
from distseq.config import DataConfig, OnError
from distseq.data import (
    Batch,
    DataError,
    load_manifest,
    train_batches,
    val_batches,
)
from distseq.synthetic import CUE_FRAMES, encode_sample, sequences, write_synthetic

# torchvision 0.29 deprecates its JPEG codecs (in favour of TorchCodec) on every call.
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding:DeprecationWarning")

REPO = Path(__file__).resolve().parents[1]
SYN = dict(min_frames=9, max_frames=14, size=32, phases=3, seed=1)
N_TRAIN, N_VAL, PER_SHARD = 12, 5, 3


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("syn")
    with warnings.catch_warnings():  # module-scoped setup is outside pytestmark's filter
        warnings.simplefilter("ignore", DeprecationWarning)
        write_synthetic(
            out, train_sequences=N_TRAIN, val_sequences=N_VAL, sequences_per_shard=PER_SHARD, **SYN
        )
    return out


def _cfg(root: Path, **kw: object) -> DataConfig:
    args: dict[str, object] = dict(
        train=str(root / "train-{000000..000003}.tar"),
        val=str(root / "val-{000000..000001}.tar"),
        size=32,
        frames=12,
        batch_size=2,
        num_workers=0,
        shuffle_buffer=4,
    )
    args.update(kw)
    return DataConfig(**args)  # type: ignore[arg-type]


def _originals(split: str, count: int) -> dict[str, tuple[torch.Tensor, list[int]]]:
    return {key: (x, y) for key, x, y in sequences(split, count, **SYN)}


def test_synthetic_is_deterministic_and_has_cues(tmp_path: Path, shards: Path) -> None:
    again = tmp_path / "again"
    write_synthetic(
        again, train_sequences=N_TRAIN, val_sequences=N_VAL, sequences_per_shard=PER_SHARD, **SYN
    )
    names = sorted(p.name for p in shards.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert len(names) == 4 + 2 + 1
    for name in names:
        assert (shards / name).read_bytes() == (again / name).read_bytes(), name

    manifest = load_manifest(_cfg(shards))
    assert manifest.classes == ["phase0", "phase1", "phase2"]
    assert manifest.shards["val-000001.tar"].samples == 2
    for frames, labels in _originals("train", N_TRAIN).values():
        assert labels[0] == 0 and labels[-1] == 2 and labels == sorted(labels)
        # Cue frames (bright centre) sit exactly on the first CUE_FRAMES frames of each new phase.
        centre = frames[:, :, 14:18, 14:18].float().mean(dim=(1, 2, 3))
        starts = [t for t in range(1, len(labels)) if labels[t] != labels[t - 1]]
        cues = {s + i for s in starts for i in range(CUE_FRAMES)}
        assert {t for t in range(len(labels)) if centre[t] > 250} == cues


@pytest.mark.parametrize(
    ("workers", "order"),
    [(0, [0, 1, 2, 3, 4]), (2, [0, 2, 1, 3, 4])],  # 2 workers: samples 0,2,4 and 1,3, interleaved
)
def test_val_round_trip(shards: Path, workers: int, order: list[int]) -> None:
    cfg = _cfg(shards, num_workers=workers)
    batches = list(val_batches(cfg, load_manifest(cfg)))
    # ceil(5 / 2) in one stream, or ceil(3 / 2) + ceil(2 / 2): the count comes from index.json
    # alone, and here no batch is padding.
    assert len(batches) == 3
    originals = _originals("val", N_VAL)
    keys = [k for b in batches for k in b.keys]
    assert keys == [f"val-{i:06d}" for i in order]  # nothing dropped or repeated
    for batch in batches:
        assert batch.frames.dtype == torch.uint8 and batch.labels.dtype == torch.int64
        for row, key in enumerate(batch.keys):
            frames, labels = originals[key]
            n = len(labels)
            assert batch.mask[row].tolist() == [True] * n + [False] * (batch.mask.shape[1] - n)
            assert batch.labels[row, :n].tolist() == labels
            assert (batch.labels[row, n:] == -100).all() and (batch.frames[row, n:] == 0).all()
            err = (batch.frames[row, :n].float() - frames.float()).abs()
            assert err.mean() < 4.5, key  # JPEG loss only
        assert batch.mask.shape[1] == max(len(originals[k][1]) for k in batch.keys)


def _check_windows(batches: list[Batch], frames: int, stride: int = 1) -> None:
    originals = _originals("train", N_TRAIN)
    for batch in batches:
        assert batch.frames.shape[1] <= frames
        for row, key in enumerate(batch.keys):
            full, labels = originals[key]
            full, labels = full[::stride], labels[::stride]
            n = int(batch.mask[row].sum())
            assert n == min(len(labels), frames)
            assert not batch.mask[row, n:].any() and (batch.labels[row, n:] == -100).all()
            got = batch.frames[row, :n].float()
            starts = [
                s
                for s in range(len(labels) - n + 1)
                if batch.labels[row, :n].tolist() == labels[s : s + n]
                and (got - full[s : s + n].float()).abs().mean() < 4.5
            ]
            assert starts, f"{key}: not a window of the original sequence"


def test_train_stream_windows_infinite_deterministic(shards: Path) -> None:
    cfg = _cfg(shards, num_workers=2)
    batches = list(islice(train_batches(cfg, seed=3), 20))  # 40 samples: over 3 epochs of 12
    _check_windows(batches, cfg.frames)
    keys = [k for b in batches for k in b.keys]
    assert len(keys) == 40
    seen = Counter(keys)
    assert set(seen) == set(_originals("train", N_TRAIN)) and min(seen.values()) >= 2
    lengths = {len(y) for _, y in _originals("train", N_TRAIN).values()}
    assert min(lengths) < cfg.frames < max(lengths)  # both cropping and padding happened

    again = list(islice(train_batches(cfg, seed=3), 20))
    assert [b.keys for b in again] == [b.keys for b in batches]
    assert all(torch.equal(a.frames, b.frames) for a, b in zip(again, batches, strict=True))
    other = list(islice(train_batches(cfg, seed=4), 20))
    assert [b.keys for b in other] != [b.keys for b in batches]


_Samples = list[dict[str, bytes | str]]


def _write_shards(root: Path, shards: list[_Samples]) -> DataConfig:
    """bad-000000.tar, bad-000001.tar, ..., used for train and val alike, with their index.json."""
    root.mkdir(parents=True, exist_ok=True)
    infos = {}
    for i, samples in enumerate(shards):
        name = f"bad-{i:06d}.tar"
        with wds.TarWriter(str(root / name), encoder=False) as sink:
            for sample in samples:
                sink.write(sample)
        infos[name] = {"split": "train", "samples": len(samples), "frames": 0}
    index = {"format": 1, "classes": ["c0", "c1", "c2"], "shards": infos}
    (root / "index.json").write_text(json.dumps(index))
    urls = str(root / f"bad-{{000000..{len(shards) - 1:06d}}}.tar")
    return _cfg(root, train=urls, val=urls, batch_size=1)


def _write_shard(root: Path, samples: _Samples) -> DataConfig:
    return _write_shards(root, [samples])


def _sample(key: str, n: int = 3, labels: list[int] | None = None) -> dict[str, bytes | str]:
    sample: dict[str, bytes | str] = {"__key__": key}
    for t in range(n):
        img = torch.full((3, 16, 16), 40 * t, dtype=torch.uint8)
        sample[f"{t:06d}.jpg"] = encode_jpeg(img, quality=90).numpy().tobytes()
    sample["labels.json"] = json.dumps({"labels": [0] * n if labels is None else labels}).encode()
    return sample


def _val(cfg: DataConfig) -> list[Batch]:
    return list(val_batches(cfg, load_manifest(cfg)))


def test_pickle_member_is_refused(tmp_path: Path) -> None:
    bad = _sample("evil")
    bad["state.pyd"] = b"cos\nsystem\n(S'echo pwned'\ntR."  # a pickle that would run a command
    cfg = _write_shard(tmp_path, [_sample("ok"), bad])
    with pytest.raises(DataError, match=r"bad-000000\.tar sample evil: member evil\.state\.pyd"):
        _val(cfg)


def test_corrupt_jpeg_raises_or_is_skipped(tmp_path: Path) -> None:
    bad = _sample("broken")
    bad["000001.jpg"] = b"this is not a jpeg"
    cfg = _write_shard(tmp_path, [_sample("a"), bad, _sample("b")])
    with pytest.raises(DataError, match=r"bad-000000\.tar sample broken: frame 000001\.jpg"):
        _val(cfg)
    # Through a DataLoader worker the message must still be one line.
    with pytest.raises(DataError) as info:
        list(islice(train_batches(DataConfig(**{**vars(cfg), "num_workers": 1}), seed=0), 3))
    assert "\n" not in str(info.value) and "frame 000001.jpg" in str(info.value)

    skip = DataConfig(**{**vars(cfg), "on_error": OnError.skip})
    batches = _val(skip)
    assert [b.keys for b in batches] == [["a"], ["b"], [""]]  # topped up to the 3 in index.json
    assert [b.skipped for b in batches] == [[], ["bad-000000.tar/broken"], []]
    assert not batches[-1].mask.any()


def test_all_bad_train_data_raises_instead_of_hanging(tmp_path: Path) -> None:
    broken = []
    for key in "abc":
        sample = _sample(key)
        sample["000000.jpg"] = b"junk"
        broken.append(sample)
    cfg = DataConfig(**{**vars(_write_shard(tmp_path, broken)), "on_error": OnError.skip})
    with pytest.raises(DataError, match=r"train samples in a row, .*sample [abc]: frame 000000"):
        next(train_batches(cfg, seed=0))


@pytest.mark.parametrize(
    ("key", "frames", "labels", "message"),
    [
        ("short", 3, [0, 1], r"sample short: 2 labels for 3 frames"),
        ("range", 2, [0, 7], r"sample range: label 7 outside the 3"),
        ("notint", 2, [0, "1"], r"sample notint: .* must be a list of integers"),
        ("nolab", 1, None, r"sample nolab: missing member nolab\.labels\.json"),
        ("gap", 0, [0, 0], r"sample gap: frames must be numbered 000000\.\.000001"),
    ],
)
def test_bad_labels_raise(
    tmp_path: Path, key: str, frames: int, labels: list[object] | None, message: str
) -> None:
    sample = _sample(key, n=frames, labels=labels)  # type: ignore[arg-type]
    if labels is None:
        del sample["labels.json"]
    if key == "gap":  # frames 0 and 2, no frame 1
        sample["000000.jpg"] = sample["000002.jpg"] = _sample("x", n=1)["000000.jpg"]
    with pytest.raises(DataError, match=message):
        _val(_write_shard(tmp_path, [sample]))


def test_missing_shard_or_manifest(shards: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"shard not found: .*train-000004\.tar"):
        train_batches(_cfg(shards, train=str(shards / "train-{000000..000009}.tar")), seed=0)
    with pytest.raises(DataError, match=r"manifest not found: nope\.json"):
        load_manifest(_cfg(shards, manifest="nope.json"))
    (tmp_path / "train-000000.tar").write_bytes((shards / "train-000000.tar").read_bytes())
    alone = str(tmp_path / "train-000000.tar")
    with pytest.raises(DataError, match=r"manifest not found: .*missing_shard.*/index\.json"):
        train_batches(_cfg(tmp_path, train=alone), seed=0)


RANK_SCRIPT = """
import json, os, sys
from itertools import islice
import torch.distributed as dist
from distseq.config import DataConfig
from distseq.data import load_manifest, train_batches, val_batches

root, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
cfg = DataConfig(train=root + "/train-{000000..000003}.tar", val=root + "/val-{000000..000001}.tar",
                 size=32, frames=12, batch_size=2, num_workers=1, shuffle_buffer=4)
val = [{"keys": b.keys, "labels": b.labels.tolist(), "mask": b.mask.tolist()}
       for b in val_batches(cfg, load_manifest(cfg))]
first = next(train_batches(cfg, seed=5)).keys
json.dump({"val": val, "first_train": first}, open(f"{out}/{rank}.json", "w"))
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # skip interpreter teardown, where gloo can abort
"""


def test_two_ranks_val_lockstep_and_disjoint(shards: Path, tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [*cmd, str(script), str(shards), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]

    assert len(results[0]["val"]) == len(results[1]["val"]) == 2  # rank 1 has 2 samples + 1 pad
    originals = _originals("val", N_VAL)
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

    # Each rank starts in its own half of the epoch's shards (3 sequences per shard).
    first_shards = [{int(k.split("-")[1]) // PER_SHARD for k in r["first_train"]} for r in results]
    assert first_shards[0] and first_shards[1] and not first_shards[0] & first_shards[1]


def test_frame_stride_keeps_every_nth_frame(shards: Path) -> None:
    cfg = _cfg(shards, frame_stride=3, num_workers=0)
    originals = _originals("val", N_VAL)
    for batch in _val(cfg):
        for row, key in enumerate(batch.keys):
            frames, labels = originals[key]
            n = int(batch.mask[row].sum())
            assert batch.labels[row, :n].tolist() == labels[::3]
            assert (batch.frames[row, :n].float() - frames[::3].float()).abs().mean() < 4.5
    train = _cfg(shards, frame_stride=2, frames=4)
    _check_windows(list(islice(train_batches(train, seed=0), 6)), train.frames, stride=2)


def test_batch_fields(shards: Path) -> None:
    cfg = _cfg(shards, num_workers=2)
    batches = list(islice(train_batches(cfg, seed=1), 4))
    assert [b.worker for b in batches] == [0, 1, 0, 1]  # DataLoader goes round the workers
    for batch in batches:
        assert batch.skipped == [] and batch.starts.tolist() == [True, True]
        moved = batch.to(torch.device("cpu"))
        assert moved.keys == batch.keys and moved.worker == batch.worker
        assert torch.equal(moved.starts, batch.starts) and torch.equal(moved.frames, batch.frames)
    assert data._empty_batch(32).starts.tolist() == [True]  # a padding row starts afresh too


def _padding(batches: list[Batch]) -> int:
    return int((~torch.cat([b.mask.flatten() for b in batches])).sum())


def test_length_buckets_cut_padding_and_lose_nothing(shards: Path) -> None:
    # One bucket per length (frames 14 >= every sequence): no batch needs padding.
    plain = _cfg(shards, frames=14)
    bucketed = replace(plain, length_buckets=14)
    unbucketed = list(islice(train_batches(plain, seed=2), 30))
    batches = list(islice(train_batches(bucketed, seed=2), 20))
    assert _padding(batches) == 0 < _padding(unbucketed[:20])
    # Buckets only delay windows: the same windows come out, and the ones still waiting in a
    # bucket are at most (batch_size - 1) per length.
    keys = Counter(k for b in batches for k in b.keys)
    first = [k for b in unbucketed for k in b.keys]
    lengths = {len(y) for _, y in _originals("train", N_TRAIN).values()}
    waiting = (plain.batch_size - 1) * len(lengths)
    assert not keys - Counter(first[: 40 + waiting])
    assert (Counter(first[:40]) - keys).total() <= waiting


@pytest.mark.parametrize("workers", [0, 2])
def test_ordered_lanes_walk_through_whole_videos(shards: Path, workers: int) -> None:
    cfg = _cfg(shards, ordered=True, frames=4, num_workers=workers)
    # A lane is one row of one worker's batches: its windows, as (key, starts, frames, labels).
    lanes: dict[tuple[int, int], list[tuple[str, bool, torch.Tensor, list[int]]]]
    lanes = defaultdict(list)
    for i, batch in enumerate(islice(train_batches(cfg, seed=4), 24)):
        assert batch.worker == i % max(1, workers)
        for row, key in enumerate(batch.keys):
            n = int(batch.mask[row].sum())
            start = bool(batch.starts[row])
            lanes[i % max(1, workers), row].append(
                (key, start, batch.frames[row, :n], batch.labels[row, :n].tolist())
            )
    originals = _originals("train", N_TRAIN)
    videos = 0
    for windows in lanes.values():
        assert windows[0][1], "a lane starts with the first window of a video"
        cuts = [i for i, (_, start, _, _) in enumerate(windows) if start] + [len(windows)]
        for begin, end in pairwise(cuts):
            video = windows[begin:end]
            key = video[0][0]
            assert all(k == key for k, *_ in video)
            assert all(len(y) == cfg.frames for *_, y in video[:-1])
            frames, labels = originals[key]
            got = [y for *_, ys in video for y in ys]
            whole = end < len(windows)  # the lane's last video may still be going on
            assert got == (labels if whole else labels[: len(got)]), key
            err = torch.cat([x for _, _, x, _ in video]).float() - frames[: len(got)].float()
            assert err.abs().mean() < 4.5, key
            videos += whole
    assert videos >= 8


def _with_bad_frames(root: Path) -> DataConfig:
    """Two shards of synthetic videos: one has a corrupt frame that every 6-frame window holds,
    another a corrupt last frame, which only some windows hold."""
    seqs = list(sequences("train", 6, **SYN))
    samples = [encode_sample(key, x, y) for key, x, y in seqs]
    always = next(i for i, (_, _, y) in enumerate(seqs) if len(y) <= 11)
    samples[always]["000005.jpg"] = b"junk"
    sometimes = (always + 1) % len(seqs)
    samples[sometimes][f"{len(seqs[sometimes][2]) - 1:06d}.jpg"] = b"junk"
    cfg = _write_shards(root, [samples[:3], samples[3:]])
    return replace(cfg, frames=6, batch_size=2, shuffle_buffer=3, on_error=OnError.skip)


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_skips_to_the_same_batches(tmp_path: Path, workers: int, ordered: bool) -> None:
    cfg = replace(_with_bad_frames(tmp_path), num_workers=workers, ordered=ordered)
    n = 14
    full = list(islice(train_batches(cfg, seed=7), n))
    k = max(5, 1 + next(i for i, b in enumerate(full) if b.skipped))
    assert k <= n - 4
    bad = {sample for batch in full[:k] for sample in batch.skipped}
    resumed = list(islice(train_batches(cfg, seed=7, skip_batches=k, bad=bad), n - k))
    for i, (want, got) in enumerate(zip(full[k:], resumed, strict=True), start=k):
        assert (got.keys, got.skipped, got.worker) == (want.keys, want.skipped, want.worker), i
        for name in ("labels", "mask", "starts", "frames"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (i, name)


@pytest.mark.parametrize("ordered", [False, True])
def test_resume_decodes_nothing_it_skips(
    shards: Path, monkeypatch: pytest.MonkeyPatch, ordered: bool
) -> None:
    decoded: list[str] = []
    real = data._decode

    def counting(
        jpegs: list[tuple[int, bytes]], where: str, size: int | None = None
    ) -> torch.Tensor:
        decoded.append(where)
        return real(jpegs, where, size)

    monkeypatch.setattr(data, "_decode", counting)
    cfg = _cfg(shards, ordered=ordered, frames=4)
    want = list(islice(train_batches(cfg, seed=2), 11))[-1]
    decoded.clear()
    got = next(train_batches(cfg, seed=2, skip_batches=10))
    assert len(decoded) == cfg.batch_size  # the windows of the one batch yielded
    assert got.keys == want.keys and torch.equal(got.frames, want.frames)


def _cut(cfg: DataConfig, member: str, at: str) -> None:
    """Cut bad-000000.tar off inside ``member``'s data, or right before its header."""
    path = Path(cfg.train.replace("{000000..000001}", "000000"))
    with tarfile.open(path) as tar:
        info = tar.getmember(member)
    end = info.offset_data + 10 if at == "data" else info.offset
    path.write_bytes(path.read_bytes()[:end])


@pytest.mark.parametrize("at", ["data", "header"])
def test_truncated_shard_raises_or_skips_the_cut_sample(tmp_path: Path, at: str) -> None:
    cfg = _write_shards(tmp_path, [[_sample("a"), _sample("b"), _sample("c")], [_sample("d")]])
    _cut(cfg, "b.000001.jpg", at)
    cfg = replace(cfg, shuffle_buffer=1)
    message = r"bad-000000\.tar sample b: the shard is cut off in this sample"
    with pytest.raises(DataError, match=message):
        _val(cfg)
    with pytest.raises(DataError, match=message) as info:
        list(islice(train_batches(replace(cfg, num_workers=1), seed=0), 4))
    assert "\n" not in str(info.value)

    skip = replace(cfg, on_error=OnError.skip)
    assert [b.keys for b in _val(skip)] == [["a"], ["d"], [""], [""]]  # 4 in index.json
    batches = list(islice(train_batches(skip, seed=0), 6))
    keys = [k for b in batches for k in b.keys]
    assert sorted(keys[:2]) == ["a", "d"] and "c" not in keys  # c lies after the cut
    assert [s for b in batches[:3] for s in b.skipped] == ["bad-000000.tar/b"]


UNEQUAL_SCRIPT = """
import os, sys
from itertools import islice
import torch, torch.distributed as dist
from conftest import report
from distseq.config import DataConfig
from distseq.data import train_batches

dist.init_process_group("gloo")
cfg = DataConfig(train=sys.argv[1], size=32, frames=12, batch_size=1, num_workers=2,
                 shuffle_buffer=1)
batches = []
for batch in islice(train_batches(cfg, seed=3), 12):
    step = torch.ones(1)
    dist.all_reduce(step)  # every rank takes part in every step, or this hangs
    batches.append({"keys": batch.keys, "worker": batch.worker, "ranks": int(step)})
report({"batches": batches})
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # skip interpreter teardown, where gloo can abort
"""


def test_fewer_shards_than_ranks_x_workers(tmp_path: Path) -> None:
    seqs = [encode_sample(key, x, y) for key, x, y in sequences("train", 8, **SYN)]
    root = tmp_path / "data"
    cfg = _write_shards(root, [seqs[:1], seqs[1:3], seqs[3:]])  # 1, 2 and 5 videos
    results = torchrun(UNEQUAL_SCRIPT, 2, tmp_path, cfg.train, timeout=240)
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


def test_workers_reuse_shared_memory_without_touching_held_batches(shards: Path) -> None:
    # Windows of 8 out of 9-14-frame videos: every batch has the same shape, so segments recur.
    cfg = _cfg(shards, frames=8, num_workers=1)
    held = list(islice(train_batches(cfg, seed=3), 10))  # all kept while the worker goes on
    expected = list(islice(train_batches(replace(cfg, num_workers=0), seed=3), 10))
    for got, want in zip(held, expected, strict=True):
        assert got.keys == want.keys and torch.equal(got.frames, want.frames)
        assert got.frames.stride() == want.frames.stride()  # channels last, as decoded
    segments = {b.segment for b in held}
    assert all(worker == 0 for worker, _ in segments)
    assert len(segments) <= 4, segments  # prefetched batches in flight, then reuse
