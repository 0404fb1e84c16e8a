"""The per-frame CNN: a torchvision classification model with its classifier removed.

Its parameter names are torchvision's own (``conv1.weight``, ``layer1.0.bn1.weight``, ...), so a
torchvision ``state_dict`` loads into it as it is.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torchvision
from torch import nn
from torchvision.ops import FrozenBatchNorm2d

from distseq.config import BackboneConfig, Norm
from distseq.errors import ConfigError, first_line

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _set_module(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _convert_norm(cnn: nn.Module, norm: Norm) -> None:
    """Swap BatchNorm2d for a norm whose output for a frame does not depend on its chunk-mates."""
    if norm is Norm.batchnorm:
        return
    for name, bn in list(cnn.named_modules()):
        if not isinstance(bn, nn.BatchNorm2d):
            continue
        new: nn.Module
        if norm is Norm.frozen_bn:
            new = FrozenBatchNorm2d(bn.num_features, eps=bn.eps)
            for key in ("weight", "bias", "running_mean", "running_var"):
                getattr(new, key).copy_(getattr(bn, key).detach())
        else:
            # gcd keeps every group the same size for widths like 40 or 112 (EfficientNet).
            new = nn.GroupNorm(math.gcd(32, bn.num_features), bn.num_features, eps=bn.eps)
            with torch.no_grad():
                new.weight.copy_(bn.weight)
                new.bias.copy_(bn.bias)
        _set_module(cnn, name, new)


def _state_from_file(file: Path) -> object:
    if not file.is_file():
        raise ConfigError(f"config key model.backbone.weights: file not found: {file}")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(
            f"model.backbone.weights {file}: not a loadable state_dict ({first_line(e)})"
        ) from None


def _state_from_torchvision(model: str, entry: str) -> object:
    """A torchvision weights enum entry's state dict, through torchvision's own cache
    (``$TORCH_HOME/hub/checkpoints``): a machine that holds the file never downloads it."""
    if model == TINY_CNN:
        raise ConfigError(f"config key model.backbone.weights={entry!r}: {TINY_CNN} has none")
    weights = torchvision.models.get_model_weights(model)
    if entry not in weights.__members__:
        raise ConfigError(
            f"config key model.backbone.weights={entry!r}: neither a file nor one of {model}'s "
            f"torchvision weights ({', '.join(weights.__members__)})"
        )
    url = weights[entry].url
    cache = Path(torch.hub.get_dir()) / "checkpoints"
    try:
        return torch.hub.load_state_dict_from_url(
            url, map_location="cpu", progress=False, check_hash=True, weights_only=True
        )
    except (OSError, RuntimeError) as e:  # urllib's URLError is an OSError; a bad hash, a Runtime
        name = url.rsplit("/", 1)[-1]
        raise ConfigError(
            f"model.backbone.weights={entry}: {name} is not in torchvision's cache {cache} and "
            f"could not be fetched ({first_line(e)}): put the file there, from {url}"
        ) from None


def _load_weights(cnn: nn.Module, model: str, weights: str) -> None:
    """Weights from a local state_dict file, or by the name of a torchvision weights entry."""
    file = Path(weights)
    by_name = not file.exists() and file.suffix == "" and "/" not in weights
    state = _state_from_torchvision(model, weights) if by_name else _state_from_file(file)
    if not isinstance(state, dict):
        raise ConfigError(
            f"model.backbone.weights {weights}: expected a state_dict, got {type(state)}"
        )
    try:
        result = cnn.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches; the first line names the first offender
        detail = [line.strip() for line in str(e).splitlines() if line.strip()][1:2]
        raise ConfigError(
            f"model.backbone.weights {weights}: does not fit the model: {detail}"
        ) from None
    if result.missing_keys or result.unexpected_keys:
        bad = (result.missing_keys + result.unexpected_keys)[:3]
        raise ConfigError(
            f"model.backbone.weights {weights}: keys do not match the model, e.g. {bad}"
        )


TINY_CNN = "tiny_cnn"


def tiny_cnn() -> nn.Module:
    """distseq's own small CNN for demos and tests, built like a torchvision classifier: two
    strided 3x3 convolutions (16 and 32 channels) with BatchNorm and ReLU, global average
    pooling, and a final Linear that ``build_backbone`` removes; 32 features a frame."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 1000),
    )


def build_backbone(cfg: BackboneConfig) -> tuple[nn.Module, int]:
    """The CNN, mapping normalised float frames [N, 3, H, W] to features [N, F], and F."""
    if cfg.name == TINY_CNN:
        cnn = tiny_cnn()
    elif cfg.name in torchvision.models.list_models(module=torchvision.models):
        cnn = torchvision.models.get_model(cfg.name, weights=None)
    else:
        raise ConfigError(
            f"config key model.backbone.name={cfg.name!r}: not a torchvision model nor {TINY_CNN}"
        )
    if cfg.weights:
        _load_weights(cnn, cfg.name, cfg.weights)
    _convert_norm(cnn, cfg.norm)  # after the weights: frozen_bn keeps their statistics
    # The classifier is the last Linear in every torchvision CNN we support; what feeds it
    # is the per-frame feature vector.
    linears = [(n, m) for n, m in cnn.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ConfigError(f"config key model.backbone.name={cfg.name!r}: no final nn.Linear")
    name, fc = linears[-1]
    _set_module(cnn, name, nn.Identity())
    return cnn, fc.in_features


def frame_features(
    cnn: nn.Module,
    frames: torch.Tensor,
    mask: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    feature_dim: int,
) -> torch.Tensor:
    """uint8 frames [B, T, 3, H, W] + mask [B, T] -> features [B, T, F], zero where masked out.

    Only masked-in frames go through the CNN: padding costs no compute and never reaches
    BatchNorm statistics. Normalising here, per call, keeps the whole sequence in memory as
    uint8 (4x smaller than float).
    """
    # Under a mixed-precision policy the parameters seen here are already the low-precision
    # copies, so this is the compute dtype whatever wraps the model.
    dtype = next(cnn.parameters()).dtype
    if not bool(mask.any()):
        return frames.new_zeros((*mask.shape, feature_dim), dtype=dtype)
    x = ((frames[mask].float().div_(255.0) - mean) / std).to(dtype)
    # How many frames a call gets varies (a sequence's last chunk, padding): a compiled CNN
    # (model.compile) takes their number as a dynamic size from its first call rather than after
    # a second graph, and keeps its parameters' shapes static (marked dynamic too, FSDP2's
    # gathered views took sympy minutes to trace). A mark on a tensor; nothing in eager mode.
    torch._dynamo.maybe_mark_dynamic(x, 0)
    feats = cnn(x)
    out = feats.new_zeros((*mask.shape, feats.shape[-1]))
    out[mask] = feats
    return out
