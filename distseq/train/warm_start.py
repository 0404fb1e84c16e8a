"""``train.init_from``: a new run's first parameters from earlier runs (the stages of a
two-stage pipeline: a backbone trained per frame, a head trained on features), loaded by key
before the first step and never over a resume.

Sources load in order, each over the one before, from a run directory or checkpoint (its latest
model) or an exported ``model.pt``. Only keys the new model has are taken; a key whose shape
differs is refused in one line naming it, as a silent skip would train a half-initialised model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torch import nn

from distseq.checkpoint.export import load_model
from distseq.config import init_source
from distseq.errors import ConfigError


def _groups(keys: set[str]) -> str:
    """Keys summed up by their first two name parts: ``backbone.layer1 (12), head.rnn (4)``."""
    counts: dict[str, int] = {}
    for key in sorted(keys):
        group = ".".join(key.split(".")[:2])
        counts[group] = counts.get(group, 0) + 1
    return ", ".join(f"{group} ({n})" for group, n in counts.items()) or "nothing"


def _under(key: str, prefixes: list[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def warm_start(model: nn.Module, sources: list[str], say: Callable[[str], None]) -> None:
    """Load the tensors of ``sources`` that ``model`` has into it, in order; ``say`` gets one
    line per source: what it loaded, and what of the model it left as it was. A source written
    ``SOURCE:PREFIXES`` gives only its keys under those prefixes (config.init_source): the
    backbone of a per-frame run whose classifier differs from this model's, say."""
    ours = model.state_dict()
    for entry in sources:
        source, prefixes = init_source(entry)
        loaded = load_model(Path(source))
        theirs = loaded.model.state_dict()
        if prefixes:
            theirs = {k: v for k, v in theirs.items() if _under(k, prefixes)}
            if not theirs:
                raise ConfigError(f"train.init_from {entry}: no key of {source} is under those")
        taken = {}
        for key, tensor in theirs.items():
            if key not in ours:
                continue
            if tensor.shape != ours[key].shape:
                raise ConfigError(
                    f"train.init_from {entry}: {key} has shape {tuple(tensor.shape)} there and "
                    f"{tuple(ours[key].shape)} in this model"
                )
            taken[key] = tensor
        if not taken:  # a run "from" a source that gives it nothing trains from scratch unseen
            raise ConfigError(
                f"train.init_from {entry}: this model takes none of its {len(theirs)} tensors "
                f"({_groups(set(theirs))}); the model's own are {_groups(set(ours))}"
            )
        model.load_state_dict(taken, strict=False)
        left = set(ours) - set(taken)
        unused = set(theirs) - set(ours)
        say(
            f"train.init_from {entry} ({loaded.which}): loaded {len(taken)} tensors: "
            f"{_groups(set(taken))}; "
            f"not in it: {_groups(left)}"
            + (f"; not in this model: {_groups(unused)}" if unused else "")
        )
