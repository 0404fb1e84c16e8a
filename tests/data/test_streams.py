"""Shard format, synthetic data, train/val streams and data errors (tiny sizes, CPU only)."""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import replace
from itertools import islice, pairwise
from pathlib import Path

import pytest
import torch
from torchcodec.encoders import JpegEncoder

from distseq.config import DataConfig
from distseq.data import train_stream
from distseq.data.batch import IGNORE_INDEX, Batch, Part, empty_batch, slices
from distseq.data.manifest import load_manifest
from distseq.data.synthetic import MARKER_FRAMES, encode_sample, sequences, write_synthetic
from distseq.data.tar import Sample, longest_sample, member_key
from distseq.data.train_stream import Resume, resume_problem, train_batches
from distseq.data.val_stream import val_batches
from distseq.errors import DataError
from streams import (
    N_TRAIN,
    N_VAL,
    PER_SHARD,
    SYN,
    Samples,
    label_counts_of,
    sequences_of,
    stream_config,
    write_shards,
)


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

    manifest = load_manifest(stream_config(shards))
    assert manifest.classes == ["phase0", "phase1", "phase2"]
    assert manifest.shards["val-000001.tar"].samples == 2
    for frames, labels in sequences_of("train", N_TRAIN).values():
        assert labels[0] == 0 and labels[-1] == 2 and labels == sorted(labels)
        # Marker frames (bright centre) sit exactly on the first MARKER_FRAMES of each new phase.
        centre = frames[:, :, 14:18, 14:18].float().mean(dim=(1, 2, 3))
        starts = [t for t in range(1, len(labels)) if labels[t] != labels[t - 1]]
        cues = {s + i for s in starts for i in range(MARKER_FRAMES)}
        assert {t for t in range(len(labels)) if centre[t] > 250} == cues


def test_synthetic_index_counts_each_shard_s_labels(shards: Path) -> None:
    manifest = load_manifest(stream_config(shards))
    expected = label_counts_of("train", N_TRAIN) | label_counts_of("val", N_VAL)
    assert {name: info.labels for name, info in manifest.shards.items()} == expected
    first, second = expected["train-000000.tar"], expected["train-000001.tar"]
    assert manifest.label_counts(["train-000000.tar", "train-000001.tar"]) == [
        a + b for a, b in zip(first, second, strict=True)
    ]


@pytest.mark.parametrize(
    ("workers", "order"),
    [(0, [0, 1, 2, 3, 4]), (2, [0, 2, 1, 3, 4])],  # 2 workers: samples 0,2,4 and 1,3, interleaved
)
def test_val_round_trip(shards: Path, workers: int, order: list[int]) -> None:
    cfg = stream_config(shards, num_workers=workers)
    batches = list(val_batches(cfg, load_manifest(cfg)))
    # ceil(5 / 2) in one stream, or ceil(3 / 2) + ceil(2 / 2): the count comes from index.json
    # alone, and here no batch is padding.
    assert len(batches) == 3
    originals = sequences_of("val", N_VAL)
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
    originals = sequences_of("train", N_TRAIN)
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
    cfg = stream_config(shards, num_workers=2)
    batches = list(islice(train_batches(cfg, seed=3), 20))  # 40 samples: over 3 epochs of 12
    _check_windows(batches, cfg.window)
    keys = [k for b in batches for k in b.keys]
    assert len(keys) == 40
    seen = Counter(keys)
    assert set(seen) == set(sequences_of("train", N_TRAIN)) and min(seen.values()) >= 2
    lengths = {len(y) for _, y in sequences_of("train", N_TRAIN).values()}
    assert min(lengths) < cfg.window < max(lengths)  # both cropping and padding happened

    again = list(islice(train_batches(cfg, seed=3), 20))
    assert [b.keys for b in again] == [b.keys for b in batches]
    assert all(torch.equal(a.frames, b.frames) for a, b in zip(again, batches, strict=True))
    other = list(islice(train_batches(cfg, seed=4), 20))
    assert [b.keys for b in other] != [b.keys for b in batches]


@pytest.mark.parametrize("stride", [1, 2])
def test_window_0_gives_whole_videos_of_frames(shards: Path, stride: int) -> None:
    cfg = stream_config(shards, window=0, frame_stride=stride)
    videos = sequences_of("train", N_TRAIN)
    lengths = {key: len(labels[::stride]) for key, (_, labels) in videos.items()}
    batches = list(islice(train_batches(cfg, seed=3), N_TRAIN // 2))
    for batch in batches:
        for i, key in enumerate(batch.keys):
            assert int(batch.mask[i].sum()) == lengths[key], key  # the whole video, every frame
            assert batch.labels[i, : lengths[key]].tolist() == videos[key][1][::stride]
    assert batches[0].frames.shape[1] == max(lengths[k] for k in batches[0].keys)  # padded to it
    # What memory.budget plans for: the longest video, read from the shards' headers alone.
    urls = [f"{shards}/train-{i:06d}.tar" for i in range(4)]
    longest = max(len(labels) for _, labels in videos.values())
    assert longest_sample(urls, "data.train") == longest == SYN["max_frames"]


def _write_shard(root: Path, samples: Samples) -> DataConfig:
    return write_shards(root, [samples])


def _sample(key: str, n: int = 3, labels: list[int] | None = None) -> dict[str, bytes | str]:
    sample: dict[str, bytes | str] = {"__key__": key}
    for t in range(n):
        img = torch.full((3, 16, 16), 40 * t, dtype=torch.uint8)
        sample[f"{t:06d}.jpg"] = JpegEncoder(img).to_tensor(quality=90).numpy().tobytes()
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

    skip = DataConfig(**{**vars(cfg), "on_error": "skip"})
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
    cfg = DataConfig(**{**vars(_write_shard(tmp_path, broken)), "on_error": "skip"})
    with pytest.raises(DataError, match=r"train samples in a row, .*sample [abc]: frame 000000"):
        next(train_batches(cfg, seed=0))


@pytest.mark.parametrize(
    ("key", "frames", "labels", "message"),
    [
        ("short", 3, [0, 1], r"sample short: 2 labels for 3 frames"),
        ("range", 2, [0, 7], r"sample range: label 7 outside the 3"),
        ("negative", 2, [-1, -2], r"sample negative: label -2 outside the 3"),
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


def test_an_unlabelled_frame_is_ignored_by_the_loss_but_kept(tmp_path: Path) -> None:
    (batch,) = _val(_write_shard(tmp_path, [_sample("part", n=3, labels=[-1, 2, -1])]))
    assert batch.labels[0].tolist() == [IGNORE_INDEX, 2, IGNORE_INDEX]
    assert batch.mask[0].tolist() == [True, True, True]  # the frames still reach the model
    assert batch.frames[0, 2].float().mean() > 60  # frame 2 (grey level 80), not padding


def test_missing_shard_or_manifest(shards: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"shard not found: .*train-000004\.tar"):
        train_batches(
            stream_config(shards, train=str(shards / "train-{000000..000009}.tar")), seed=0
        )
    with pytest.raises(DataError, match=r"manifest not found: nope\.json"):
        load_manifest(stream_config(shards, manifest="nope.json"))
    (tmp_path / "train-000000.tar").write_bytes((shards / "train-000000.tar").read_bytes())
    alone = str(tmp_path / "train-000000.tar")
    with pytest.raises(
        DataError, match=re.escape(f"manifest not found: {tmp_path / 'index.json'}")
    ):
        train_batches(stream_config(tmp_path, train=alone), seed=0)


def test_frame_stride_keeps_every_nth_frame(shards: Path) -> None:
    cfg = stream_config(shards, frame_stride=3, num_workers=0)
    originals = sequences_of("val", N_VAL)
    for batch in _val(cfg):
        for row, key in enumerate(batch.keys):
            frames, labels = originals[key]
            n = int(batch.mask[row].sum())
            assert batch.labels[row, :n].tolist() == labels[::3]
            assert (batch.frames[row, :n].float() - frames[::3].float()).abs().mean() < 4.5
    train = stream_config(shards, frame_stride=2, window=4)
    _check_windows(list(islice(train_batches(train, seed=0), 6)), train.window, stride=2)


def test_batch_fields(shards: Path) -> None:
    cfg = stream_config(shards, num_workers=2)
    batches = list(islice(train_batches(cfg, seed=1), 4))
    assert [b.worker for b in batches] == [0, 1, 0, 1]  # DataLoader goes round the workers
    for batch in batches:
        assert batch.skipped == [] and batch.starts.tolist() == [True, True]
        # To a device that every machine has and that the batch is not on yet: every tensor
        # must move, with its shape and dtype, and everything else stay.
        moved = batch.to(torch.device("meta"))
        for name in ("frames", "labels", "mask", "starts"):
            got, was = getattr(moved, name), getattr(batch, name)
            assert got.device.type == "meta" and (got.shape, got.dtype) == (was.shape, was.dtype)
        assert (moved.keys, moved.skipped) == (batch.keys, batch.skipped)
        assert (moved.worker, moved.segment) == (batch.worker, batch.segment)
    assert empty_batch(32).starts.tolist() == [True]  # a padding row starts afresh too


def _padding(batches: list[Batch]) -> int:
    return int((~torch.cat([b.mask.flatten() for b in batches])).sum())


def test_length_buckets_cut_padding_and_lose_nothing(shards: Path) -> None:
    # One bucket per length (frames 14 >= every sequence): no batch needs padding.
    plain = stream_config(shards, window=14)
    bucketed = replace(plain, length_buckets=14)
    unbucketed = list(islice(train_batches(plain, seed=2), 30))
    batches = list(islice(train_batches(bucketed, seed=2), 20))
    assert _padding(batches) == 0 < _padding(unbucketed[:20])
    # Buckets only delay windows: the same windows come out, and the ones still waiting in a
    # bucket are at most (batch_size - 1) per length.
    keys = Counter(k for b in batches for k in b.keys)
    first = [k for b in unbucketed for k in b.keys]
    lengths = {len(y) for _, y in sequences_of("train", N_TRAIN).values()}
    waiting = (plain.batch_size - 1) * len(lengths)
    assert not keys - Counter(first[: 40 + waiting])
    assert (Counter(first[:40]) - keys).total() <= waiting


@pytest.mark.parametrize("workers", [0, 2])
def test_ordered_lanes_walk_through_whole_videos(shards: Path, workers: int) -> None:
    cfg = stream_config(shards, ordered=True, window=4, num_workers=workers)
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
    originals = sequences_of("train", N_TRAIN)
    videos = 0
    for windows in lanes.values():
        assert windows[0][1], "a lane starts with the first window of a video"
        cuts = [i for i, (_, start, _, _) in enumerate(windows) if start] + [len(windows)]
        for begin, end in pairwise(cuts):
            video = windows[begin:end]
            key = video[0][0]
            assert all(k == key for k, *_ in video)
            assert all(len(y) == cfg.window for *_, y in video[:-1])
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
    cfg = write_shards(root, [samples[:3], samples[3:]])
    return replace(cfg, window=6, batch_size=2, shuffle_buffer=3, on_error="skip")


def _resume(batches: list[Batch]) -> Resume:
    """Where a run that took ``batches`` goes on: each worker's position after its last one."""
    return Resume(len(batches), {b.worker: b.position for b in batches if b.position})


def _same(got: list[Batch], want: list[Batch]) -> None:
    assert len(got) == len(want)
    for i, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        assert (mine.keys, mine.skipped, mine.worker) == (
            theirs.keys,
            theirs.skipped,
            theirs.worker,
        )
        for name in ("labels", "mask", "starts", "frames"):
            assert torch.equal(getattr(mine, name), getattr(theirs, name)), (i, name)
        assert mine.position == theirs.position, i


# Random windows, random windows batched by length bucket (windows wait in a worker between
# batches), and ordered lanes (a video carried on across batches).
MODES: dict[str, dict[str, object]] = {
    "random": {},
    "buckets": {"length_buckets": 3, "window": 14},
    "ordered": {"ordered": True},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("workers", [0, 2])
def test_resume_goes_on_with_the_same_batches(tmp_path: Path, workers: int, mode: str) -> None:
    """From the positions its batches carried, bad samples skipped on the way included."""
    cfg = replace(_with_bad_frames(tmp_path), num_workers=workers, **MODES[mode])
    n = 14
    full = list(islice(train_batches(cfg, seed=7), n))
    # Past a skipped sample; in buckets, where windows wait for theirs.
    k = next(
        k
        for k in range(max(5, 1 + next(i for i, b in enumerate(full) if b.skipped)), n)
        if mode != "buckets" or any(p["pending"] for p in _resume(full[:k]).positions.values())
    )
    assert k <= n - 4
    _same(list(islice(train_batches(cfg, seed=7, resume=_resume(full[:k])), n - k)), full[k:])


@pytest.mark.parametrize("mode", ["random", "ordered"])
def test_a_far_resume_costs_what_a_near_one_does(
    shards: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Resumed after 3 batches or after 60 (ten epochs), a stream reads no more samples than its
    position names and its next batches take, and goes on exactly; under a sequence split too,
    where a rank holds its part of the frames."""
    read: list[str] = []
    real = train_stream.read_shard

    def counting(url: str, offset: int = 0) -> Iterator[Sample]:
        for sample in real(url, offset):
            read.append(sample.id)
            yield sample

    monkeypatch.setattr(train_stream, "read_shard", counting)
    cfg = stream_config(shards, window=4, **MODES[mode])
    far, near = 60, 3
    full = list(islice(train_batches(cfg, seed=2), far + 2))
    costs = []
    for k in (near, far):
        read.clear()
        got = list(islice(train_batches(cfg, seed=2, resume=_resume(full[:k])), 2))
        _same(got, full[k : k + 2])
        costs.append(len(read))
        for part in (Part(0, 2, 2), Part(1, 2, 2)):
            mine = list(islice(train_batches(cfg, seed=2, resume=_resume(full[:k]), part=part), 2))
            held = [slice(*slices(b.mask.shape[1], 2, 2)[part.index]) for b in full[k : k + 2]]
            assert [b.keys for b in mine] == [b.keys for b in full[k : k + 2]]
            for b, want, frames in zip(mine, full[k : k + 2], held, strict=True):
                assert torch.equal(b.frames, want.frames[:, frames])
    # The shuffle buffer, the windows or lanes held (a batch's worth at most), and what the two
    # batches take: the same bound at either step (passing over 60 batches read 120 samples).
    bound = cfg.shuffle_buffer + cfg.batch_size + 2 * cfg.batch_size
    assert max(costs) <= bound, costs


def test_a_resume_into_a_rewritten_shard_is_one_line(tmp_path: Path, shards: Path) -> None:
    copy = tmp_path / "shards"
    shutil.copytree(shards, copy)
    cfg = stream_config(copy)
    full = list(islice(train_batches(cfg, seed=2), 3))
    resume = _resume(full)
    urls = sorted(copy.glob("train-*.tar"))
    shard, offset = next((s, o) for s, o in resume.positions[0]["buffer"] if o > 0)
    with tarfile.open(urls[shard]) as tar:  # the shard again, with its first sample alone
        key = member_key(tar.getmembers()[0].name)[0]
        first = [m for m in tar.getmembers() if member_key(m.name)[0] == key]
        kept = [(m, tar.extractfile(m).read()) for m in first]  # type: ignore[union-attr]
    with tarfile.open(urls[shard], "w") as tar:
        for member, data in kept:
            tar.addfile(member, io.BytesIO(data))
    with pytest.raises(DataError) as info:
        next(train_batches(cfg, seed=2, resume=resume))
    assert str(info.value) == (
        f"shard {urls[shard]}: no sample starts at byte {offset}, where the checkpoint's stream "
        "position has one: the shard was rewritten since"
    )


def test_a_resume_from_another_worker_count_says_why_it_starts_anew(shards: Path) -> None:
    cfg = stream_config(shards, num_workers=2)
    full = list(islice(train_batches(cfg, seed=2), 5))
    assert resume_problem(cfg, _resume(full).positions, 5) is None
    assert resume_problem(replace(cfg, num_workers=3), _resume(full).positions, 5) == (
        "it holds no stream position for each of data.num_workers=3"
    )
    fewer = replace(cfg, train=str(shards / "train-{000000..000002}.tar"))
    assert resume_problem(fewer, _resume(full).positions, 5) == (
        "data.train lists other shards than when it was saved"
    )
    larger = replace(cfg, batch_size=3, shuffle_buffer=5)
    assert resume_problem(larger, _resume(full).positions, 5) == (
        "data.batch_size, data.shuffle_buffer changed since it was saved"
    )
    # Anew, a stream does not replay the run's first batches.
    afresh = Resume(5, afresh=":5")
    again = [b.keys for b in islice(train_batches(cfg, seed=2, resume=afresh), 5)]
    assert again != [b.keys for b in full]


def _cut(cfg: DataConfig, member: str, at: str) -> None:
    """Cut bad-000000.tar off inside ``member``'s data, or right before its header."""
    path = Path(cfg.train.replace("{000000..000001}", "000000"))
    with tarfile.open(path) as tar:
        info = tar.getmember(member)
    end = info.offset_data + 10 if at == "data" else info.offset
    path.write_bytes(path.read_bytes()[:end])


@pytest.mark.parametrize("at", ["data", "header"])
def test_truncated_shard_raises_or_skips_the_cut_sample(tmp_path: Path, at: str) -> None:
    cfg = write_shards(tmp_path, [[_sample("a"), _sample("b"), _sample("c")], [_sample("d")]])
    _cut(cfg, "b.000001.jpg", at)
    cfg = replace(cfg, shuffle_buffer=1)
    message = r"bad-000000\.tar sample b: the shard is cut off in this sample"
    with pytest.raises(DataError, match=message):
        _val(cfg)
    with pytest.raises(DataError, match=message) as info:
        list(islice(train_batches(replace(cfg, num_workers=1), seed=0), 4))
    assert "\n" not in str(info.value)

    skip = replace(cfg, on_error="skip")
    assert [b.keys for b in _val(skip)] == [["a"], ["d"], [""], [""]]  # 4 in index.json
    batches = list(islice(train_batches(skip, seed=0), 6))
    keys = [k for b in batches for k in b.keys]
    assert sorted(keys[:2]) == ["a", "d"] and "c" not in keys  # c lies after the cut
    assert [s for b in batches[:3] for s in b.skipped] == ["bad-000000.tar/b"]


@pytest.mark.parametrize("ordered", [False, True])
def test_a_sequence_split_rank_holds_its_part_of_the_batches(shards: Path, ordered: bool) -> None:
    """Under a sequence split each rank of a group gets the group's batches, labels and mask
    whole, and of the frames its slice alone (chunks of 4: 12 frames are 0-3 and 4-11 at S=2,
    0-3, 4-7 and 8-11 at S=3); through loader workers, as runs have them."""
    cfg = stream_config(shards, num_workers=2, ordered=ordered)
    whole = list(islice(train_batches(cfg, seed=1), 4)) + _val(cfg)
    for size in (2, 3):
        for index in range(size):
            part = Part(index, size, 4)
            got = list(islice(train_batches(cfg, seed=1, part=part), 4))
            got += list(val_batches(cfg, load_manifest(cfg), part=part))
            assert len(got) == len(whole)
            for i, (want, mine) in enumerate(zip(whole, got, strict=True)):
                assert mine.keys == want.keys, i
                assert torch.equal(mine.labels, want.labels) and torch.equal(mine.mask, want.mask)
                held = slice(*slices(want.mask.shape[1], 4, size)[index])
                assert torch.equal(mine.frames, want.frames[:, held]), (size, index, i)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_sequence_split_rank_decodes_its_part_alone(tmp_path: Path, workers: int) -> None:
    """A bad frame in the second half of a video stops the rank whose slice holds it, and only
    that one: the other never decodes it. With on_error=skip both decode every frame, and skip
    the same video, so the group's batches stay one."""
    bad = _sample("broken", n=6)
    bad["000005.jpg"] = b"this is not a jpeg"
    cfg = _write_shard(tmp_path, [_sample("a", n=6), bad, _sample("b", n=6)])
    cfg = DataConfig(**{**vars(cfg), "num_workers": workers, "window": 6})
    first, second = Part(0, 2, 4), Part(1, 2, 4)
    for name, batches in (
        ("val", lambda part: _val_part(cfg, part)),
        ("train", lambda part: list(islice(train_batches(cfg, seed=0, part=part), 3))),
    ):
        assert "broken" in {k for b in batches(first) for k in b.keys}, name
        with pytest.raises(DataError, match=r"sample broken: frame 000005\.jpg"):
            batches(second)
    skip = DataConfig(**{**vars(cfg), "on_error": "skip"})
    for part in (first, second):
        keys = [b.keys for b in _val_part(skip, part)]
        assert keys == [["a"], ["b"], [""]], part


def _val_part(cfg: DataConfig, part: Part) -> list[Batch]:
    return list(val_batches(cfg, load_manifest(cfg), part=part))
