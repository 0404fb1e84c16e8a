"""The per-frame CNN: a torchvision classification model with its classifier removed, a timm
model without its classifier (``timm:NAME``), or the module your factory returns (an import
path); and the contract every backbone meets, frames [N, C, H, W] -> features [N, F].

Parameter names are the CNN's own (``conv1.weight``, ``layer1.0.bn1.weight``, ...), so a
torchvision or timm ``state_dict`` loads into it as it is.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from distseq.config import BackboneConfig, Norm, is_import_path
from distseq.errors import ConfigError, ModelError, first_line
from distseq.model.frames import FrameInput
from distseq.model.imported import build_imported

TIMM = "timm:"


def _set_module(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _convert_norm(cnn: nn.Module, norm: Norm) -> None:
    """Swap BatchNorm2d for a norm whose output for a frame does not depend on its chunk-mates.

    timm's ``BatchNormAct2d`` (a BatchNorm2d that also holds a dropout and an activation) becomes
    timm's norm-and-activation counterpart with the same activation: a plain norm in its place
    left 24 of MobileNetV3's 34 activations out, silently. Another BatchNorm2d subclass is
    refused rather than guessed at."""
    if norm is Norm.batchnorm:
        return
    for name, bn in list(cnn.named_modules()):
        if not isinstance(bn, nn.BatchNorm2d):
            continue
        with_act = type(bn) is not nn.BatchNorm2d
        if with_act and not (hasattr(bn, "act") and hasattr(bn, "drop")):
            raise ConfigError(
                f"config key model.backbone.norm={norm.value}: layer {name} is a "
                f"{type(bn).__name__}, a BatchNorm2d of its own kind distseq cannot convert; "
                "use model.backbone.norm=batchnorm"
            )
        new = _chunk_safe_norm(bn, norm, with_act)
        if with_act:
            new.drop, new.act = bn.drop, bn.act
        _set_module(cnn, name, new)


def _chunk_safe_norm(bn: nn.BatchNorm2d, norm: Norm, with_act: bool) -> nn.Module:
    """``bn``'s replacement under ``norm`` with its parameters (and statistics); timm's
    norm-and-activation kind where ``with_act`` (its activation set by the caller)."""
    c, eps = bn.num_features, bn.eps
    new: nn.Module
    if norm is Norm.frozen_bn:
        if with_act:
            from timm.layers import FrozenBatchNormAct2d

            new = FrozenBatchNormAct2d(c, eps=eps, apply_act=False)
        else:
            from torchvision.ops import FrozenBatchNorm2d

            new = FrozenBatchNorm2d(c, eps=eps)
        keys: tuple[str, ...] = ("weight", "bias", "running_mean", "running_var")
    else:
        # gcd keeps every group the same size for widths like 40 or 112 (EfficientNet).
        if with_act:
            from timm.layers import GroupNormAct

            new = GroupNormAct(c, num_groups=math.gcd(32, c), eps=eps, apply_act=False)
        else:
            new = nn.GroupNorm(math.gcd(32, c), c, eps=eps)
        keys = ("weight", "bias")
    with torch.no_grad():
        for key in keys:
            getattr(new, key).copy_(getattr(bn, key).detach())
    return new


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
    import torchvision

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


def _load_weights(cnn: nn.Module, model: str, weights: str, drop: tuple[str, ...] = ()) -> None:
    """Weights from a local state_dict file, or by the name of a torchvision weights entry;
    keys under the prefixes ``drop`` (a classifier the backbone has not) are left out."""
    file = Path(weights)
    by_name = not file.exists() and file.suffix == "" and "/" not in weights
    if by_name and ":" in model:
        raise ConfigError(
            f"config key model.backbone.weights={weights!r}: {model} takes a state_dict file"
            + (" or 'pretrained'" if model.startswith(TIMM) else "")
        )
    state = _state_from_torchvision(model, weights) if by_name else _state_from_file(file)
    if isinstance(state, dict) and drop:
        state = {k: v for k, v in state.items() if not k.startswith(drop)}
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


def build_backbone(cfg: BackboneConfig) -> tuple[nn.Module, int, FrameInput]:
    """The CNN, mapping float frames [N, 3, H, W] to features [N, F]; F; and the frames it
    takes (ImageNet's normalisation, or a timm model's own)."""
    frames, dim = FrameInput(), None
    if cfg.name.startswith(TIMM):
        cnn, frames, dim = _timm_backbone(cfg)
    elif is_import_path(cfg.name):
        cnn = build_imported(cfg.name, "model.backbone.name", cfg.args)
        if cfg.weights:
            _load_weights(cnn, cfg.name, cfg.weights)
    else:
        cnn, dim = _torchvision_backbone(cfg)
    _convert_norm(cnn, cfg.norm)  # after the weights: frozen_bn keeps their statistics
    return cnn, dim or _feature_size(cnn, cfg.name), frames


def _torchvision_backbone(cfg: BackboneConfig) -> tuple[nn.Module, int]:
    cnn = tiny_cnn() if cfg.name == TINY_CNN else _torchvision_model(cfg.name)
    if cfg.weights:
        _load_weights(cnn, cfg.name, cfg.weights)
    # The classifier is the last Linear in every torchvision CNN we support; what feeds it
    # is the per-frame feature vector.
    linears = [(n, m) for n, m in cnn.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ConfigError(f"config key model.backbone.name={cfg.name!r}: no final nn.Linear")
    name, fc = linears[-1]
    _set_module(cnn, name, nn.Identity())
    return cnn, fc.in_features


def _torchvision_model(name: str) -> nn.Module:
    # Imported here, as timm is below: importing torchvision takes 1.2 s of a process's start
    # (its ops import torch._dynamo), which a run of tiny_cnn or a user's own CNN never needs.
    import torchvision

    if name not in torchvision.models.list_models(module=torchvision.models):
        raise ConfigError(
            f"config key model.backbone.name={name!r}: not a torchvision model nor "
            f"{TINY_CNN}, {TIMM}NAME or an import path (pkg.module:make_cnn)"
        )
    return torchvision.models.get_model(name, weights=None)


PRETRAINED = "pretrained"  # model.backbone.weights of a timm model: its default weights


def _timm_backbone(cfg: BackboneConfig) -> tuple[nn.Module, FrameInput, int]:
    """A timm model without its classifier (``num_classes=0``: pooled features [N, F]) and its
    own normalisation. Weights: a state_dict file (its classifier's keys left out), or
    ``pretrained``, timm's default weights, through the Hugging Face cache: a machine that holds
    them never downloads them (``HF_HUB_OFFLINE=1`` to be sure)."""
    try:
        import timm
    except ImportError:
        raise ConfigError(
            f"config key model.backbone.name={cfg.name!r}: timm is not installed; "
            "pip install 'distseq[timm]'"
        ) from None
    name = cfg.name[len(TIMM) :]
    if not timm.is_model(name):
        raise ConfigError(f"config key model.backbone.name={cfg.name!r}: not a timm model")
    pretrained = cfg.weights == PRETRAINED
    try:
        cnn = timm.create_model(name, pretrained=pretrained, num_classes=0, **cfg.args)
    except Exception as e:  # no weights in the cache and no network, or bad args
        what = "its pretrained weights are not in the Hugging Face cache ($HF_HOME/hub) and "
        raise ConfigError(
            f"config key model.backbone.{'weights' if pretrained else 'args'}: timm could not make "
            f"{name} ({'' if not pretrained else what}{type(e).__name__}: {first_line(e)})"
        ) from None
    data: dict[str, Any] = dict(cnn.pretrained_cfg)  # type: ignore[arg-type]
    if cfg.weights and not pretrained:
        classifier = data.get("classifier") or ()
        drop = (classifier,) if isinstance(classifier, str) else tuple(classifier)
        _load_weights(cnn, cfg.name, cfg.weights, drop=tuple(f"{c}." for c in drop))
    # The features' size: head_hidden_size where a model has layers after its pool
    # (MobileNetV3: 1024, where num_features says 576).
    sizes: list[Any] = [getattr(cnn, key, None) for key in ("head_hidden_size", "num_features")]
    dim = int(next(size for size in sizes if size))
    return cnn, FrameInput("uint8", tuple(data["mean"]), tuple(data["std"])), dim


def _feature_size(cnn: nn.Module, name: str) -> int:
    """F: the module's ``feature_dim``, else measured on one frame of 224 x 224 in eval mode
    (nothing is allocated where it was built on the meta device)."""
    value = getattr(cnn, "feature_dim", None)
    if isinstance(value, int) and value > 0:
        return value
    param = next(cnn.parameters())
    x = torch.zeros(1, 3, 224, 224, device=param.device, dtype=param.dtype)
    training = cnn.training
    try:
        cnn.eval()
        with torch.no_grad():
            out = cnn(x)
    except Exception as e:
        raise ConfigError(
            f"config key model.backbone.name={name!r}: its module failed on one frame "
            f"[1, 3, 224, 224] ({type(e).__name__}: {first_line(e)}); give it an int "
            "attribute feature_dim"
        ) from None
    finally:
        cnn.train(training)
    check_features(out, 1, "model.backbone.name=" + name)
    return int(out.shape[1])


def check_features(feats: object, frames: int, what: str = "the backbone") -> None:
    """Refuse, in one line naming the shape, a backbone output that is not features [N, F]."""
    if isinstance(feats, torch.Tensor) and feats.dim() == 2 and feats.shape[0] == frames:
        return
    shape = list(feats.shape) if isinstance(feats, torch.Tensor) else type(feats).__name__
    raise ModelError(
        f"{what} returned {shape} for {frames} frames [N, C, H, W]: a backbone returns features "
        "[N, F]; end a feature map [N, F, h, w] with a global pool and a flatten, e.g. "
        "nn.Sequential(cnn, nn.AdaptiveAvgPool2d(1), nn.Flatten())"
    )


def checked_feature_dim(known: int | None, feats: torch.Tensor) -> int:
    """The feature size ``feats`` [..., F] shows, refused in one line if ``known`` says
    otherwise (a ``feature_dim`` given for another backbone)."""
    found = int(feats.shape[-1])
    if known is not None and known != found:
        raise ModelError(
            f"the backbone makes {found} features a frame, but feature_dim={known} was given"
        )
    return found


def frame_features(
    cnn: nn.Module,
    frames: torch.Tensor,
    mask: torch.Tensor,
    given: FrameInput,
    mean: torch.Tensor | None,
    std: torch.Tensor | None,
    feature_dim: int | None,
) -> torch.Tensor:
    """Frames [B, T, C, H, W] (as ``given`` says) + mask [B, T] -> features [B, T, F], zero where
    masked out.

    Only masked-in frames go through the CNN: padding costs no compute and never reaches
    BatchNorm statistics. Scaling and normalising here, per call, keeps the whole sequence in
    memory as it came (uint8: 4x smaller than float).
    """
    # Under a mixed-precision policy the parameters seen here are already the low-precision
    # copies, so this is the compute dtype whatever wraps the model.
    dtype = next(cnn.parameters()).dtype
    if not bool(mask.any()):
        if feature_dim is None:
            raise ModelError(
                "no real frame in this batch (mask all False), and the backbone's feature size "
                "is not known yet: give feature_dim"
            )
        return frames.new_zeros((*mask.shape, feature_dim), dtype=dtype)
    x = given.to_cnn(frames[mask], mean, std, dtype)
    # How many frames a call gets varies (a sequence's last chunk, padding): a compiled CNN
    # (model.compile) takes their number as a dynamic size from its first call rather than after
    # a second graph, and keeps its parameters' shapes static (marked dynamic too, FSDP2's
    # gathered views took sympy minutes to trace). A mark on a tensor; nothing in eager mode.
    torch._dynamo.maybe_mark_dynamic(x, 0)
    feats = cnn(x)
    check_features(feats, x.shape[0])
    out = feats.new_zeros((*mask.shape, feats.shape[-1]))
    out[mask] = feats
    return out
