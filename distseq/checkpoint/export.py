"""One consolidated model file from a sharded checkpoint, no process group (``distseq export``),
and loading a model from either.

The file is a plain dict that ``torch.load(path, weights_only=True)`` reads::

    {"format": 3, "model": state_dict, "config": resolved config, "classes": [...], "step": n}

Its state-dict keys are those of a plain ``build_model`` (``distseq.model.video``): the model
loads with ``load_state_dict(strict=True)`` without any memory policy. Being a file of tensors and
plain data, it is the form in which a model is safe to accept from someone else; a sharded
checkpoint directory is not (DCP unpickles its ``.metadata``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from distseq.checkpoint.sharded import (
    FORMAT,
    latest_checkpoint,
    load_sharded,
    read_meta,
    resolve_checkpoint,
    unreadable,
)
from distseq.config import Config, from_dict, to_dict
from distseq.errors import ConfigError, TrainingError
from distseq.model.video import FeatureModel, VideoModel, build_feature_model, build_model


def empty_model(cfg: Config, classes: list[str]) -> VideoModel | FeatureModel:
    """The trained structure with freshly initialised tensors, to load weights into: the head
    alone for a model trained on features (data.features)."""
    # The weights file only initialises the backbone, and may be long gone.
    model_cfg = replace(cfg.model, backbone=replace(cfg.model.backbone, weights=""))
    if cfg.data.features:
        return build_feature_model(model_cfg, len(classes))
    return build_model(model_cfg, len(classes))


@dataclass(frozen=True)
class Loaded:
    """A trained model in eval mode, with what it was trained with."""

    model: VideoModel | FeatureModel
    config: Config
    classes: list[str]
    step: int
    # Which checkpoint of its run it is, for people: its step, whether it is the best
    # validation's (train.select), and which is the last.
    which: str = ""

    def over_frames(self) -> VideoModel:
        """The model, which must run over frames: one trained on features has no backbone."""
        if not isinstance(self.model, VideoModel):
            raise ConfigError(
                "this model was trained on features (data.features): it has no backbone to run "
                "over frames; score it on feature shards with distseq eval"
            )
        return self.model


def load_checkpointed(source: Path) -> Loaded:
    """The model of a sharded checkpoint, from a run directory, its checkpoints/, a latest file
    or a step_N directory, in one process (DCP reads every rank's shards): its weight average
    where it holds one (train.ema), else its trained weights."""
    path = resolve_checkpoint(source)
    meta = read_meta(path)
    cfg = from_dict(meta["config"], str(path))
    model = empty_model(cfg, meta["classes"])
    state = model.state_dict()  # the model's own tensors, loaded into in place
    load_sharded({"model": state}, path)
    if meta.get("ema"):
        params = {name for name, _ in model.named_parameters()}
        load_sharded({"ema": {k: v for k, v in state.items() if k in params}}, path)
    which = _which(path, meta, cfg)
    return Loaded(model.eval(), cfg, meta["classes"], meta["position"]["step"], which)


def _which(path: Path, meta: dict[str, Any], cfg: Config) -> str:
    """Which checkpoint of its run ``path`` is, for people: its step, whether it is the best
    validation's (train.select) and its weight average (train.ema), and which is the last."""
    step, best = meta["position"]["step"], meta.get("best")
    said = f"step {step}"
    if best and best["step"] == step:
        said += f", the best validation ({cfg.train.select}: {best['value']:.4f})"
    if meta.get("ema"):
        said += f", its weight average (train.ema={cfg.train.ema})"
    latest = latest_checkpoint(path.parent)
    if latest is None or latest == path:
        return f"{said}, the run's last"
    return f"{said}; the last is {latest.name} ({path.parent / 'latest'})"


def load_model(source: Path) -> Loaded:
    """An exported file (safe to accept from others) or a checkpoint (unpickles DCP metadata)."""
    if source.is_file() and source.name != "latest":
        return load_exported(source)
    return load_checkpointed(source)


def export(source: Path, out: Path) -> Loaded:
    """Write the model of the checkpoint ``source`` names (a run's: its best validation's, else
    its last) to ``out``; returns it."""
    loaded = load_checkpointed(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    blob = {
        "format": FORMAT,
        "model": loaded.model.state_dict(),
        "config": to_dict(loaded.config),
        "classes": loaded.classes,
        "step": loaded.step,
    }
    torch.save(blob, out)
    return loaded


def load_exported(path: Path) -> Loaded:
    """The model of an exported file; ``weights_only``: no code runs from the file."""
    try:
        blob: Any = torch.load(path, weights_only=True)
    except Exception as e:  # a missing, truncated or foreign file: any error torch.load raises
        raise unreadable("exported model", path, e) from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        found = blob.get("format", "none") if isinstance(blob, dict) else type(blob).__name__
        raise TrainingError(
            f"exported model {path} has format {found}, this distseq reads format {FORMAT}: "
            "export it again from its checkpoint with the distseq that trained it"
        )
    cfg = from_dict(blob["config"], str(path))
    model = empty_model(cfg, blob["classes"])
    model.load_state_dict(blob["model"], strict=True)
    step = int(blob["step"])
    return Loaded(model.eval(), cfg, blob["classes"], step, f"exported at step {step}")
