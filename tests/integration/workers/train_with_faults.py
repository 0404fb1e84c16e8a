"""One rank of ``distseq train`` with a fault injected by patching; distseq has no test hooks.

argv: mode, config, overrides... Modes: ``plain``; ``record`` (keep the final model's logits on a
fixed batch, with its weight average in place under train.ema, to check the export against);
``record_load`` (keep the full state, the weight average's too, right after a checkpoint is
loaded, to compare with the saved one); ``record_bn`` (keep each rank's BatchNorm
statistics at every save); ``kill_in_save`` (rank 0 dies after writing
its shards, before DCP's metadata); ``kill_rank1_once`` (rank 1 dies in its third step, once);
``term_rank1`` (rank 1 alone gets SIGTERM during step 3).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint.filesystem as dcp_fs
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

import distseq.train.loop
from conftest import random_batch
from distseq.config import load_config
from distseq.train.signals import StopSignals

mode, config, *overrides = sys.argv[1:]
cfg = load_config(config, overrides)
rank = int(os.environ["RANK"])


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def term() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def on_call(n: int, action: Any, original: Any) -> Any:
    """``original`` that runs ``action()`` before its ``n``-th call."""
    calls = []

    def wrapped(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == n:
            action()
        return original(*args)

    return wrapped


if mode == "record":
    save = distseq.train.loop.save_checkpoint

    def save_and_predict(root: Path, state: Any, position: Any, *args: Any) -> Path:
        path = save(root, state, position, *args)
        if position.step == cfg.train.steps:
            batch = random_batch(2, 8)
            params = dict(getattr(state.model, "module", state.model).named_parameters())
            with torch.no_grad():
                trained = {n: p.detach().clone() for n, p in params.items()}
                for n, p in params.items():  # what export writes: the average, where there is one
                    p.copy_((state.average or trained)[n])
                logits = state.model.eval()(batch.frames, batch.mask)
                for n, p in params.items():
                    p.copy_(trained[n])
            state.model.train()
            if rank == 0:
                torch.save(logits, root.parent / "logits.pt")
        return path

    distseq.train.loop.save_checkpoint = save_and_predict  # type: ignore[assignment]

elif mode == "record_load":
    load = distseq.train.loop.restore_training

    def load_and_keep(path: Path, state: Any) -> Any:
        resumed = load(path, state)
        options = StateDictOptions(full_state_dict=True)
        model, optim = get_state_dict(state.model, state.optimizer, options=options)
        loaded = {"model": model, "optim": optim, "schedule": state.schedule.state_dict()}
        if state.average is not None:
            loaded["ema"] = {
                n: t.full_tensor() if hasattr(t, "full_tensor") else t
                for n, t in state.average.items()
            }
        torch.save(loaded, Path(cfg.train.out_dir) / f"loaded_{rank}.pt")
        return resumed

    distseq.train.loop.restore_training = load_and_keep

elif mode == "record_bn":
    save_bn = distseq.train.loop.save_checkpoint

    def save_and_keep_bn(root: Path, state: Any, position: Any, *args: Any) -> Path:
        path = save_bn(root, state, position, *args)
        stats = {n: b.clone() for n, b in state.model.named_buffers() if ".running_" in n}
        torch.save(stats, root.parent / f"bn_{rank}_{position.step}.pt")
        return path

    distseq.train.loop.save_checkpoint = save_and_keep_bn  # type: ignore[assignment]

elif mode == "kill_in_save":
    finish = dcp_fs.FileSystemWriter.finish

    def finish_or_die(self: Any, **kwargs: Any) -> Any:
        if Path(self.path).name == f"step_{cfg.train.steps:08d}.tmp":
            die()
        return finish(self, **kwargs)

    dcp_fs.FileSystemWriter.finish = finish_or_die  # type: ignore[method-assign, assignment]

elif mode == "kill_rank1_once" and rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    # in its third step, after the checkpoint of step 2; the restarted group must resume there
    distseq.train.loop.train_step = on_call(3, die, distseq.train.loop.train_step)

elif mode == "term_rank1" and rank == 1:
    distseq.train.loop.train_step = on_call(3, term, distseq.train.loop.train_step)

distseq.train.loop.train(cfg, stop=StopSignals())
