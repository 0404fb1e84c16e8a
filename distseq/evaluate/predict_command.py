"""``distseq predict MODEL INPUT... --out DIR``: per-frame phases of videos, frame folders or
shards, streamed (``predict.py``), one CSV each (``--ribbon``: and a PNG).

A video or a frame folder is made into frames exactly as ``distseq shard`` made the training
frames (frame rate, resize, centre crop, JPEG quality, then the training resize and frame
stride), from the training shards' index.json where it can be read here, or from the options.
Under torchrun the inputs are split across the ranks.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from itertools import islice
from pathlib import Path

import torch

from distseq.checkpoint.export import Loaded, load_model
from distseq.data.decode import decode, validate
from distseq.data.format import Manifest, find_manifest
from distseq.data.tar import expand, read_shard
from distseq.errors import ConfigError, DataError
from distseq.evaluate.outputs import write_predictions
from distseq.evaluate.plots import ribbon
from distseq.evaluate.predict import video_probabilities
from distseq.parallel import all_reduce_sum, close_distributed, init_distributed
from distseq.shard.encode import FolderFrames, VideoFrames
from distseq.shard.sources import find_sources

DEFAULT_QUALITY = 90  # distseq shard's


@dataclass(frozen=True)
class Making:
    """How frames are made from a video: as distseq shard made the training frames."""

    fps: Fraction | None  # output frames/s; None: unknown, so videos cannot be read
    size: int  # square size of the stored frames
    quality: int
    folder_fps: Fraction | None  # frames/s of frame folders; None: = fps


def _training_manifest(loaded: Loaded) -> Manifest | None:
    data = loaded.config.data
    try:
        return find_manifest(data.train, data.manifest, "data.train")
    except (ConfigError, DataError):  # trained elsewhere: its shards are not here
        return None


def making(loaded: Loaded, args: argparse.Namespace) -> Making:
    trained = _training_manifest(loaded)
    fps = args.fps if args.fps is not None else (trained.fps if trained else None)
    size = args.size or (trained.size if trained and trained.size else loaded.config.data.size)
    quality = args.quality or (trained.quality if trained and trained.quality else DEFAULT_QUALITY)
    rate = None if fps is None else Fraction(fps).limit_denominator(10_000)
    folder = (
        None if args.folder_fps is None else Fraction(args.folder_fps).limit_denominator(10_000)
    )
    return Making(rate, size, quality, folder)


def _is_shards(text: str) -> bool:
    return text.endswith(".tar") or "{" in text


Video = tuple[str, Iterator[torch.Tensor]]  # name, uint8 frames [3, S, S] at the model's size


def _frames(
    jpegs: Iterator[tuple[int, bytes]], where: str, size: int, stride: int
) -> Iterator[torch.Tensor]:
    """Decoded one at a time, every ``stride``-th, resized as training resized them."""
    for number, jpeg in islice(jpegs, 0, None, stride):
        yield decode([(number, jpeg)], where, size)[0]


def _check_classes(shards: str, loaded: Loaded) -> None:
    """Shards labelled with other classes than the model's: a label would be read as another."""
    try:
        manifest = find_manifest(shards, "", "INPUT")
    except DataError:  # no index.json beside them: their labels are only range-checked
        return
    if manifest.classes != loaded.classes:
        raise ConfigError(
            f"{shards}: its classes {manifest.classes} are not the model's {loaded.classes}"
        )


def videos(inputs: list[str], loaded: Loaded, how: Making) -> Iterator[Video]:
    """Every video of ``inputs``, lazily, in order."""
    data = loaded.config.data
    for item in inputs:
        if _is_shards(item):
            _check_classes(item, loaded)
            for url in expand(item, "INPUT"):
                for sample in read_shard(url):
                    video = validate(sample, len(loaded.classes), data.frame_stride)
                    yield video.key, _frames(iter(video.jpegs), video.where, data.size, 1)
            continue
        for source in find_sources([Path(item)]):
            if how.fps is None:
                raise ConfigError(
                    f"{source.path}: --fps needed: the model's training index.json is not "
                    "readable here, so the frame rate its shards were made at is unknown"
                )
            frames: VideoFrames | FolderFrames
            if source.is_folder:
                rate = how.folder_fps or how.fps
                frames = FolderFrames(source.path, rate, how.fps, how.size, how.quality)
            else:
                frames = VideoFrames(source.path, how.fps, how.size, how.quality)
            jpegs = ((k, j) for k, j in frames)
            yield source.stem, _frames(jpegs, str(source.path), data.size, data.frame_stride)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("predict", help="per-frame phases of videos, frame folders or shards")
    p.add_argument("model", help="exported .pt (safe to share), run directory or checkpoint")
    p.add_argument("inputs", nargs="+", help="video files, frame folders, folders, or shards")
    p.add_argument("--out", required=True, help="folder for <video>.csv (and .png)")
    p.add_argument("--fps", type=float, default=None, help="frames/s; default: training index.json")
    p.add_argument("--folder-fps", type=float, default=None, help="of frame folders (= --fps)")
    p.add_argument("--size", type=int, default=0, help="stored square size; default: as trained")
    p.add_argument("--quality", type=int, default=0, help="JPEG quality; default: as trained")
    p.add_argument(
        "--chunk", type=int, default=0, help="frames per forward; default: memory.chunk_frames"
    )
    p.add_argument("--ribbon", action="store_true", help="also a PNG ribbon of the phases")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    loaded = load_model(Path(args.model))
    how = making(loaded, args)
    chunk = args.chunk or loaded.config.memory.chunk_frames
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # The frame rate of the rows, for the time column: the made frames, then the stride.
    rate = None if how.fps is None else float(how.fps) / loaded.config.data.frame_stride
    info = init_distributed()
    try:
        model = loaded.model.to(info.device)
        done = 0
        for i, (name, frames) in enumerate(videos(args.inputs, loaded, how)):
            if i % info.world != info.rank:
                continue
            probs = video_probabilities(model, frames, chunk, info.device)
            write_predictions(out / f"{name}.csv", probs, loaded.classes, rate)
            if args.ribbon:
                phases = probs.argmax(-1).tolist()
                ribbon(out / f"{name}.png", {"prediction": phases}, loaded.classes, rate)
            done += 1
        total = int(all_reduce_sum(torch.tensor([float(done)], device=info.device)).item())
    finally:
        close_distributed()
    if info.is_main:
        print(f"predicted {total} videos into {out}")
