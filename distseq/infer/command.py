"""``distseq predict`` and ``features``: a trained model run over new videos, frame folders or
shards, its frames made as its training frames were. Their options, and each a thin run over the
library (``predict``, ``features``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TypeAlias

from distseq.checkpoint.export import Loaded, load_model
from distseq.config import Norm
from distseq.errors import ConfigError
from distseq.files import output_folder
from distseq.infer.features import FORMATS, named_backbone, write_features
from distseq.infer.predict import FrameSampling, frame_sampling, predict_videos
from distseq.parallel import close_distributed, init_distributed

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_parser(sub: Subparsers) -> None:
    p = _model_over_videos(sub, "predict", "per-frame phases of videos, frame folders or shards")
    p.add_argument("--ribbon", action="store_true", help="also a PNG ribbon of the phases")
    p.set_defaults(run=run_predict)

    p = _model_over_videos(
        sub, "features", "per-frame backbone features once: feature shards, or <video>.npy", "*"
    )
    p.add_argument(
        "--format",
        default="shards",
        choices=FORMATS,
        help="shards: from shards, for data.features=true; npy: (features, frames) per video",
    )
    p.add_argument(
        "--backbone",
        default="",
        help="a torchvision backbone by name instead of MODEL: every positional is an input",
    )
    p.add_argument("--weights", default="", help="--backbone's weights: IMAGENET1K_V2 or a file")
    p.add_argument(
        "--norm", default="frozen_bn", choices=[n.value for n in Norm], help="--backbone's norm"
    )
    p.set_defaults(run=run_features)


def _model_over_videos(
    sub: Subparsers, name: str, what: str, inputs: str = "+"
) -> argparse.ArgumentParser:
    """The options of a model run over videos whose frames are made as its training frames were
    (``predict`` and ``features``); ``inputs``: their nargs."""
    p = sub.add_parser(name, help=what)
    p.add_argument("model", help="exported .pt (safe to share), run directory or checkpoint")
    p.add_argument(
        "inputs",
        nargs=inputs,
        help="video files, frame folders, folders of them, shards, or a shard folder",
    )
    p.add_argument("--out", required=True, type=Path, help="folder for one file per video")
    p.add_argument(
        "--manifest",
        default="",
        help="index.json of the shard inputs (remote shards need it); default: beside them",
    )
    p.add_argument("--fps", type=float, default=None, help="frames/s; default: training index.json")
    p.add_argument("--folder-fps", type=float, default=None, help="of frame folders (= --fps)")
    p.add_argument("--size", type=int, default=0, help="stored square size; default: as trained")
    p.add_argument("--quality", type=int, default=0, help="JPEG quality; default: as trained")
    p.add_argument(
        "--chunk", type=int, default=0, help="frames per forward; default: memory.chunk_frames"
    )
    return p


def _model_and_frames(
    args: argparse.Namespace, loaded: Loaded | None = None
) -> tuple[Loaded, FrameSampling, int]:
    """The model of ``_model_over_videos``' options (or ``loaded``), its frame sampling, and the
    chunk size."""
    loaded = loaded or load_model(Path(args.model))
    sampling = frame_sampling(loaded, args.fps, args.folder_fps, args.size, args.quality)
    return loaded, sampling, args.chunk or loaded.config.memory.chunk_frames


def run_predict(args: argparse.Namespace) -> None:
    output_folder(args.out)
    loaded, sampling, chunk = _model_and_frames(args)
    info = init_distributed()
    if info.is_main:
        print(f"model {args.model}: {loaded.which}")
    try:
        total = predict_videos(
            loaded, args.inputs, sampling, chunk, args.out, args.ribbon, info, args.manifest
        )
    finally:
        close_distributed()
    if info.is_main:
        print(f"predicted {total} videos into {args.out}")


def run_features(args: argparse.Namespace) -> None:
    output_folder(args.out)
    named = None
    if args.backbone:  # no MODEL: the first positional is an input too
        args.inputs = [args.model, *args.inputs]
        named = named_backbone(
            args.backbone, args.weights, args.norm, args.inputs, args.size, args.manifest
        )
    elif not args.inputs:
        raise ConfigError("distseq features: give the inputs after MODEL (or --backbone NAME)")
    loaded, sampling, chunk = _model_and_frames(args, named)
    info = init_distributed()
    if info.is_main and loaded.which:
        print(f"model {args.model}: {loaded.which}")
    try:
        done = write_features(
            loaded, args.inputs, sampling, chunk, args.out, info, args.format, args.manifest
        )
    finally:
        close_distributed()
    if info.is_main:
        speed = (
            f", {done.frames / done.seconds:.1f} frames/s in the backbone" if done.seconds else ""
        )
        print(
            f"wrote {done.videos} videos ({done.frames} frames) into {args.out}, "
            f"{done.skipped} {'shards' if args.format == 'shards' else 'videos'} already there"
            f"{speed}"
        )
