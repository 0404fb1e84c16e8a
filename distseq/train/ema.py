"""Weight averaging (``train.ema``): an exponential moving average of the parameters, as timm's
ModelEmaV3 and torch's ``swa_utils.get_ema_multi_avg_fn`` keep it, validated and exported in
place of the raw weights.

The average lives beside each parameter in its own placement: under FSDP2 a DTensor shard of the
same layout, so no rank ever holds a full copy. It starts at the parameters before the first
step (a warm start's) and after each optimizer step moves to ``decay * average + (1 - decay) *
parameter``. Buffers
(BatchNorm's running statistics) are the model's own, as in ``swa_utils``' default.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


class WeightAverage:
    """The average of ``model``'s parameters (the plain model, whose names are the checkpoint's:
    ``backbone.*``, ``head.*``)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.params = {name: p.detach() for name, p in model.named_parameters()}
        self.average = {name: p.clone() for name, p in self.params.items()}

    def restart(self) -> None:
        """The average set to the parameters as they are (a run resumed from a checkpoint saved
        without one)."""
        for name, p in self.params.items():
            self.average[name].copy_(p)

    def update(self) -> None:
        """After an optimizer step: each average moves toward its parameter."""
        for name, p in self.params.items():
            self.average[name].lerp_(p, 1 - self.decay)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The averaged weights in the model while inside (a validation), the trained ones
        back after."""
        trained = {name: p.clone() for name, p in self.params.items()}
        for name, p in self.params.items():
            p.copy_(self.average[name])
        try:
            yield
        finally:
            for name, p in self.params.items():
                p.copy_(trained[name])
