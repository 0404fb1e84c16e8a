"""A CNN's stages: the runs of layers at one resolution, where selective recompute may split it.

Each stage of a CNN works at one spatial resolution and the next begins where the feature map
shrinks. The early, high-resolution stages hold most of a frame's activation bytes for fewer of
its FLOPs, so holding the late stages and recomputing the early ones buys the most time per
byte (measured by the plan's probe, ResNet-18 at 64 px on the CPU: the stem and layer1 hold 68%
of a frame's activation bytes, and recomputing only them takes 45% of the forward's time).
"""

from __future__ import annotations

import torch
from torch import nn

from distseq.model.frames import UINT8_IMAGENET, FrameInput, frame_hw


def _leaves(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules with parameters of their own and no children: convolutions, norms, linears."""
    return [
        (name, m)
        for name, m in module.named_modules()
        if not list(m.children()) and list(m.parameters(recurse=False))
    ]


def stage_starts(
    model: nn.Module,
    backbone: nn.Module,
    size: int | tuple[int, int],
    device: torch.device,
    given: FrameInput = UINT8_IMAGENET,
    channels: int = 3,
) -> list[str]:
    """The names of the modules of ``backbone`` at which its second and later stages begin, in
    forward order.

    A stage begins at the first parameterised layer whose output map is smaller than the current
    stage's. Maps of 1x1 are left out: those are a global pool (squeeze-and-excitation, the
    classifier), not a stage. Found in one forward of ``model`` (the whole video model, wrapped
    for FSDP or DDP or not: a sharded backbone runs only inside it) on one frame of ``size``
    pixels (or H x W) as ``given`` says, in eval mode so that no BatchNorm statistic moves.
    """
    order: list[tuple[str, int]] = []  # (name, output pixels) in forward order

    def record(name: str, module: nn.Module, args: object, output: object) -> None:
        if isinstance(output, torch.Tensor) and output.dim() == 4:
            order.append((name, output.shape[-2] * output.shape[-1]))

    hooks = [
        m.register_forward_hook(lambda mod, a, out, name=name: record(name, mod, a, out))
        for name, m in _leaves(backbone)
    ]
    training = model.training
    frame = given.random((1, 1, channels, *frame_hw(size)), torch.Generator(), device)
    try:
        model.eval()
        with torch.no_grad():
            model(frame, torch.ones(1, 1, dtype=torch.bool, device=device))
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    starts, current = [], None
    for name, pixels in order:
        if pixels == 1:
            continue
        if current is not None and pixels < current:
            starts.append(name)
        if current is None or pixels < current:
            current = pixels
    return starts
