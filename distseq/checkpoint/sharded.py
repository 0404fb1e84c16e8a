"""Training state on disk: sharded with ``torch.distributed.checkpoint``, published atomically.

Layout under ``<train.out_dir>/checkpoints``::

    latest                   "step_00000400": the newest complete checkpoint
    step_00000400/
        .metadata            DCP: model and optimizer (FSDP2 DTensors, DDP or plain modules);
        __<rank>_0.distcp    every rank writes its own shards, nothing is gathered on one rank
        meta.json            position (step, batches consumed per rank, seed), world size,
                             LR schedule, classes, config, last metrics (written by rank 0)
        rank<r>.pt           what only rank r knows (RankState): its RNG states (python, numpy,
                             torch CPU, CUDA), the bad samples its stream skipped, the RNN
                             states it carries from window to window in ordered mode, and
                             each loader worker's stream position
    step_00000600.tmp/       a save in progress or a killed one: never read, removed by the
                             next save

A save fills ``step_N.tmp``; once every rank is done, rank 0 renames it to ``step_N`` and only
then replaces ``latest``. A process killed at any moment therefore leaves ``latest`` naming a
complete checkpoint. Loading goes through ``get_state_dict``/``set_state_dict``, so DCP reshards:
a checkpoint saved by N ranks loads on any number of ranks. On several nodes, ``out_dir`` must be
on a filesystem that all of them share.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import random
import re
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torch.utils._pytree import tree_leaves

from distseq.config import Config, to_dict
from distseq.errors import ConfigError, TrainingError, first_line
from distseq.files import write_atomic
from distseq.model.head import RNNState, map_state
from distseq.parallel import any_rank, barrier, rank_world, say
from distseq.units import format_size

# 3: canonical state-dict keys (backbone.*, head.*), no memory wrapper in them; data.window.
FORMAT = 3
_STEP_RE = re.compile(r"step_(\d{8})")


@dataclass(frozen=True)
class Position:
    """How far a run has got; the data stream is deterministic, so this locates it exactly."""

    step: int = 0  # optimizer steps taken
    batches: int = 0  # training batches each rank has consumed
    seed: int = 0  # of the data stream


@dataclass
class RankState:
    """What one rank alone knows: the bad samples its stream skipped, the RNN states of the
    lanes of each loader worker, and each worker's stream position (data.Batch.position)."""

    skipped: list[str] = field(default_factory=list)  # data.Batch.skipped ids, in order
    carries: dict[int, RNNState] = field(default_factory=dict)  # by loader worker
    streams: dict[int, dict[str, Any]] = field(default_factory=dict)  # by loader worker
    rng: dict[str, Any] | None = None  # as read back; a save takes the current states


@dataclass
class TrainState:
    """What a checkpoint restores in place, and what it must match."""

    model: nn.Module
    optimizer: Optimizer
    schedule: LRScheduler
    config: Config
    classes: list[str]
    # train.ema: the average of each parameter, by its name in the checkpoint (saved as "ema").
    average: dict[str, torch.Tensor] | None = None


@dataclass(frozen=True)
class Best:
    """Model selection so far (train.select): the step and score of the best validation, and how
    many validations have not beaten it since (train.patience counts them). Step -1: none yet."""

    step: int = -1
    value: float = math.nan
    since: int = 0


@dataclass(frozen=True)
class Resumed:
    path: Path
    position: Position
    world: int  # ranks that saved it
    sequence: int  # the ranks of each of its sequence groups (parallel.sequence)
    metrics: dict[str, float]  # as at the saved step
    best: Best  # as at the saved step
    averaged: bool  # it holds a weight average (train.ema), restored into TrainState.average


def _first_line(error: BaseException) -> str:
    if isinstance(error, CheckpointException):  # one error per failed rank, with tracebacks
        error = next(iter(error.failures.values()))[0]
    return first_line(error)


def unreadable(what: str, path: Path, error: BaseException) -> TrainingError:
    return TrainingError(f"{what} {path} is unreadable: {_first_line(error)}")


@contextmanager
def _single_process_is_fine() -> Iterator[None]:
    """DCP warns on every call without a process group, which here is an intended case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def _rng_state() -> dict[str, Any]:
    # Plain ints, lists and tensors only, so that torch.load(weights_only=True) reads it back.
    numpy = np.random.get_state(legacy=False)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {**numpy, "state": {**numpy["state"], "key": numpy["state"]["key"].tolist()}},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    numpy = state["numpy"]
    key = np.array(numpy["state"]["key"], dtype=np.uint32)
    np.random.set_state({**numpy, "state": {**numpy["state"], "key": key}})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _to_cpu(state: RNNState) -> RNNState:
    return map_state(torch.Tensor.cpu, state)


def _reseed(seed: int, rank: int, step: int) -> None:
    derived = random.Random(f"distseq-rng:{seed}:{rank}:{step}").getrandbits(32)
    random.seed(derived)
    np.random.seed(derived)
    torch.manual_seed(derived)  # seeds CUDA too


def save_checkpoint(
    root: Path,
    state: TrainState,
    position: Position,
    metrics: dict[str, float],
    keep_last: int,
    rank_state: RankState | None = None,
    best: Best | None = None,
) -> Path:
    """Write this rank's part of the checkpoint at ``position``; every rank must call this.
    ``best``: the run's selection so far; where it is this step, ``best`` names this checkpoint,
    which is then kept beside the last ``keep_last``.

    A save that fails on any rank fails on all of them alike, with its partial ``step_N.tmp``
    removed: it would otherwise hold the space that the relaunch needs for the same save.
    """
    rank, world = rank_world()
    final = _step_dir(root, position.step)
    tmp = final.with_name(final.name + ".tmp")
    if rank == 0:
        _remove_partial(root)
        tmp.mkdir(parents=True)
    barrier()
    model_state, optim_state = get_state_dict(state.model, state.optimizer)
    mine = rank_state or RankState()
    carries = {w: _to_cpu(state) for w, state in mine.carries.items()}
    buffer = io.BytesIO()
    alone = {"rng": _rng_state(), "skipped": mine.skipped, "carries": carries}
    torch.save({**alone, "streams": mine.streams}, buffer)
    # Each write is followed by an agreement of all ranks, so that no rank goes on into a
    # collective that a failed rank will never join. DCP's save agrees by itself.
    error = _attempt(lambda: write_atomic(tmp / f"rank{rank}.pt", buffer.getvalue()))
    if not any_rank(error is not None):
        with _single_process_is_fine():
            saved = {"model": model_state, "optim": optim_state}
            if state.average is not None:
                saved["ema"] = state.average
            error = _attempt(lambda: dcp.save(saved, checkpoint_id=tmp))
    if error is None and rank == 0:
        meta = {
            "format": FORMAT,
            "position": vars(position),
            "world": world,
            "sequence": state.config.parallel.sequence,
            "schedule": state.schedule.state_dict(),
            "classes": state.classes,
            "config": to_dict(state.config),
            "metrics": metrics,
            "best": None if best is None else vars(best),
            "ema": state.average is not None,
        }
        error = _attempt(lambda: write_atomic(tmp / "meta.json", json.dumps(meta, indent=1)))
    if any_rank(error is not None):  # else every rank's shards and RNG file are complete
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        barrier()
        raise _save_failed(root, tmp, error, _bytes(model_state, optim_state), keep_last)
    if rank == 0:
        _publish(root, tmp, final)
        if best is not None and best.step == position.step:
            write_atomic(root / "best", f"{final.name}\n")
        _prune(root, position.step, keep_last, -1 if best is None else best.step)
    barrier()  # on return, ``latest`` names this checkpoint for every rank
    return final


def _attempt(write: Callable[[], object]) -> BaseException | None:
    try:
        write()
    except (Exception, CheckpointException) as e:  # OSError, torch's writer, DCP's collected
        return e
    return None


def _bytes(*states: dict[str, Any]) -> int:
    """Bytes of the tensors in state dicts, whole (a DTensor counts at its global size)."""
    leaves = [leaf for state in states for leaf in tree_leaves(state)]
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _save_failed(
    root: Path, tmp: Path, error: BaseException | None, need: int, keep_last: int
) -> TrainingError:
    """The error of a failed save; a full device is said as such, with the numbers to fix it.

    torch's writer reports a full device in its own words ("unexpected pos 704 vs 598"), so
    the free space is what tells. ``need`` is the tensors' bytes; the last complete checkpoint,
    where there is one, says what a save really takes (a small model's is twice its tensors:
    DCP's metadata and per-tensor records, measured 224 KB against 101 KB).
    """
    latest = latest_checkpoint(root)
    if latest is not None:
        need = max(need, sum(f.stat().st_size for f in latest.iterdir() if f.is_file()))
    free = shutil.disk_usage(root).free
    full = free < need or any(
        isinstance(e, OSError) and e.errno == errno.ENOSPC for e in _chain(error)
    )
    if not full:
        reason = "another rank failed" if error is None else _first_line(error)
        return TrainingError(f"checkpoint {tmp} could not be written: {reason}")
    return TrainingError(
        f"checkpoint {tmp.name} could not be written: the device of {root} is full "
        f"({format_size(free)} free; one checkpoint needs about {format_size(need)}, and "
        f"train.keep_last={keep_last} of them plus the one being written must fit, about "
        f"{format_size((keep_last + 1) * need)}); the partial save is removed, and a relaunch "
        f"with room or a smaller train.keep_last resumes from "
        f"{latest.name if latest else 'the start'}"
    )


def _chain(error: BaseException | None) -> Iterator[BaseException]:
    """``error``, its causes and contexts, and the per-rank errors DCP collected."""
    while error is not None:
        yield error
        if isinstance(error, CheckpointException):
            for failure in error.failures.values():
                yield from _chain(failure[0] if isinstance(failure, tuple) else failure)
        error = error.__cause__ or error.__context__


def _remove_partial(root: Path) -> None:
    """Leftovers of a killed save: ``step_N.tmp`` directories and ``latest.tmp``."""
    for path in root.glob("*.tmp"):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def _publish(root: Path, tmp: Path, final: Path) -> None:
    if final.exists():  # saved by a run that was killed before it could update ``latest``
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_atomic(root / "latest", f"{final.name}\n")


def _prune(root: Path, step: int, keep_last: int, best: int) -> None:
    steps = sorted(int(m[1]) for p in root.iterdir() if (m := _STEP_RE.fullmatch(p.name)))
    # Checkpoints after ``step`` belong to a run killed before it published them, which this
    # run has replaced.
    keep = {*[s for s in steps if s <= step][-keep_last:], best}
    for s in steps:
        if s not in keep:
            shutil.rmtree(_step_dir(root, s))


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``root/latest`` names, or None when nothing was saved yet."""
    return _pointed(root / "latest")


def best_checkpoint(root: Path) -> Path | None:
    """The checkpoint of the run's best validation (train.select), or None before any: the one
    the latest checkpoint's own record of the selection names. (The ``best`` pointer, for people,
    is written after a checkpoint is published: it lags by one best where a run dies between.)"""
    latest = latest_checkpoint(root)
    best = read_meta(latest).get("best") if latest is not None else None
    if not best or best["step"] < 0:
        return None
    path = _step_dir(root, best["step"])
    if not (path / "meta.json").is_file():
        raise TrainingError(
            f"{latest}/meta.json names {path.name} the best validation's checkpoint, and it is "
            "gone (the run keeps it beside the last train.keep_last): give a step_N directory"
        )
    return path


def _resumed_best(path: Path, meta: dict[str, Any]) -> Best:
    """The selection the checkpoint at ``path`` records, started again where the best one's
    folder is gone (deleted: the run keeps it): carried on, every later checkpoint would name
    it, and ``export`` and the like would fail on the finished run."""
    if not meta.get("best"):  # saved before train.select: none
        return Best()
    best = Best(**meta["best"])
    kept = _step_dir(path.parent, best.step)
    if best.step < 0 or (kept / "meta.json").is_file():
        return best
    say(
        f"distseq: {kept}, the best validation's checkpoint (step {best.step}), is gone: the "
        "selection starts again at the next validation",
        sys.stderr,
    )
    return Best()


def _pointed(pointer: Path) -> Path | None:
    root = pointer.parent
    if not pointer.exists():
        return None
    try:
        name = pointer.read_text().strip()
    except OSError as e:
        raise TrainingError(f"checkpoint pointer {pointer} is unreadable: {e}") from None
    path = root / name
    if not _STEP_RE.fullmatch(name) or not (path / "meta.json").is_file():
        raise TrainingError(f"checkpoint pointer {pointer} names {name!r}, not a checkpoint")
    return path


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory from a run directory or its ``checkpoints/`` (the best validation's
    where the run selected one, else the latest), a ``latest`` or ``best`` pointer, or the
    checkpoint directory itself. A path that names nothing is the caller's mistake (exit 2, as a
    missing file is); one that names something else, no checkpoint there."""
    if not path.exists():
        raise ConfigError(
            f"{path}: no such file or folder; give an exported model (.pt), a run directory, "
            "its checkpoints/ or a step_N directory"
        )
    if path.name in ("latest", "best") and path.is_file():
        return _pointed(path) or path
    if (path / "checkpoints").is_dir():
        path = path / "checkpoints"
    found = best_checkpoint(path) or latest_checkpoint(path)
    if found is not None:
        return found
    if (path / "meta.json").is_file():
        return path
    raise TrainingError(
        f"no checkpoint at {path}: expected a run directory, its checkpoints/ or a step_N directory"
    )


def read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads((path / "meta.json").read_text())
        if meta["format"] != FORMAT:
            raise ValueError(
                f"format {meta['format']}, this distseq reads format {FORMAT} only: "
                "resume it with the distseq that wrote it, or train anew"
            )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise unreadable("checkpoint", path, e) from None
    return meta


def _without_unsaved_state(optim_state: dict[str, Any], path: Path) -> bool:
    """Drop from the template DCP loads into the optimizer state of each parameter that had none
    when ``path`` was saved: a group frozen then (optim.groups' frozen_until) gets its AdamW
    state at its first update, and ``get_state_dict`` makes state for every parameter. Loaded
    without it, the parameter has none again, as in the run that saved it."""
    try:
        saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception as e:  # a missing or corrupt .metadata: whatever the reader raises
        raise unreadable("checkpoint", path, e) from None
    unsaved = [
        name
        for name, entries in optim_state["state"].items()
        if not any(f"optim.state.{name}.{key}" in saved for key in entries)
    ]
    for name in unsaved:
        del optim_state["state"][name]
    return bool(unsaved)


def load_sharded(state: dict[str, Any], path: Path) -> None:
    """Fill ``state``'s tensors in place from the DCP checkpoint at ``path``, resharding."""
    try:
        with _single_process_is_fine():
            dcp.load(state, checkpoint_id=path)
    except (Exception, CheckpointException) as e:  # DCP raises the same on every rank
        raise unreadable("checkpoint", path, e) from None


# Keys that may change between legs of one run: the weights file and init_from only initialise
# the model, and stop_after is how a leg ends.
_FREE_KEYS = {"model.backbone.weights", "train.init_from", "train.stop_after"}


def _differences(saved: Any, now: Any, key: str) -> list[tuple[str, str]]:
    """(key, how it differs) for each leaf that differs, the free keys aside."""
    if isinstance(saved, dict) and isinstance(now, dict):
        keys = sorted(saved.keys() | now.keys())
        return [d for k in keys for d in _differences(saved.get(k), now.get(k), f"{key}.{k}")]
    if saved == now or key in _FREE_KEYS:
        return []
    return [(key, f"{key}={saved!r} in the checkpoint, {now!r} now")]


def _check_compatible(path: Path, meta: dict[str, Any], state: TrainState) -> None:
    saved, now = meta["config"], to_dict(state.config)
    model = _differences(saved["model"], now["model"], "model")
    model += _differences(meta["classes"], state.classes, "classes")
    if model:
        raise TrainingError(
            f"checkpoint {path} holds a different model ({model[0][1]}); "
            "resume with the same model and classes, or use a new train.out_dir"
        )
    others = [key for k in now for key, _ in _differences(saved.get(k), now[k], k)]
    if others:
        say(
            f"distseq: config keys changed since {path.name}: {', '.join(others)}; optimizer "
            "hyperparameters (lr, weight decay) stay as saved, the LR schedule follows the new "
            "train.steps and optim.warmup_steps",
            sys.stderr,
        )


def restore_training(path: Path, state: TrainState) -> Resumed:
    """Restore model, optimizer, schedule and the weight average (where both the checkpoint and
    ``state`` have one) in place; every rank must call this.

    RNG states are restored separately, by :func:`restore_rng`, once everything that draws
    random numbers while setting up the run has done so.
    """
    meta = read_meta(path)
    _check_compatible(path, meta, state)
    model_state, optim_state = get_state_dict(state.model, state.optimizer)
    partial = _without_unsaved_state(optim_state, path)
    loaded: dict[str, Any] = {"model": model_state, "optim": optim_state}
    averaged = bool(meta.get("ema")) and state.average is not None
    if averaged:
        loaded["ema"] = state.average
    load_sharded(loaded, path)
    set_model_state_dict(state.model, model_state)
    # Not strict only where the checkpoint holds no state for some parameters, on purpose.
    options = StateDictOptions(strict=not partial)
    set_optimizer_state_dict(state.model, state.optimizer, optim_state, options=options)
    state.schedule.load_state_dict(meta["schedule"])
    position = Position(**meta["position"])
    say(f"distseq: resuming from {path} at step {position.step}", sys.stderr)
    sequence = meta.get("sequence", 1)  # saved before parallel.sequence: 1
    best = _resumed_best(path, meta)
    return Resumed(path, position, meta["world"], sequence, meta["metrics"], best, averaged)


def read_rank_state(resumed: Resumed, sequence: int = 1) -> RankState:
    """This rank's part of the checkpoint; apply its RNG states with :func:`restore_rng`.

    Ranks are counted as data-parallel ranks, those that take batches of their own: the ranks
    of a sequence group (``sequence`` now, ``resumed.sequence`` then) read the same batches, so
    a run saved at one sequence size resumes at another as the same run, each rank taking the
    state of the saving run's first rank of its data-parallel rank. A data-parallel rank the
    saving run did not have (more now than then) gets an empty state and will re-seed
    deterministically from (seed, rank, step). With another data-parallel world size the data
    each rank reads differs anyway, so such a run continues sensibly but is not the run that
    was saved; it starts its RNN states afresh.
    """
    rank, world = rank_world()
    rank, world = rank // sequence, world // sequence
    saved = resumed.world // resumed.sequence
    if world != saved:
        reseeded = (
            f"; ranks {saved} and up re-seed their RNG from seed, rank and step"
            if world > saved
            else ""
        )
        ranks = f"{saved} data-parallel rank{'s' * (saved != 1)}"
        say(
            f"distseq: {resumed.path} was saved with {ranks}, resuming with {world}: data "
            f"order and random draws differ from the saved run{reseeded}",
            sys.stderr,
        )
    if rank >= saved:
        return RankState()
    file = resumed.path / f"rank{rank * resumed.sequence}.pt"
    try:
        state = torch.load(file, weights_only=True)
        rng, skipped, carries = state["rng"], list(state["skipped"]), dict(state["carries"])
        streams = dict(state.get("streams", {}))  # none saved before stream positions
    except Exception as e:  # a missing or corrupt file: any error torch.load raises
        raise unreadable("checkpoint", file, e) from None
    if world != saved:
        return RankState(rng=rng)
    return RankState(skipped, carries, streams, rng)


def restore_rng(resumed: Resumed, rank_state: RankState, sequence: int = 1) -> None:
    """Put back this rank's RNG states as the saving run had them after the saved step; a
    data-parallel rank it did not have re-seeds, the same on every rank of its sequence group."""
    if rank_state.rng is None:
        _reseed(resumed.position.seed, rank_world()[0] // sequence, resumed.position.step)
    else:
        _set_rng_state(rank_state.rng)
