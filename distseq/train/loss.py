"""The training loss (``loss.*``): cross-entropy over the labelled frames, class-weighted or not,
plus MS-TCN's smoothing term, each summed over a multi-stage head's stages.

A step's loss is a mean over the whole global batch, whatever the padding or the split across
ranks: :meth:`Loss.sums` gives each micro-batch's sums and :meth:`Loss.counts` what they are
divided by (the labelled frames' weights, the pairs of consecutive real frames), summed over
every rank before any backward, so that the gradients DDP and FSDP average are exactly those of
the global mean.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from distseq.config import LossConfig
from distseq.errors import ConfigError, ModelError


class Loss:
    """``num_classes``: the data's class count, which the logits must have (None: not checked)."""

    def __init__(
        self, cfg: LossConfig, weights: list[float] | None, num_classes: int | None = None
    ) -> None:
        self.num_classes = num_classes
        self.smoothing = cfg.smoothing
        self.clip = cfg.smoothing_clip
        self.weights = None if weights is None else torch.tensor(weights, dtype=torch.float32)

    def counts(self, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[real frames, the labelled frames' summed weights, pairs of consecutive real frames]
        of one micro-batch (labels -1: unlabelled)."""
        labelled = labels >= 0
        if self.weights is None:
            weight = labelled.sum().double()
        else:
            weights = self.weights.to(labels.device)
            weight = weights[labels[labelled]].sum().double()
        pairs = (mask[:, 1:] & mask[:, :-1]).sum()
        return torch.stack([mask.sum().double(), weight, pairs.double()])

    def sums(
        self, logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The weighted cross-entropy's and the smoothing term's sums over the micro-batch,
        summed over the stages of ``logits`` [B, T, K] or [S, B, T, K]."""
        # A head of the user's own that ignores num_classes trained silently (a [B, T, 1] head on
        # 2 classes to loss 0.0000, 5 extra classes without a word): refused at the first step.
        if self.num_classes is not None and logits.shape[-1] != self.num_classes:
            raise ModelError(
                f"the head returns {logits.shape[-1]} class scores a frame (logits of shape "
                f"{list(logits.shape)}), and the data has {self.num_classes} classes: a head's "
                "last dimension is the data's class count, given to a head's factory as "
                "num_classes"
            )
        stages = logits.float() if logits.dim() == 4 else logits.float()[None]
        weights = None if self.weights is None else self.weights.to(logits.device)
        ce = logits.new_zeros((), dtype=torch.float32)
        smooth = logits.new_zeros((), dtype=torch.float32)
        for stage in stages:
            ce = ce + F.cross_entropy(
                stage.flatten(0, 1), labels.flatten(), weight=weights, reduction="sum"
            )
            if self.smoothing:
                smooth = smooth + self._smoothing_sum(stage, mask)
        return ce, smooth

    def _smoothing_sum(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Over each pair of consecutive real frames, the mean over classes of the squared
        difference of log-probabilities truncated at clip^2; summed over the pairs."""
        logp = logits.log_softmax(-1)
        squared = (logp[:, 1:] - logp[:, :-1].detach()).square().clamp(max=self.clip**2)
        pairs = (mask[:, 1:] & mask[:, :-1]).to(squared.dtype)
        return (squared.mean(-1) * pairs).sum()

    def total(self, ce: torch.Tensor, smooth: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The loss of sums over the global ``counts`` (of :meth:`counts`, summed)."""
        _, weight, pairs = counts.unbind()
        loss = ce / weight.clamp(min=1e-12)  # a step of unlabelled frames: no loss, no gradient
        if self.smoothing:
            loss = loss + self.smoothing * smooth / pairs.clamp(min=1)
        return loss


def build_loss(cfg: LossConfig, classes: list[str], label_counts: Callable[[], list[int]]) -> Loss:
    """The loss ``cfg`` describes over ``classes``; median-frequency weights from
    ``label_counts()``, the training frames of each class (read only for those weights: a
    manifest from before distseq recorded them has none)."""
    k = len(classes)
    given = cfg.class_weights
    if given == "none":
        return Loss(cfg, None, k)
    if given == "median_frequency":
        return Loss(cfg, median_frequency(label_counts(), classes), k)
    if len(given) != k:
        raise ConfigError(
            f"config key loss.class_weights has {len(given)} weights, but the data has {k} "
            f"classes ({', '.join(classes)}): give one per class, in that order"
        )
    if not any(given):
        raise ConfigError("config key loss.class_weights: not every weight can be 0")
    return Loss(cfg, [float(w) for w in given], k)


def median_frequency(counts: list[int], classes: list[str]) -> list[float]:
    """Median-frequency balancing (Eigen and Fergus, 2015): median(f) / f_c for each class c,
    f_c its fraction of the labelled frames."""
    missing = [name for name, n in zip(classes, counts, strict=True) if n == 0]
    if missing:
        raise ConfigError(
            f"loss.class_weights=median_frequency: class {missing[0]!r} has no labelled frame "
            "in the training shards, so its weight would be infinite; give loss.class_weights "
            "as a list"
        )
    freq = np.asarray(counts, dtype=np.float64) / sum(counts)
    return (np.median(freq) / freq).tolist()
