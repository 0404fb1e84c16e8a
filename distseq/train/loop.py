"""The training loop, as a recipe: build, restore, then step, log, validate and save."""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from distseq.checkpoint.sharded import (
    Position,
    RankState,
    TrainState,
    latest_checkpoint,
    load_checkpoint,
    read_rank_state,
    restore_rng,
    save_checkpoint,
)
from distseq.config import Config, Offload, to_yaml
from distseq.data.batch import Batch
from distseq.data.format import load_manifest
from distseq.data.train_stream import train_batches
from distseq.data.val_stream import val_batches
from distseq.errors import TrainingError
from distseq.evaluate.validate import validate
from distseq.files import write_atomic
from distseq.memory.chunked import ChunkedModel
from distseq.memory.plan import Plan, Probe, budget_bytes, fit, format_size, probe
from distseq.memory.policy import apply_memory_policy
from distseq.model.head import Carry
from distseq.model.video import build_model
from distseq.parallel import (
    DistInfo,
    all_reduce_sum,
    any_rank,
    average_batchnorm_stats,
    close_distributed,
    from_rank_zero,
    init_distributed,
    parallelize,
)
from distseq.train.log import MetricsLog
from distseq.train.optim import build_optimizer
from distseq.train.signals import Interrupted
from distseq.train.step import check_every_parameter_has_grad, clip_grad_norm, train_step


def _micro_batches(
    stream: Iterator[Batch], n: int, device: torch.device, frames_on_host: bool
) -> list[Batch]:
    return [next(stream).to(device, frames_on_host=frames_on_host) for _ in range(n)]


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


def _val_scores(report: dict[str, Any]) -> dict[str, float]:
    """The validation numbers a run logs: per-frame accuracy over all labelled frames, as the loss
    counts them, and the phase metrics' means (strict, no relaxed window)."""
    scores = {"val_accuracy": report["frame_level"]["accuracy"]}
    scores["val_video_accuracy"] = report["accuracy"]["mean"]
    for metric in ("precision", "recall", "jaccard", "f1"):
        scores[f"val_{metric}"] = report[metric]["mean"]
    return scores


def _plan_memory(
    cfg: Config, model: torch.nn.Module, chunked: ChunkedModel, classes: int, info: DistInfo
) -> None:
    """Probe, agree on rank 0's measurements, refuse a budget that cannot hold data.window
    frames, and let the plan set each chunk's hold for each T from now on (memory.plan)."""
    budget = budget_bytes(cfg.memory.budget, info.device)
    data, on_host = cfg.data, cfg.memory.offload is Offload.frames

    def plan_at(largest: int) -> Plan:
        measured = probe(
            model,
            chunked,
            data.batch_size,
            data.size,
            classes,
            data.window,
            info.device,
            on_host,
            largest,
        )
        agreed = Probe.from_tensor(from_rank_zero(measured.as_tensor().to(info.device)))
        return Plan(agreed, budget, tuple(chunked.stages))

    plan = fit(plan_at, data.window, _say if info.is_main else _silent)
    if info.is_main:
        print(f"memory plan: {plan.describe(cfg.data.window)}", flush=True)
    plan.apply(chunked)


def _silent(text: str) -> None:
    pass


def _say(text: str) -> None:
    print(text, flush=True)


def _train(cfg: Config, info: DistInfo, stop: Callable[[], bool] | None) -> dict[str, float]:
    out = Path(cfg.train.out_dir)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "config.yaml", to_yaml(cfg))

    manifest = load_manifest(cfg.data)
    torch.manual_seed(cfg.train.seed)  # identical initial parameters on every rank
    chunked = apply_memory_policy(build_model(cfg.model, manifest.num_classes), cfg.memory)
    model = parallelize(chunked, cfg.parallel, info)
    if cfg.memory.budget:
        _plan_memory(cfg, model, chunked, manifest.num_classes, info)
    optimizer, schedule = build_optimizer(model, cfg.optim, cfg.train.steps)
    state = TrainState(model, optimizer, schedule, cfg, manifest.classes)
    checkpoints = out / "checkpoints"
    latest = latest_checkpoint(checkpoints)
    resumed = None if latest is None else load_checkpoint(latest, state)
    position = Position(seed=cfg.train.seed) if resumed is None else resumed.position
    metrics = {} if resumed is None else resumed.metrics
    last_step = min(cfg.train.steps, cfg.train.stop_after or cfg.train.steps)
    if position.step >= last_step:  # nothing left to train, e.g. a finished run launched again
        return metrics

    saved = RankState() if resumed is None else read_rank_state(resumed)
    # The stream is deterministic for its seed; it seeks past the batches already trained on
    # without decoding them, given which samples turned out bad on the way.
    stream = train_batches(
        cfg.data,
        seed=position.seed,
        rank=info.rank,
        world=info.world,
        skip_batches=position.batches,
        bad=set(saved.skipped),
    )
    stream = itertools.chain([next(stream)], stream)
    if resumed is not None:
        # Only now: starting the loader just above drew its workers' base seed from torch's
        # RNG, as the uninterrupted run did at its first step.
        restore_rng(resumed, saved)
    skipped, carries = saved.skipped, _carries(cfg, saved, info.device)

    offload = cfg.memory.offload is Offload.frames
    if offload and info.is_main:
        data = cfg.data
        host = data.batch_size * cfg.optim.accum_steps * data.window * 3 * data.size**2
        print(f"memory.offload=frames: up to {format_size(host)} of frames in host memory")
    first = position.step + 1
    # Redraws are for terminals; in a log file each one is a line, so write one every 30 s. The
    # bar closes on any error too, so that the error is printed on a line of its own.
    with (
        MetricsLog(out, info.is_main, after_step=position.step) as log,
        tqdm(
            total=cfg.train.steps,
            initial=position.step,
            desc="train",
            disable=not info.is_main,
            dynamic_ncols=True,
            mininterval=0.5 if sys.stderr.isatty() else 30.0,
        ) as bar,
    ):
        # tqdm's write prints even where the bar is disabled: only rank 0 speaks; the others
        # print only errors, which name their rank (cli.py).
        say = bar.write if info.is_main else _silent
        for step in range(first, last_step + 1):
            asked = time.perf_counter()
            batches = _micro_batches(stream, cfg.optim.accum_steps, info.device, offload)
            start = time.perf_counter()
            loss, real_frames = train_step(model, optimizer, batches, info.world, carries)
            if step == first:
                check_every_parameter_has_grad(model)
            grad_norm = clip_grad_norm(model, cfg.optim.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            average_batchnorm_stats(model)
            lr = float(schedule.get_last_lr()[0])
            schedule.step()
            seconds = time.perf_counter() - start
            if not math.isfinite(loss):
                raise TrainingError(f"loss is {loss} at step {step}; lower optim.lr?")
            position = Position(step, position.batches + len(batches), position.seed)
            metrics = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm}
            metrics["frames_per_s"] = real_frames / seconds
            # Above about 0.1 the loader, not the model, sets the pace: add data.num_workers.
            metrics["data_wait_fraction"] = (start - asked) / (start - asked + seconds)
            skipped += [bad for batch in batches for bad in batch.skipped]
            # A refresh per step floods logs.
            bar.set_postfix(loss=f"{loss:.4f}", fps=f"{real_frames / seconds:.0f}", refresh=False)
            bar.update()
            if step % cfg.train.log_every == 0 or step == cfg.train.steps:
                count = torch.tensor([float(len(skipped))], device=info.device)
                metrics["skipped_samples"] = int(all_reduce_sum(count).item())  # all ranks, legs
                if info.device.type == "cuda":  # the peak since the last record, this rank
                    metrics["peak_memory_bytes"] = torch.cuda.max_memory_allocated(info.device)
                    torch.cuda.reset_peak_memory_stats(info.device)
                log.write(metrics)
                say(
                    f"step {step}: loss {loss:.4f}  lr {lr:.2e}  grad_norm {grad_norm:.3f}  "
                    f"{metrics['frames_per_s']:.0f} frames/s"
                )
            last = step == cfg.train.steps
            every = cfg.train.eval_every
            if cfg.data.val and (last or (every and step % every == 0)):
                val = val_batches(cfg.data, manifest, info.rank, info.world)
                scores = _val_scores(validate(model, val, info.device, manifest.classes))
                metrics.update(scores)
                log.write({"step": step, **scores})
                say(
                    f"step {step}: val per-frame accuracy {scores['val_accuracy']:.3f}, "
                    f"video accuracy {scores['val_video_accuracy']:.3f}, "
                    f"jaccard {scores['val_jaccard']:.3f}"
                )
            # One tiny all-reduce per step: a signal reaches the ranks at different moments, and
            # a save that only some ranks join would hang the others.
            stopping = stop is not None and any_rank(stop())
            save = cfg.train.save_every and step % cfg.train.save_every == 0
            if step == last_step or stopping or save:
                rank_state = _rank_state(skipped, carries)
                save_checkpoint(
                    checkpoints, state, position, metrics, cfg.train.keep_last, rank_state
                )
            if stopping and step < last_step:
                raise Interrupted(step)
    return metrics
