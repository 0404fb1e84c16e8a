"""``distseq export``: one consolidated model file from a sharded checkpoint, no process group.

The file is a plain dict that ``torch.load(path, weights_only=True)`` reads::

    {"model": state_dict, "config": resolved config, "classes": [...], "step": n}

``load_exported`` rebuilds the model from it.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from distseq.checkpoint import (
    TrainingError,
    load_sharded,
    read_meta,
    resolve_checkpoint,
    unreadable,
)
from distseq.config import Config
from distseq.memory import apply_memory_policy
from distseq.model import VideoModel, build_model


def _config(saved: dict[str, Any], where: Path) -> Config:
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), saved))
    except OmegaConfBaseException as e:
        raise TrainingError(f"{where}: config does not fit this distseq: {e.msg}") from None
    assert isinstance(cfg, Config)
    return cfg


def _empty_model(cfg: Config, classes: list[str]) -> VideoModel:
    """The trained structure, memory policy included, so that the state dict keys match."""
    # The weights file only initialises the backbone, and may be long gone.
    model_cfg = replace(cfg.model, backbone=replace(cfg.model.backbone, weights=""))
    return apply_memory_policy(build_model(model_cfg, len(classes)), cfg.memory)


def export(source: Path, out: Path) -> Path:
    path = resolve_checkpoint(source)
    meta = read_meta(path)
    model = _empty_model(_config(meta["config"], path), meta["classes"])
    load_sharded({"model": model.state_dict()}, path)  # into the model's own tensors
    out.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "model": model.state_dict(),
        "config": meta["config"],
        "classes": meta["classes"],
        "step": meta["position"]["step"],
    }
    torch.save(blob, out)
    return out


def load_exported(path: Path) -> tuple[VideoModel, Config, list[str]]:
    """The exported model in eval mode, its config and its class names."""
    try:
        blob = torch.load(path, weights_only=True)
    except Exception as e:  # a missing, truncated or foreign file: any error torch.load raises
        raise unreadable("exported model", path, e) from None
    cfg = _config(blob["config"], path)
    model = _empty_model(cfg, blob["classes"])
    model.load_state_dict(blob["model"])
    return model.eval(), cfg, blob["classes"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("export", help="write one consolidated model file from a checkpoint")
    parser.add_argument(
        "checkpoint", help="run directory, its checkpoints/, a latest file or a step_N directory"
    )
    parser.add_argument("--out", required=True, help="the .pt file to write")


def run(args: argparse.Namespace) -> None:
    out = export(Path(args.checkpoint), Path(args.out))
    print(f"wrote {out}")
