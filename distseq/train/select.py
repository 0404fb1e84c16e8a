"""Model selection (``train.select``, ``train.patience``): which validation is the best so far,
and when the run has waited long enough for a better one."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from distseq.checkpoint.sharded import Best
from distseq.errors import ConfigError
from distseq.score.validate import VALIDATION


@dataclass(frozen=True)
class Selection:
    metric: str  # val_<score>
    highest: bool  # "max": a higher score is better
    patience: int  # validations without a better one before the run stops; 0: never

    @classmethod
    def of(cls, select: str, patience: int) -> Selection:
        """``train.select`` ("max val_jaccard"), its score checked against what validation
        logs."""
        mode, metric = select.split()
        if metric.removeprefix("val_") not in VALIDATION:
            scores = ", ".join(f"val_{m}" for m in VALIDATION)
            raise ConfigError(
                f"config key train.select={select!r}: validation logs no {metric}; one of {scores}"
            )
        best = "min" if metric == "val_loss" else "max"  # every score but the loss: higher
        if mode != best:
            raise ConfigError(
                f"config key train.select={select!r}: would keep the worst validation's "
                f"checkpoint: give '{best} {metric}'"
            )
        return cls(metric, mode == "max", patience)

    def after(self, best: Best, step: int, scores: dict[str, float]) -> Best:
        """The selection after a validation at ``step``: this one where it beats ``best`` (the
        first validation always does; a NaN score never), else ``best``, one validation
        older. A tie keeps the earlier step."""
        value = scores[self.metric]
        if math.isnan(value):
            beats = False
        elif best.step < 0:
            beats = True
        else:
            beats = value > best.value if self.highest else value < best.value
        return Best(step, value, 0) if beats else replace(best, since=best.since + 1)

    def spent(self, best: Best) -> bool:
        """Whether the run has waited ``patience`` validations for a better one."""
        return bool(self.patience) and best.since >= self.patience

    def said(self, best: Best) -> str:
        """The best so far, for people: "max val_jaccard 0.8123 at step 225"."""
        mode = "max" if self.highest else "min"
        return f"{mode} {self.metric} {best.value:.4f} at step {best.step}"
