"""The training loop: optimizer, schedule, accumulation, evaluation, metrics and progress."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import sys
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from tqdm import tqdm

from distseq import data
from distseq.checkpoint import (
    Position,
    RankState,
    TrainingError,
    TrainState,
    latest_checkpoint,
    load_checkpoint,
    read_rank_state,
    restore_rng,
    save_checkpoint,
)
from distseq.config import Config, OptimConfig, to_yaml
from distseq.data import Batch
from distseq.memory import apply_memory_policy
from distseq.model import Carry, build_model
from distseq.parallel import (
    DistInfo,
    all_reduce_sum,
    close_distributed,
    gradient_sync,
    init_distributed,
    parallelize,
)


class Interrupted(TrainingError):
    """Training stopped early because it was asked to, after every rank saved a checkpoint."""

    def __init__(self, step: int) -> None:
        super().__init__(f"stopped on request after step {step}, saved; run again to resume")
        self.step = step


class StopSignals:
    """Turns SIGTERM and SIGUSR2 into a request to stop at the next step with a checkpoint.

    Pass it as ``train(cfg, stop=...)``; ``received`` says which signals came.
    """

    def __init__(self) -> None:
        self.received: set[int] = set()
        for sig in (signal.SIGTERM, signal.SIGUSR2):
            signal.signal(sig, self._record)

    def _record(self, signum: int, frame: types.FrameType | None) -> None:
        self.received.add(signum)

    def __call__(self) -> bool:
        return bool(self.received)


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def warmup_cosine(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)


def check_every_parameter_has_grad(model: nn.Module) -> None:
    """Fail loudly where checkpointing or sharding would silently stop a part from learning."""
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if missing:
        raise TrainingError(
            f"{len(missing)} parameters got no gradient after the first step "
            f"(e.g. {missing[0]}); refusing to train a model that cannot learn"
        )


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):  # sharded gradients: the local norm is a partial result
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, norm)
    return float(norm)


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[Batch],
    world: int,
    carries: dict[int, Carry] | None = None,
) -> tuple[float, int]:
    """Forward and backward over the micro-batches of one optimizer step.

    Returns the mean loss per real frame over the global batch and the global frame count. Each
    rank's loss is scaled so that the gradient average that DDP and FSDP perform gives exactly
    the gradient of the global mean, whatever the padding on each rank.

    ``carries`` (ordered mode): the RNN state of each loader worker's lanes, carried across
    batches; each worker's batches continue its own videos.
    """
    frames = all_reduce_sum(sum(b.mask.sum() for b in micro_batches).double())  # type: ignore[union-attr]
    total = torch.zeros((), dtype=torch.float64, device=micro_batches[0].mask.device)
    for i, batch in enumerate(micro_batches):
        carry = None if carries is None else carries.setdefault(batch.worker, Carry())
        if carry is not None:
            carry.reset(batch.starts)
        with gradient_sync(model, enabled=i == len(micro_batches) - 1):
            logits = model(batch.frames, batch.mask, carry)
            loss_sum = F.cross_entropy(
                logits.flatten(0, 1).float(), batch.labels.flatten(), reduction="sum"
            )
            (loss_sum * (world / frames)).backward()
        total += loss_sum.detach().double()
    return float(all_reduce_sum(total) / frames), int(frames)


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Batch], device: torch.device) -> float:
    """Per-frame accuracy over real frames of the whole validation split, all ranks together."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in batches:
        batch = batch.to(device)
        pred = model(batch.frames, batch.mask).argmax(-1)
        counts[0] += (pred[batch.mask] == batch.labels[batch.mask]).sum()
        counts[1] += batch.mask.sum()
    model.train()
    correct, total = all_reduce_sum(counts).tolist()
    return correct / max(total, 1.0)


def _recorded_by(line: str, step: int) -> bool:
    """Whether a metrics line records ``step`` or an earlier one."""
    try:
        return int(json.loads(line)["step"]) <= step
    except (ValueError, KeyError, TypeError):  # a line torn by a killed process
        return False


class MetricsLog:
    """JSON lines on the main rank; other ranks write nothing."""

    def __init__(self, path: Path, enabled: bool, after_step: int) -> None:
        self.enabled = enabled
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            # A resumed run trains the steps after its checkpoint again: drop their records
            # (and a fresh run's stale ones) so that the log reads as one uninterrupted run.
            lines = path.read_text().splitlines() if path.exists() else []
            kept = [line for line in lines if _recorded_by(line, after_step)]
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            os.replace(tmp, path)
            self.file = path.open("a")

    def write(self, record: Mapping[str, object]) -> None:
        if self.enabled:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()


def _micro_batches(stream: Iterator[Batch], n: int, device: torch.device) -> list[Batch]:
    return [next(stream).to(device) for _ in range(n)]


def _carries(cfg: Config, saved: RankState, device: torch.device) -> dict[int, Carry] | None:
    if not cfg.data.ordered:
        return None
    carries = {}
    for worker, state in saved.carries.items():
        carries[worker] = carry = Carry()
        carry.state = (
            (state[0].to(device), state[1].to(device))
            if isinstance(state, tuple)
            else state.to(device)
        )
    return carries


def _rank_state(skipped: list[str], carries: dict[int, Carry] | None) -> RankState:
    held = (carries or {}).items()
    return RankState(skipped, {w: c.state for w, c in held if c.state is not None})


def train(cfg: Config, stop: Callable[[], bool] | None = None) -> dict[str, float]:
    """Run one training job as this process's rank; returns the final metrics.

    ``stop`` is polled after every step; once it returns True on any rank, all ranks save a
    checkpoint together and raise :class:`Interrupted` (e.g. a SLURM job told to stop).
    """
    info = init_distributed()
    try:
        return _train(cfg, info, stop)
    finally:
        close_distributed()


def _any_rank(flag: bool, device: torch.device) -> bool:
    return bool(all_reduce_sum(torch.tensor([float(flag)], device=device)).item() > 0)


def _train(cfg: Config, info: DistInfo, stop: Callable[[], bool] | None) -> dict[str, float]:
    out = Path(cfg.train.out_dir)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(to_yaml(cfg))

    manifest = data.load_manifest(cfg.data)
    torch.manual_seed(cfg.train.seed)  # identical initial parameters on every rank
    model = parallelize(
        apply_memory_policy(build_model(cfg.model, manifest.num_classes), cfg.memory),
        cfg.parallel,
        info,
    )
    optimizer, schedule = build_optimizer(model, cfg.optim, cfg.train.steps)
    state = TrainState(model, optimizer, schedule, cfg, manifest.classes)
    checkpoints = out / "checkpoints"
    latest = latest_checkpoint(checkpoints)
    resumed = None if latest is None else load_checkpoint(latest, state)
    position = Position(seed=cfg.train.seed) if resumed is None else resumed.position
    metrics = {} if resumed is None else resumed.metrics
    log = MetricsLog(out / "metrics.jsonl", info.is_main, after_step=position.step)
    last_step = min(cfg.train.steps, cfg.train.stop_after or cfg.train.steps)
    if position.step >= last_step:  # nothing left to train, e.g. a finished run launched again
        return metrics

    saved = RankState() if resumed is None else read_rank_state(resumed)
    # The stream is deterministic for its seed; it seeks past the batches already trained on
    # without decoding them, given which samples turned out bad on the way.
    stream = data.train_batches(
        cfg.data, seed=position.seed, skip_batches=position.batches, bad=set(saved.skipped)
    )
    stream = itertools.chain([next(stream)], stream)
    if resumed is not None:
        # Only now: starting the loader just above drew its workers' base seed from torch's
        # RNG, as the uninterrupted run did at its first step.
        restore_rng(resumed, saved)
    skipped, carries = saved.skipped, _carries(cfg, saved, info.device)

    first = position.step + 1
    # Redraws are for terminals; in a log file each one is a line, so write one every 30 s.
    bar = tqdm(
        total=cfg.train.steps,
        initial=position.step,
        desc="train",
        disable=not info.is_main,
        dynamic_ncols=True,
        mininterval=0.5 if sys.stderr.isatty() else 30.0,
    )
    for step in range(first, last_step + 1):
        batches = _micro_batches(stream, cfg.optim.accum_steps, info.device)
        start = time.perf_counter()
        loss, frames = train_step(model, optimizer, batches, info.world, carries)
        if step == first:
            check_every_parameter_has_grad(model)
        grad_norm = clip_grad_norm(model, cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lr = float(schedule.get_last_lr()[0])
        schedule.step()
        seconds = time.perf_counter() - start
        if not math.isfinite(loss):
            raise TrainingError(f"loss is {loss} at step {step}; lower optim.lr?")
        position = Position(step, position.batches + len(batches), position.seed)
        metrics = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm}
        metrics["frames_per_s"] = frames / seconds
        skipped += [bad for batch in batches for bad in batch.skipped]
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)  # a refresh per step floods logs
        bar.update()
        if step % cfg.train.log_every == 0 or step == cfg.train.steps:
            count = torch.tensor([float(len(skipped))], device=info.device)
            metrics["skipped_samples"] = int(all_reduce_sum(count).item())  # all ranks, all legs
            log.write(metrics)
            bar.write(
                f"step {step}: loss {loss:.4f}  lr {lr:.2e}  grad_norm {grad_norm:.3f}  "
                f"{metrics['frames_per_s']:.0f} frames/s"
            )
        last = step == cfg.train.steps
        if cfg.data.val and (last or (cfg.train.eval_every and step % cfg.train.eval_every == 0)):
            metrics["val_accuracy"] = evaluate(
                model, data.val_batches(cfg.data, manifest), info.device
            )
            log.write({"step": step, "val_accuracy": metrics["val_accuracy"]})
            bar.write(f"step {step}: val per-frame accuracy {metrics['val_accuracy']:.3f}")
        # One tiny all-reduce per step: a signal reaches the ranks at different moments, and
        # a save that only some ranks join would hang the others.
        stopping = stop is not None and _any_rank(stop(), info.device)
        if (
            step == last_step
            or stopping
            or (cfg.train.save_every and step % cfg.train.save_every == 0)
        ):
            rank_state = _rank_state(skipped, carries)
            save_checkpoint(checkpoints, state, position, metrics, cfg.train.keep_last, rank_state)
        if stopping and step < last_step:
            bar.close()
            raise Interrupted(step)
    bar.close()
    return metrics
