"""Per-sequence augmentation: one draw of crop, flip and colour for a whole window of frames.

Every frame of a sequence gets the same parameters, so the motion between frames stays what the
camera saw; the parameters are drawn before any frame is decoded (from the frame size in the JPEG
header), and a resumed stream restores those of the windows it held from its position.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from distseq.config import AugmentConfig

# The crop's aspect ratio is the frame's times a factor within [1/x, x]: mild, since every crop is
# then resized to a square anyway.
_ASPECT_JITTER = 1.1


@dataclass(frozen=True)
class Params:
    """One sequence's augmentation; the identity is the full frame, no flip, factors 1."""

    top: int
    left: int
    height: int
    width: int
    flip: bool = False
    brightness: float = 1.0
    contrast: float = 1.0
    saturation: float = 1.0


def _factor(rng: random.Random, strength: float) -> float:
    return rng.uniform(1.0 - strength, 1.0 + strength) if strength > 0 else 1.0


def draw(cfg: AugmentConfig, rng: random.Random, height: int, width: int) -> Params:
    """Parameters for a sequence of ``height`` x ``width`` frames. Draws from ``rng`` only for the
    augmentations ``cfg`` turns on: with the defaults it returns the identity and draws nothing."""
    top, left, crop_h, crop_w = 0, 0, height, width
    if cfg.crop_scale < 1.0:
        area = rng.uniform(cfg.crop_scale, 1.0) * height * width
        jitter = math.log(_ASPECT_JITTER)
        ratio = width / height * math.exp(rng.uniform(-jitter, jitter))
        # A box that the jitter makes wider or taller than the frame is clipped to it.
        crop_w = max(1, min(width, round(math.sqrt(area * ratio))))
        crop_h = max(1, min(height, round(math.sqrt(area / ratio))))
        top = rng.randint(0, height - crop_h)
        left = rng.randint(0, width - crop_w)
    flip = cfg.flip and rng.random() < 0.5
    return Params(
        top,
        left,
        crop_h,
        crop_w,
        flip,
        brightness=_factor(rng, cfg.brightness),
        contrast=_factor(rng, cfg.contrast),
        saturation=_factor(rng, cfg.saturation),
    )


def changes_nothing(params: Params, height: int, width: int, size: int) -> bool:
    """Whether :func:`apply` would return ``height`` x ``width`` frames as they are."""
    return params == Params(0, 0, height, width) and (height, width) == (size, size)


def apply(frames: torch.Tensor, params: Params, size: int) -> torch.Tensor:
    """Crop, resize to ``size`` x ``size``, flip and recolour uint8 [T, 3, H, W] frames, all with
    the same parameters; steps that the parameters make a no-op are left out."""
    # Imported here, as decode's resize is: importing torchvision takes 1.2 s of every process's
    # start, and a run without augmentation never gets here.
    from torchvision.transforms.v2 import functional as F

    box = (params.top, params.left, params.height, params.width)
    if box != (0, 0, *frames.shape[-2:]):
        frames = F.crop(frames, *box)
    if frames.shape[-2:] != (size, size):
        frames = F.resize(frames, [size, size], antialias=True)
    if params.flip:
        frames = F.horizontal_flip(frames)
    if (params.brightness, params.contrast, params.saturation) != (1.0, 1.0, 1.0):
        frames = _recolour(frames, params)  # last: at the output size it costs least
    return frames


_GRAY = torch.tensor([0.2989, 0.587, 0.114])  # torchvision's rgb_to_grayscale weights


def _recolour(frames: torch.Tensor, params: Params) -> torch.Tensor:
    """Brightness b, contrast c (about each frame's mean grey m) and saturation s, as
    torchvision's adjust_* in that order but folded into one map without their intermediate
    clamps: a * (s * x + (1 - s) * grey(x)) + (1 - c) * b * m with a = b * c. Four times faster
    than the three calls, and it keeps the frames' memory layout."""
    b, c, s = params.brightness, params.contrast, params.saturation
    x = frames.float()
    grey = torch.einsum("tchw,c->thw", x, _GRAY)
    a = b * c
    shift = grey.mean((-2, -1), keepdim=True).mul_((1.0 - c) * b)
    offset = grey.mul_(a * (1.0 - s)).add_(shift)
    return x.mul_(a * s).add_(offset[:, None]).clamp_(0, 255).to(torch.uint8)
