"""A trained model over new videos of any length, as ``distseq predict`` runs it: per-frame
phase probabilities, one CSV per video (and a PNG ribbon).

A video or a frame folder is made into frames exactly as ``distseq shard`` made the training
frames (frame rate, resize, centre crop, JPEG quality, then the training resize and frame
stride), from the training shards' index.json where it can be read here, or from what is given.
Under torchrun the inputs are split across the ranks.

A causal head that carries state streams: frames go through the model a chunk at a time with the
state carried, so device memory stays that of one chunk whatever the length of the video. A
bidirectional head, or one that carries no state (a TCN, a transformer), cannot stream: the backbone
runs a chunk at a time and keeps only the features, and the head then sees them all, so memory grows
with T by the features (8 KB a frame for ResNet-50 in fp32), not by the frames.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from itertools import islice
from pathlib import Path

import torch

from distseq.checkpoint.export import Loaded
from distseq.data.decode import Video as ShardVideo
from distseq.data.decode import check_sample, decode
from distseq.data.manifest import JPEG_QUALITY, Manifest, find_manifest
from distseq.data.sources import find_sources
from distseq.data.tar import EVERY_SPLIT, expand, is_shard_folder, read_shard
from distseq.data.video import source_frames
from distseq.errors import ConfigError, DataError
from distseq.model.head import Carry, last_stage
from distseq.model.video import VideoModel
from distseq.parallel import DistInfo, all_reduce_sum
from distseq.score.predictions import write_predictions
from distseq.score.ribbon import ribbon


def chunks(frames: Iterable[torch.Tensor], size: int) -> Iterator[torch.Tensor]:
    """uint8 frames [3, H, W] in order -> stacks [1, n <= size, 3, H, W]."""
    batch: list[torch.Tensor] = []
    for frame in frames:
        batch.append(frame)
        if len(batch) == size:
            yield torch.stack(batch)[None]
            batch = []
    if batch:
        yield torch.stack(batch)[None]


@torch.no_grad()
def streamed_probabilities(
    model: VideoModel,
    frames: Iterable[torch.Tensor],
    chunk: int,
    device: torch.device,
    num_classes: int,
) -> torch.Tensor:
    """Per-frame probabilities [T, K=num_classes] (on the CPU) of one video given frame by frame."""
    model.eval()
    if not model.stateful or getattr(model.head, "bidirectional", False):
        # A head that carries no state sees the whole video at once (module docstring).
        feats = [
            model.features(x.to(device), torch.ones(x.shape[:2], dtype=torch.bool, device=device))
            for x in chunks(frames, chunk)
        ]
        if not feats:
            return torch.zeros((0, num_classes))
        all_feats = torch.cat(feats, dim=1)
        mask = torch.ones(all_feats.shape[:2], dtype=torch.bool, device=device)
        return last_stage(model.temporal(all_feats, mask))[0].float().softmax(-1).cpu()
    carry = Carry()
    probs = []
    for x in chunks(frames, chunk):
        mask = torch.ones(x.shape[:2], dtype=torch.bool, device=device)
        probs.append(last_stage(model(x.to(device), mask, carry))[0].float().softmax(-1).cpu())
    return torch.cat(probs) if probs else torch.zeros((0, num_classes))


@dataclass(frozen=True)
class FrameSampling:
    """How frames are made from a video: as distseq shard made the training frames."""

    fps: Fraction | None  # output frames/s; None: unknown, so videos cannot be read
    size: int  # square size of the stored frames
    quality: int
    folder_fps: Fraction | None  # frames/s of frame folders; None: = fps
    unknown_fps: str = ""  # why fps is None, for people


def _training_manifest(loaded: Loaded) -> tuple[Manifest | None, str]:
    """The model's training index.json, or None and why not."""
    data = loaded.config.data
    try:
        return find_manifest(data.train, data.manifest, "data.train"), ""
    except (ConfigError, DataError) as e:  # trained elsewhere: its shards are not here
        return None, f"the model's training index.json is not readable here ({e})"


def frame_sampling(
    loaded: Loaded,
    fps: float | None = None,
    folder_fps: float | None = None,
    size: int = 0,
    quality: int = 0,
) -> FrameSampling:
    """How the model's training frames were sampled: what is given here (None or 0: not given),
    else what its training shards' index.json recorded, else the defaults."""
    trained, unreadable = _training_manifest(loaded)
    why = unreadable or "the model's training index.json records no frame rate"
    fps = fps if fps is not None else (trained.fps if trained else None)
    size = size or (trained.size if trained and trained.size else loaded.config.data.size)
    quality = quality or (trained.quality if trained and trained.quality else JPEG_QUALITY)
    rate = None if fps is None else Fraction(fps).limit_denominator(10_000)
    folder = None if folder_fps is None else Fraction(folder_fps).limit_denominator(10_000)
    return FrameSampling(rate, size, quality, folder, "" if rate else why)


def is_shards(text: str) -> bool:
    """Shards, not videos: a shard, a pattern or a shard folder, or a ``::`` list with one."""
    parts = text.split("::")
    return any(p.endswith(".tar") or "{" in p or is_shard_folder(p) for p in parts)


Video = tuple[str, Iterator[torch.Tensor]]  # name, uint8 frames [3, S, S] at the model's size


def _frames(
    jpegs: Iterator[tuple[int, bytes]], where: str, size: int, stride: int
) -> Iterator[torch.Tensor]:
    """Decoded one at a time, every ``stride``-th, resized as training resized them."""
    for number, jpeg in islice(jpegs, 0, None, stride):
        yield decode([(number, jpeg)], where, size)[0]


def frames_of(video: ShardVideo, size: int) -> Iterator[torch.Tensor]:
    """A shard sample's frames (its kept ones), decoded one at a time at ``size``."""
    return _frames(iter(video.jpegs), video.where, size, 1)


def _check_classes(shards: str, loaded: Loaded, manifest_path: str) -> None:
    """Shards labelled with other classes than the model's: a label would be read as another."""
    try:
        manifest = find_manifest(shards, manifest_path, "INPUT", "--manifest")
    except DataError:  # no index.json beside them: their labels are only range-checked
        if manifest_path:  # but one named and not there is a mistake
            raise
        return
    if manifest.classes != loaded.classes:
        raise ConfigError(
            f"{shards}: its classes {manifest.classes} are not the model's {loaded.classes}"
        )


def videos(
    inputs: list[str], loaded: Loaded, sampling: FrameSampling, manifest: str = ""
) -> Iterator[Video]:
    """Every video of ``inputs``, lazily, in order; ``manifest``: the index.json of the shards
    among them (default: beside them)."""
    data = loaded.config.data
    for item in inputs:
        if is_shards(item):
            _check_classes(item, loaded, manifest)
            for url in expand(item, "INPUT", EVERY_SPLIT):
                for sample in read_shard(url):
                    video = check_sample(sample, len(loaded.classes), data.frame_stride)
                    yield video.key, frames_of(video, data.size)
            continue
        for source in find_sources([Path(item)]):
            if sampling.fps is None:
                raise ConfigError(
                    f"{source.path}: --fps needed: {sampling.unknown_fps}, so the frame rate its "
                    "shards were made at is unknown"
                )
            folder_fps = sampling.folder_fps or sampling.fps
            frames = source_frames(
                source, sampling.fps, folder_fps, sampling.size, sampling.quality
            )
            jpegs = ((k, j) for k, j in frames)
            yield source.stem, _frames(jpegs, str(source.path), data.size, data.frame_stride)


def predict_videos(
    loaded: Loaded,
    inputs: list[str],
    sampling: FrameSampling,
    chunk: int,
    out: Path,
    ribbons: bool,
    info: DistInfo,
    manifest: str = "",
) -> int:
    """This rank's share of the videos of ``inputs`` (every world-th), one CSV each in ``out``
    (``ribbons``: and a PNG); returns how many videos all ranks predicted. ``manifest``: the
    index.json of the shards among the inputs (default: beside them)."""
    out.mkdir(parents=True, exist_ok=True)
    # The frame rate of the rows, for the time column: the made frames, then the stride.
    rate = None if sampling.fps is None else float(sampling.fps) / loaded.config.data.frame_stride
    model = loaded.over_frames().to(info.device)
    done = 0
    for i, (name, frames) in enumerate(videos(inputs, loaded, sampling, manifest)):
        if i % info.world != info.rank:
            continue
        probs = streamed_probabilities(model, frames, chunk, info.device, len(loaded.classes))
        write_predictions(out / f"{name}.csv", probs, loaded.classes, rate)
        if ribbons:
            phases = probs.argmax(-1).tolist()
            ribbon(out / f"{name}.png", {"prediction": phases}, loaded.classes, rate)
        done += 1
    return int(all_reduce_sum(torch.tensor([float(done)], device=info.device)).item())
