"""What a model's frames are and how they reach its CNN: the input contract of a video model.

Frames come as ``[B, T, C, H, W]``, either uint8 in [0, 255] (4x smaller than float, so a whole
sequence fits where its float copy would not) or float. Each chunk is scaled (uint8: by 1/255,
to [0, 1]) and normalised by ``mean``/``std`` just before the CNN, so only one chunk at a time
exists as float. Nothing is assumed silently: frames of the other dtype are refused, naming both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from distseq.errors import ModelError

# The largest float frame value taken as [0, 1]: resizing overshoots 1 a little, and frames in
# [0, 255] reach far beyond it.
FLOAT_MAX = 2.0
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

FrameDtype = Literal["uint8", "float"]
# "imagenet": ImageNet's mean and std; None: none (the CNN gets [0, 1], or float frames as they
# are); or (mean, std), a value per channel.
Normalize = Literal["imagenet"] | None | tuple[Sequence[float], Sequence[float]]


def frame_hw(size: int | Sequence[int]) -> tuple[int, int]:
    """(H, W) from a square frame's side or (H, W)."""
    if isinstance(size, int):
        return size, size
    height, width = size
    return int(height), int(width)


@dataclass(frozen=True)
class FrameInput:
    """The frames a model takes: ``dtype`` ("uint8" in [0, 255], or "float", by convention in
    [0, 1]) and the per-channel ``mean``/``std`` applied after scaling to [0, 1] (None: none)."""

    dtype: FrameDtype = "uint8"
    mean: tuple[float, ...] | None = IMAGENET_MEAN
    std: tuple[float, ...] | None = IMAGENET_STD

    @classmethod
    def of(cls, frames: str, normalize: Normalize) -> FrameInput:
        """The contract from the public spelling (``frames=``, ``normalize=``), checked."""
        if frames not in ("uint8", "float"):
            raise ModelError(f"frames={frames!r}: must be 'uint8' (in [0, 255]) or 'float'")
        if normalize is None:
            return cls(frames, None, None)  # type: ignore[arg-type]
        if normalize == "imagenet":
            return cls(frames, IMAGENET_MEAN, IMAGENET_STD)  # type: ignore[arg-type]
        try:
            mean, std = (tuple(float(v) for v in values) for values in normalize)
        except (TypeError, ValueError):
            raise ModelError(
                f"normalize={normalize!r}: must be 'imagenet', None or (mean, std), a value per "
                "channel each"
            ) from None
        if len(mean) != len(std) or min(std, default=0.0) <= 0:
            raise ModelError(
                f"normalize=(mean={mean}, std={std}): one mean and one std > 0 per channel"
            )
        return cls(frames, mean, std)  # type: ignore[arg-type]

    @property
    def normalize(self) -> Normalize:
        """The ``normalize=`` that gives this contract back."""
        return None if self.mean is None or self.std is None else (self.mean, self.std)

    def check(self, frames: object, mask: object) -> None:
        """Refuse, in one line naming the type, shape, dtype or range, frames this model does not
        take."""
        if not isinstance(frames, torch.Tensor):
            raise ModelError(
                f"frames of type {_type(frames)}: a video model takes a torch.Tensor "
                "[B, T, C, H, W] (torch.from_numpy(frames) for a numpy array)"
            )
        if not isinstance(mask, torch.Tensor):
            given = "mask=None" if mask is None else f"mask of type {_type(mask)}"
            raise ModelError(
                f"{given}: a video model takes a bool tensor [B, T], True "
                "where a frame is real (torch.ones(B, T, dtype=torch.bool) where none is padding)"
            )
        if frames.dim() != 5:
            raise ModelError(
                f"frames of shape {list(frames.shape)}: a video model takes [B, T, C, H, W]"
            )
        if mask.shape != frames.shape[:2] and mask.shape == frames.shape[0:3:2]:
            raise ModelError(
                f"frames of shape {list(frames.shape)} with a mask of shape {list(mask.shape)}: "
                "the frames are laid out [B, C, T, H, W], and a video model takes "
                "[B, T, C, H, W] (frames.transpose(1, 2))"
            )
        if mask.shape != frames.shape[:2] or mask.dtype != torch.bool:
            raise ModelError(
                f"mask of shape {list(mask.shape)} and dtype {mask.dtype}: it must be bool "
                f"[B, T] = {list(frames.shape[:2])}, True where a frame is real"
            )
        uint8 = frames.dtype == torch.uint8
        if self.dtype == "uint8" and not uint8:
            raise ModelError(
                f"frames of dtype {frames.dtype}, but this model takes uint8 frames in [0, 255] "
                "(frames='uint8'); give uint8, or build the model with frames='float'"
            )
        if self.dtype == "float" and not frames.is_floating_point():
            raise ModelError(
                f"frames of dtype {frames.dtype}, but this model takes float frames "
                "(frames='float'); give float, or build the model with frames='uint8'"
            )
        channels = frames.shape[2]
        if self.mean is not None and len(self.mean) != channels:
            raise ModelError(
                f"frames with {channels} channels (shape {list(frames.shape)}), but normalize "
                f"has {len(self.mean)} means and stds"
            )
        # Float frames in [0, 255] run without an error and train a worse model (outputs 35%
        # off in one user's report): refused where a normalisation expects [0, 1]. The max is one
        # read of the frames: 0.26 ms of a 12.6 s ResNet-18 + LSTM step over 64 frames of 112 px
        # (one CPU thread, measured side by side), 40 ms for 500 frames of 224 px.
        if self.dtype == "float" and self.mean is not None and frames.numel():
            top = float(frames.amax())
            if top > FLOAT_MAX:
                raise ModelError(
                    f"float frames up to {top:g}, but this model takes float frames in [0, 1] "
                    "and then normalises them: divide them by 255, give uint8 frames to a model "
                    "built with frames='uint8', or build it with normalize=None to give the CNN "
                    "the frames as they are"
                )

    def buffers(self, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``mean`` and ``std`` as [1, C, 1, 1] tensors on ``device``, for :meth:`to_cnn`."""
        if self.mean is None or self.std is None:
            return None, None
        shape = (1, len(self.mean), 1, 1)
        return (
            torch.tensor(self.mean, device=device).view(shape),
            torch.tensor(self.std, device=device).view(shape),
        )

    def to_cnn(
        self,
        frames: torch.Tensor,
        mean: torch.Tensor | None,
        std: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """Frames [N, C, H, W] as the CNN takes them: scaled to [0, 1] (uint8), normalised by
        :meth:`buffers`' ``mean`` and ``std``, in ``dtype``."""
        x = frames.float()
        if self.dtype == "uint8":
            x = x.div_(255.0)
        if mean is not None and std is not None:
            x = (x - mean) / std
        return x.to(dtype)

    def random(
        self, shape: Sequence[int], generator: torch.Generator, device: torch.device
    ) -> torch.Tensor:
        """Random frames of ``shape`` as this model takes them (for probes and benchmarks)."""
        if self.dtype == "uint8":
            x = torch.randint(0, 256, tuple(shape), generator=generator, dtype=torch.uint8)
        else:
            x = torch.rand(tuple(shape), generator=generator)
        return x.to(device)


def _type(value: object) -> str:
    kind = type(value)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


UINT8_IMAGENET = FrameInput()  # the default: uint8 frames, ImageNet's normalisation
