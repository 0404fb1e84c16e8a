"""``distseq bench heads``: the temporal heads side by side, and MS-TCN three ways.

1. Each head over one video's features [1, T, F]: the peak memory and time of a training step
   (forward and backward of its loss) at each T, with the head sizes of configs/.
2. MS-TCN on features of a released dataset's shapes (simulated, 50Salads-like lengths), as
   distseq trains it (the release imported into feature shards, read by its loader, its step and
   loss) against a plain PyTorch loop of the same model and loss over the arrays in memory, as
   MS-TCN's code trains: one epoch each, and the peak memory of a step on the longest video.
3. MS-TCN end to end behind the chunked CNN at T frames, against the plain model's step.

Numbers, not pass/fail: compare rows of one run, since the machine is noisy.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from distseq.bench.memory import random_sequence
from distseq.config import (
    BackboneConfig,
    DataConfig,
    HeadConfig,
    LossConfig,
    MemoryConfig,
    ModelConfig,
    Norm,
    Recompute,
)
from distseq.data.manifest import load_manifest
from distseq.data.val_stream import val_batches
from distseq.memory.measure import measure_step, peak_and_seconds, peak_memory
from distseq.memory.policy import apply_memory_policy
from distseq.model.head import build_head, head_logits, is_stateful
from distseq.model.video import FeatureModel, build_model
from distseq.shard.released import import_release
from distseq.train.loss import Loss
from distseq.train.step import train_step
from distseq.units import MIB

# The heads at the sizes their configs train (configs/*.yaml).
HEADS = {
    "lstm": HeadConfig(kind="lstm", hidden=512),
    "mstcn": HeadConfig(kind="mstcn", stages=4, layers=10, hidden=64, dropout=0.5),
    "mstcn-causal": HeadConfig(
        kind="mstcn", stages=4, layers=10, hidden=64, dropout=0.5, causal=True
    ),
    "transformer": HeadConfig(kind="transformer", hidden=256, layers=4, span=128),
    "transformer-causal": HeadConfig(
        kind="transformer", hidden=256, layers=4, span=128, causal=True
    ),
}
MSTCN = HEADS["mstcn"]
SMOOTHING = LossConfig(smoothing=0.15)  # MS-TCN's loss
CPU = torch.device("cpu")


@dataclass(frozen=True)
class HeadsBench:
    """One ``bench heads`` run: its options, as the command line gives them."""

    frames: list[int]
    feature_dim: int
    classes: int
    videos: int
    min_frames: int
    max_frames: int
    end_to_end_frames: int
    backbone: str
    size: int
    chunk: int
    json: bool


@dataclass
class HeadRecord:
    head: str
    frames: int
    peak_bytes: int
    step_seconds: float


@dataclass
class EpochRecord:
    way: str  # distseq or plain
    videos: int
    frames: int
    epoch_seconds: float  # the steps after the first (thread pools, allocator: a warm-up)
    frames_per_second: float  # of those steps
    peak_bytes: int  # a step on the longest video


def bench_head(
    name: str, cfg: HeadConfig, frames: int, feature_dim: int, num_classes: int
) -> HeadRecord:
    """One training step of the head ``cfg`` over one video of random features."""
    torch.manual_seed(0)
    head = build_head(feature_dim, cfg, num_classes)
    loss = Loss(SMOOTHING if cfg.kind == "mstcn" else LossConfig(), None)
    feats = torch.randn(1, frames, feature_dim)
    labels = torch.randint(0, num_classes, (1, frames))
    mask = torch.ones(1, frames, dtype=torch.bool)
    stateful = is_stateful(head)

    def step() -> None:
        logits = head_logits(head, stateful, feats, mask, None)
        ce, smooth = loss.sums(logits, labels, mask)
        loss.total(ce, smooth, loss.counts(labels, mask)).backward()
        head.zero_grad(set_to_none=True)

    step()  # warm-up
    peak, seconds = peak_and_seconds(step, CPU)
    return HeadRecord(name, frames, peak, seconds)


def simulated_release(
    root: Path, *, videos: int, feature_dim: int, num_classes: int, min_frames: int, max_frames: int
) -> None:
    """A release of MS-TCN's layout: ``videos`` training videos (and one test video) of random
    features, their lengths drawn from [min_frames, max_frames], labelled in segments."""
    rng = np.random.default_rng(0)
    for sub in ("features", "groundTruth", "splits"):
        (root / sub).mkdir(parents=True)
    names = [f"action{k}" for k in range(num_classes)]
    (root / "mapping.txt").write_text("".join(f"{k} {c}\n" for k, c in enumerate(names)))
    stems = [f"video{i:03d}" for i in range(videos + 1)]
    for stem in stems:
        t = int(rng.integers(min_frames, max_frames + 1))
        feats = rng.standard_normal((feature_dim, t), dtype=np.float32)
        np.save(root / "features" / f"{stem}.npy", feats)
        cuts = np.sort(rng.choice(np.arange(1, t), size=min(num_classes, t) - 1, replace=False))
        ids = np.repeat(rng.permutation(num_classes)[: len(cuts) + 1], np.diff([0, *cuts, t]))
        (root / "groundTruth" / f"{stem}.txt").write_text("".join(names[k] + "\n" for k in ids))
    bundle = "".join(f"{n}.txt\n" for n in stems[:-1])
    (root / "splits" / "train.split1.bundle").write_text(bundle)
    (root / "splits" / "test.split1.bundle").write_text(f"{stems[-1]}.txt\n")


def _adam(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=5e-4)  # MS-TCN's


def mstcn_code_loss(stages: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """MS-TCN's loss as its train.py computes it for a batch of fully labelled videos of one
    length, from logits [S, B, T, K]: each stage's cross-entropy plus 0.15 x its smoothing
    term, summed."""
    loss = torch.zeros((), device=stages.device)
    for p in stages.transpose(2, 3):  # MS-TCN's layout: [B, K, T]
        loss = loss + F.cross_entropy(p.transpose(2, 1).reshape(-1, p.shape[1]), labels.view(-1))
        loss = loss + 0.15 * torch.mean(
            torch.clamp(
                F.mse_loss(
                    F.log_softmax(p[:, :, 1:], dim=1),
                    F.log_softmax(p.detach()[:, :, :-1], dim=1),
                    reduction="none",
                ),
                min=0,
                max=16,
            )
        )
    return loss


class _EpochTimer:
    """An epoch's frames and time, the first step left out of the time (a warm-up)."""

    def __init__(self) -> None:
        self.videos = self.frames = self.timed_frames = 0
        self.start = self.end = 0.0

    def step(self, frames: int) -> None:
        """After each step, with its video's frames."""
        self.videos += 1
        self.frames += frames
        self.end = time.perf_counter()
        if self.videos == 1:
            self.start = self.end
        else:
            self.timed_frames += frames

    def record(self, way: str, peak: int) -> EpochRecord:
        seconds = self.end - self.start
        rate = self.timed_frames / max(seconds, 1e-9)
        return EpochRecord(way, self.videos, self.frames, seconds, rate, peak)


def distseq_epoch(shards: Path, args: HeadsBench) -> EpochRecord:
    """One epoch of MS-TCN as distseq trains it: its loader over the imported shards, its step
    and loss; and a step's peak on the longest video."""
    torch.manual_seed(0)
    model = FeatureModel(build_head(args.feature_dim, MSTCN, args.classes), args.feature_dim)
    optimizer, loss = _adam(model), Loss(SMOOTHING, None)
    urls = "::".join(str(p) for p in sorted(shards.glob("train-*.tar")))
    # Each video once, in order, as the plain loop reads them: the loader's epoch-by-epoch
    # stream (val_batches); training's own draws from a shuffled endless stream. In the training
    # process, as the plain loop reads: on 2 cores a loader process takes the step's second
    # thread (measured: a 40% longer epoch).
    data = DataConfig(train=urls, val=urls, features=True, window=0, batch_size=1, num_workers=0)
    timer = _EpochTimer()
    longest = None
    for batch in val_batches(data, load_manifest(data)):
        train_step(model, optimizer, [batch], 1, None, loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timer.step(int(batch.mask.sum()))
        if longest is None or batch.mask.shape[1] > longest.mask.shape[1]:
            longest = batch
    assert longest is not None

    def step() -> None:
        train_step(model, optimizer, [longest], 1, None, loss)
        optimizer.zero_grad(set_to_none=True)

    return timer.record("distseq", peak_memory(step, CPU))


def plain_epoch(root: Path, args: HeadsBench) -> EpochRecord:
    """One epoch of the same model and loss as MS-TCN's code trains them: each video's .npy and
    ground truth read for its step, the loss written out as in MS-TCN's train.py."""
    torch.manual_seed(0)
    model = build_head(args.feature_dim, MSTCN, args.classes)
    optimizer = _adam(model)
    ids = {line.split()[1]: int(line.split()[0]) for line in (root / "mapping.txt").open()}
    names = (root / "splits" / "train.split1.bundle").read_text().split()

    def load(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        stem = name.removesuffix(".txt")
        feats = torch.from_numpy(np.load(root / "features" / f"{stem}.npy"))
        labels = [ids[c] for c in (root / "groundTruth" / name).read_text().split()]
        return feats.T[None], torch.tensor(labels)[None]

    def step(feats: torch.Tensor, labels: torch.Tensor) -> None:
        mask = torch.ones(labels.shape, dtype=torch.bool)
        mstcn_code_loss(model(feats, mask), labels).backward()

    timer = _EpochTimer()
    for name in names:
        feats, labels = load(name)
        step(feats, labels)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timer.step(labels.shape[1])
    longest = max((load(n) for n in names), key=lambda fl: fl[1].shape[1])

    def longest_step() -> None:
        step(*longest)
        optimizer.zero_grad(set_to_none=True)

    return timer.record("plain", peak_memory(longest_step, CPU))


def end_to_end(args: HeadsBench, recompute: Recompute) -> HeadRecord:
    """MS-TCN behind ``args.backbone`` over one video of ``end_to_end_frames`` frames."""
    torch.manual_seed(0)
    cfg = ModelConfig(BackboneConfig(args.backbone, norm=Norm.groupnorm), replace(MSTCN, dropout=0))
    memory = MemoryConfig(recompute=recompute, chunk_frames=args.chunk)
    model = apply_memory_policy(build_model(cfg, args.classes), memory)
    x, mask, labels = random_sequence(args.end_to_end_frames, args.size, CPU, args.classes)
    cost = measure_step(model, x, mask, labels)
    return HeadRecord(
        f"{args.backbone}+mstcn {recompute.value}", len(labels[0]), cost.peak_bytes, cost.seconds
    )


def bench_heads(args: HeadsBench) -> tuple[list[HeadRecord], list[EpochRecord], list[HeadRecord]]:
    heads = [
        bench_head(name, cfg, t, args.feature_dim, args.classes)
        for t in args.frames
        for name, cfg in HEADS.items()
    ]
    _print_heads(heads, args, f"Heads over {args.feature_dim} features a frame, one video, CPU")
    with tempfile.TemporaryDirectory() as tmp:
        root, shards = Path(tmp) / "release", Path(tmp) / "shards"
        simulated_release(
            root,
            videos=args.videos,
            feature_dim=args.feature_dim,
            num_classes=args.classes,
            min_frames=args.min_frames,
            max_frames=args.max_frames,
        )
        import_release(root, 1, shards)
        epochs = [distseq_epoch(shards, args), plain_epoch(root, args)]
    _print_epochs(epochs, args)
    chunked = [end_to_end(args, Recompute.none), end_to_end(args, Recompute.torch)]
    _print_heads(chunked, args, f"MS-TCN end to end, {args.size}px, chunk {args.chunk}, CPU")
    return heads, epochs, chunked


def _print_heads(records: list[HeadRecord], args: HeadsBench, title: str) -> None:
    if args.json:
        for rec in records:
            print(json.dumps(asdict(rec)), flush=True)
        return
    print(title)
    print(f"{'head':>28} {'T':>6} {'peak MiB':>10} {'step s':>8}")
    for rec in records:
        print(
            f"{rec.head:>28} {rec.frames:>6} {rec.peak_bytes / MIB:>10.1f} {rec.step_seconds:>8.3f}"
        )
    print(flush=True)


def _print_epochs(records: list[EpochRecord], args: HeadsBench) -> None:
    if args.json:
        for rec in records:
            print(json.dumps(asdict(rec)), flush=True)
        return
    print(
        f"MS-TCN, one epoch of {args.videos} videos of {args.min_frames}-{args.max_frames} frames"
    )
    print(f"{'way':>8} {'frames':>8} {'epoch s':>8} {'frames/s':>9} {'peak MiB':>10}")
    for rec in records:
        print(
            f"{rec.way:>8} {rec.frames:>8} {rec.epoch_seconds:>8.2f} "
            f"{rec.frames_per_second:>9.0f} {rec.peak_bytes / MIB:>10.1f}"
        )
    print(flush=True)
