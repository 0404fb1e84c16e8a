"""Per-sequence augmentation: one draw per sequence, the same for all of its frames."""

from __future__ import annotations

import json
import random
from itertools import islice
from pathlib import Path

import torch
import webdataset as wds
from torchcodec.encoders import JpegEncoder
from torchvision.transforms.v2.functional import resize

from distseq.config import AugmentConfig, DataConfig
from distseq.data.augment import Params, apply, draw
from distseq.data.batch import Batch
from distseq.data.train_stream import train_batches

ALL = AugmentConfig(crop_scale=0.3, flip=True, brightness=0.4, contrast=0.4, saturation=0.4)


def _coordinates(t: int, height: int = 48, width: int = 40) -> torch.Tensor:
    """A frame whose red is its row, green its column and blue the frame number times 20."""
    rows = torch.arange(height).view(height, 1).expand(height, width)
    cols = torch.arange(width).view(1, width).expand(height, width)
    return torch.stack([rows, cols, torch.full_like(rows, 20 * t)]).to(torch.uint8)


def test_every_frame_gets_the_same_crop_flip_and_colour() -> None:
    rng = random.Random(0)
    noise = torch.randint(0, 256, (3, 48, 40), generator=torch.Generator().manual_seed(0))
    same = noise.to(torch.uint8).expand(5, 3, 48, 40)
    for _ in range(10):
        out = apply(same, draw(ALL, rng, 48, 40), 32)
        assert out.shape == (5, 3, 32, 32) and out.dtype == torch.uint8
        assert (out == out[0]).all()  # identical frames stay identical

    # Crop and flip only, on frames that show where each pixel came from: every frame shows the
    # same box, the drawn one, and frame t's own blue.
    geometry = AugmentConfig(crop_scale=0.3, flip=True)
    frames = torch.stack([_coordinates(t) for t in range(4)])
    flips = set()
    for _ in range(10):
        params = draw(geometry, rng, 48, 40)
        out = apply(frames, params, 32).int()
        assert (out[:, :2] == out[0, :2]).all()
        assert [int(x) for x in out[:, 2, 0, 0]] == [0, 20, 40, 60]
        rows, cols = out[0, 0], out[0, 1]
        assert params.top <= rows.min() and rows.max() <= params.top + params.height - 1
        assert params.left <= cols.min() and cols.max() <= params.left + params.width - 1
        assert (cols[:, 0] > cols[:, -1]).all() == params.flip
        flips.add(params.flip)
    assert flips == {False, True}


def test_draws_differ_between_sequences_and_stay_in_range() -> None:
    rng = random.Random(1)
    draws = [draw(ALL, rng, 48, 40) for _ in range(50)]
    assert len(set(draws)) == 50
    for p in draws:
        assert 0 <= p.top <= 48 - p.height and 0 <= p.left <= 40 - p.width
        assert p.height * p.width >= 0.3 * 48 * 40 - 48 - 40  # crop_scale, up to rounding
        for factor in (p.brightness, p.contrast, p.saturation):
            assert 0.6 <= factor <= 1.4
    assert {p.flip for p in draws} == {False, True}
    assert draws[:5] == [draw(ALL, r, 48, 40) for r in [random.Random(1)] for _ in range(5)]


def test_defaults_are_a_pure_resize() -> None:
    rng = random.Random(2)
    before = rng.getstate()
    params = draw(AugmentConfig(), rng, 48, 40)
    assert params == Params(0, 0, 48, 40) and rng.getstate() == before  # nothing drawn
    frames = torch.randint(0, 256, (3, 3, 48, 40), dtype=torch.uint8)
    want = torch.stack([resize(f, [32, 32], antialias=True) for f in frames])
    assert torch.equal(apply(frames, params, 32), want)
    assert apply(frames[:, :, :32, :32], Params(0, 0, 32, 32), 32).data_ptr() == frames.data_ptr()


def _static_videos(root: Path, count: int = 4, frames: int = 6) -> DataConfig:
    """One shard of videos that never move: every frame of one is the same random image."""
    root.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(3)
    with wds.TarWriter(str(root / "static-000000.tar"), encoder=False) as sink:
        for i in range(count):
            image = torch.randint(0, 256, (3, 48, 48), generator=g, dtype=torch.uint8)
            jpeg = JpegEncoder(image).to_tensor(quality=90).numpy().tobytes()
            sample: dict[str, bytes | str] = {"__key__": f"static-{i}"}
            sample.update({f"{t:06d}.jpg": jpeg for t in range(frames)})
            sample["labels.json"] = json.dumps({"labels": [0] * frames}).encode()
            sink.write(sample)
    info = {"split": "train", "samples": count, "frames": count * frames}
    index = {"format": 1, "classes": ["c0"], "shards": {"static-000000.tar": info}}
    (root / "index.json").write_text(json.dumps(index))
    return DataConfig(
        train=str(root / "static-000000.tar"), size=32, window=4, batch_size=2, num_workers=0
    )


def _rows(batches: list[Batch]) -> list[tuple[str, torch.Tensor]]:
    return [(key, b.frames[row]) for b in batches for row, key in enumerate(b.keys)]


def test_augmentation_through_the_loader(tmp_path: Path) -> None:
    plain = _static_videos(tmp_path)
    augmented = DataConfig(**{**vars(plain), "augment": ALL})
    rows = _rows(list(islice(train_batches(augmented, seed=0), 8)))
    again = _rows(list(islice(train_batches(augmented, seed=0), 8)))
    assert all(k == j and torch.equal(x, y) for (k, x), (j, y) in zip(rows, again, strict=True))
    for _, frames in rows:
        assert frames.shape == (4, 3, 32, 32)
        assert (frames == frames[0]).all()  # one draw for the whole window
    # Every occurrence of a video gets its own draw, none the identity.
    originals = dict(_rows(list(islice(train_batches(plain, seed=0), 2))))
    for key in originals:
        seen = [x for k, x in rows if k == key]
        assert len(seen) >= 2
        assert not torch.equal(seen[0], seen[1])
        assert not any(torch.equal(x, originals[key]) for x in seen)
