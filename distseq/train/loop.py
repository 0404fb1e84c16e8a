"""The training loop, as a recipe: set up and restore, then step, validate and save."""

from __future__ import annotations

import itertools
import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from distseq.checkpoint.out_dir import check_shared
from distseq.checkpoint.sharded import (
    Best,
    Position,
    RankState,
    Resumed,
    TrainState,
    latest_checkpoint,
    read_rank_state,
    restore_rng,
    restore_training,
    save_checkpoint,
)
from distseq.config import Config, Offload, to_yaml, with_absolute_paths
from distseq.data.batch import Batch, Part
from distseq.data.manifest import Manifest, load_manifest
from distseq.data.tar import expand, longest_sample, shard_name
from distseq.data.train_stream import Resume, resume_problem, train_batches
from distseq.data.val_stream import val_batches
from distseq.errors import ConfigError, TrainingError, first_line
from distseq.files import write_atomic
from distseq.memory.budget import plan_for_budget
from distseq.memory.chunked import compiled_graphs
from distseq.memory.policy import apply_memory_policy
from distseq.model.head import Carry, map_state
from distseq.model.video import FeatureModel, VideoModel, build_feature_model, build_model
from distseq.parallel import (
    DistInfo,
    Node,
    all_reduce_sum,
    any_rank,
    average_batchnorm_stats,
    close_distributed,
    from_rank_zero,
    init_distributed,
    is_collective_failure,
    nodes,
    nodes_line,
    parallelize,
    say,
    sequence_line,
    unreachable,
)
from distseq.score.validate import validate, validation_scores
from distseq.train.ema import WeightAverage
from distseq.train.log import MetricsLog
from distseq.train.loss import Loss, build_loss
from distseq.train.optim import (
    Freezing,
    backbone_frozen_until,
    build_optimizer,
    freeze_for_the_run,
    warmup_cosine,
)
from distseq.train.select import Selection
from distseq.train.signals import Interrupted
from distseq.train.step import check_every_parameter_has_grad, clip_grad_norm, train_step
from distseq.train.warm_start import warm_start
from distseq.units import format_size


@dataclass
class Run:
    """What the steps of one run share: built by :func:`_set_up`, advanced by each step."""

    cfg: Config
    info: DistInfo
    manifest: Manifest
    model: nn.Module
    state: TrainState  # the model, optimizer and schedule, as a checkpoint saves them
    resumed: Resumed | None
    rank_state: RankState  # what this rank alone saved, as read back: RNG states, skips, carries
    position: Position
    metrics: dict[str, float]  # the last step's
    first_step: int  # this leg's
    last_step: int  # this leg's: train.stop_after or train.steps
    skipped: list[str]  # bad samples this rank's stream skipped, from the start of the run
    streams: dict[int, dict[str, Any]]  # each loader worker's position after its last batch taken
    carries: dict[int, Carry] | None  # data.ordered: the RNN state of each loader worker's lanes
    nodes: list[Node]  # the group's hosts, [] on one
    loss: Loss
    freezing: Freezing  # optim.groups frozen for the first steps
    part: Part | None  # under a sequence split: the frames of each batch this rank holds
    selection: Selection | None  # train.select, where there is data.val to select on
    average: WeightAverage | None  # train.ema
    best: Best  # the selection so far

    @property
    def checkpoints(self) -> Path:
        return Path(self.cfg.train.out_dir) / "checkpoints"


def train(cfg: Config, stop: Callable[[], bool] | None = None) -> dict[str, float]:
    """Run one training job as this process's rank; returns the final metrics.

    ``stop`` is polled after every step; once it returns True on any rank, all ranks save a
    checkpoint together and raise :class:`Interrupted` (e.g. a SLURM job told to stop).
    """
    info = init_distributed(cfg.parallel.timeout_s)
    try:
        return _train(cfg, info, stop)
    finally:
        close_distributed()


def _train(cfg: Config, info: DistInfo, stop: Callable[[], bool] | None) -> dict[str, float]:
    run = _set_up(cfg, info)
    if run.position.step >= run.last_step:  # nothing left to train: a finished run relaunched
        return run.metrics
    if run.selection is not None and run.selection.spent(run.best):  # it stopped early
        say(f"train.patience: the run stopped early at step {run.position.step}; best: "
            f"{run.selection.said(run.best)}")  # fmt: skip
        return run.metrics
    # From the first batch on (a rank's bad frame there leaves the others in the poll below),
    # a collective that fails is one line on every rank.
    try:
        stream = _batches(run)
        # The first poll: from here on a stop waits for the next step boundary, where all ranks
        # save together (before it, StopSignals stops the run at once). A stop asked for on some
        # rank before this point has nothing of this leg to save.
        if stop is not None and any_rank(stop()):
            raise Interrupted(run.position.step, saved=False)
        return _steps(run, stream, stop)
    except Exception as e:
        if is_collective_failure(e):
            raise _lost(run, e) from None
        raise


def _lost(run: Run, error: Exception) -> TrainingError:
    """One line for a collective that failed: which node does not answer, and what to do."""
    gone = unreachable(run.nodes)
    who = "; ".join(f"{node} does not answer" for node in gone) or (
        "every node answers: a rank there died or hangs"
        if run.nodes
        else "the group's other ranks stopped"
    )
    latest = latest_checkpoint(run.checkpoints)
    what = re.sub(r"^\[[^\]]*\]\s*", "", first_line(error))  # gloo's source file and line
    return TrainingError(
        f"a collective failed after step {run.position.step} (parallel.timeout_s="
        f"{run.cfg.parallel.timeout_s:g}): {what}; {who}; relaunch when every node is back: the "
        f"run resumes from {latest.name if latest else 'its start'}"
    )


def _steps(run: Run, stream: Iterator[Batch], stop: Callable[[], bool] | None) -> dict[str, float]:
    """The loop of steps, validations and saves to the leg's last step."""
    cfg, info = run.cfg, run.info
    with (
        MetricsLog(Path(cfg.train.out_dir), info.is_main, run.position.step) as log,
        _bar(run) as bar,
    ):
        warm = run.position.step == 0 and cfg.train.init_from and run.selection is not None
        # A warm start may be better than anything trained from it: step 0 is a candidate.
        if warm and _validate(run, 0, log):
            _save(run)
        for step in range(run.first_step, run.last_step + 1):
            _step(run, stream, step, log, bar)
            every = cfg.train.eval_every
            best = False  # this step's validation is the best so far
            if cfg.data.val and (step == cfg.train.steps or (every and step % every == 0)):
                best = _validate(run, step, log)
            early = run.selection is not None and run.selection.spent(run.best)
            # One tiny all-reduce per step: a signal reaches the ranks at different moments, and
            # a save that only some ranks join would hang the others.
            stopping = stop is not None and any_rank(stop())
            every = cfg.train.save_every
            if step == run.last_step or stopping or best or early or (every and step % every == 0):
                _save(run)
            if early:
                assert run.selection is not None
                say(
                    f"train.patience={cfg.train.patience}: no better validation in "
                    f"{cfg.train.patience} since step {run.best.step}; stopping early at step "
                    f"{step} (best: {run.selection.said(run.best)})"
                )
                return run.metrics
            if stopping and step < run.last_step:
                raise Interrupted(step)
    return run.metrics


def _set_up(cfg: Config, info: DistInfo) -> Run:
    """The model, sharded and planned, its optimizer, and the run's position: restored from the
    latest checkpoint if there is one."""
    cfg = with_absolute_paths(cfg)  # what the run records means the same files from anywhere
    found = nodes()
    if line := nodes_line(found):
        say(line)
    host = {rank: node.host for node in found for rank in node.ranks}
    if line := sequence_line(cfg, info.world, host):
        say(line)
    out = Path(cfg.train.out_dir)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "config.yaml", to_yaml(cfg))
    check_shared(out)
    manifest = load_manifest(cfg.data)
    names = _shard_names(cfg.data.train)
    loss = build_loss(  # its faults before any work
        cfg.loss, manifest.classes, lambda: manifest.label_counts(names)
    )
    torch.manual_seed(cfg.train.seed)  # identical initial parameters on every rank
    latest = latest_checkpoint(out / "checkpoints")
    plain = _model(cfg, manifest)
    if not plain.stateful and cfg.data.window:
        say(
            f"model.head.kind={cfg.model.head.kind} carries no state: it learns from windows of "
            f"data.window={cfg.data.window} frames, but predict and eval give it whole videos"
        )
    if cfg.train.init_from and latest is None:
        warm_start(plain, cfg.train.init_from, say)  # before any wrapper: canonical keys
    elif cfg.train.init_from:
        say(f"train.init_from not loaded: resuming from {latest}")
    groups, steps = cfg.optim.groups, cfg.train.steps
    if frozen := freeze_for_the_run(plain, groups, steps):
        say(f"optim.groups: {frozen} parameters frozen through step {steps}, the run's last")
    # A backbone frozen for a while and then trained gets no gradient while frozen.
    frozen_steps = 0 < backbone_frozen_until(plain, groups) < steps
    wrapping = (cfg.parallel.mode, cfg.parallel.precision, info)
    part = None
    if isinstance(plain, FeatureModel):  # no backbone: nothing to chunk, compile or plan
        model = parallelize(plain, *wrapping)
    else:
        chunked = apply_memory_policy(plain, cfg.memory)
        if cfg.model.compile:  # before planning: the plan measures the compiled backbone
            chunked.compile_backbone(cfg.model.compile_backend)
        sequence = cfg.parallel.sequence
        model = parallelize(chunked, *wrapping, frozen_steps=frozen_steps, sequence=sequence)
        if cfg.memory.budget:
            classes = manifest.num_classes
            window = _longest_window(cfg, info)
            plan_for_budget(
                cfg, model, chunked, classes, window, info.device, from_rank_zero, say,
                info.is_main,
            )  # fmt: skip
        part = info.data_part(sequence, chunked.chunk_frames)  # the plan's chunks
    optimizer, schedule = build_optimizer(model, cfg.optim, cfg.train.steps)
    # The unwrapped model's names are the checkpoint's; under FSDP2 its parameters are shards.
    average = (
        WeightAverage(getattr(model, "module", model), cfg.train.ema) if cfg.train.ema else None
    )
    state = TrainState(model, optimizer, schedule, cfg, manifest.classes)
    state.average = None if average is None else average.average
    resumed = None if latest is None else restore_training(latest, state)
    if average is not None and resumed is not None and not resumed.averaged:
        average.restart()
        say(f"train.ema: {latest} holds no weight average; it starts from its weights")
    position = Position(seed=cfg.train.seed) if resumed is None else resumed.position
    saved = RankState() if resumed is None else read_rank_state(resumed, cfg.parallel.sequence)
    return Run(
        cfg,
        info,
        manifest,
        model,
        state,
        resumed,
        saved,
        position,
        metrics={} if resumed is None else resumed.metrics,
        first_step=position.step + 1,
        last_step=min(cfg.train.steps, cfg.train.stop_after or cfg.train.steps),
        skipped=list(saved.skipped),  # grows; rank_state stays what was read back
        streams=dict(saved.streams),
        carries=_carries(cfg, saved, info.device),
        nodes=found,
        loss=loss,
        freezing=Freezing(model, cfg.optim.groups),
        part=part,
        selection=_selection(cfg),
        average=average,
        best=Best() if resumed is None else resumed.best,
    )


def _model(cfg: Config, manifest: Manifest) -> VideoModel | FeatureModel:
    """The plain model; on feature shards its head alone, over features of the manifest's size."""
    model: VideoModel | FeatureModel
    if not cfg.data.features:
        model = build_model(cfg.model, manifest.num_classes)
    else:
        model = build_feature_model(cfg.model, manifest.num_classes)
    if cfg.data.ordered and not model.stateful:
        raise ConfigError(
            f"config key data.ordered: carries a head's state across windows, and "
            f"model.head.kind={cfg.model.head.kind} carries none (its forward takes no state)"
        )
    if cfg.data.features and model.feature_dim != manifest.feature_dim:
        raise ConfigError(
            f"config key model.backbone.name={cfg.model.backbone.name}: makes "
            f"{model.feature_dim} features a frame, but {manifest.path} holds "
            f"{manifest.feature_dim}: "
            "name the backbone that made the feature shards"
        )
    return model


def _selection(cfg: Config) -> Selection | None:
    """train.select, or None (and a line saying so) where no validation can select; a score
    that validation never logs is refused either way, as it could never be valid."""
    train = cfg.train
    if not train.select:
        return None
    selection = Selection.of(train.select, train.patience)
    if not cfg.data.val:
        say(f"train.select={train.select!r}: no data.val to validate on; the last step is kept")
        return None
    return selection


def _longest_window(cfg: Config, info: DistInfo) -> int:
    """T of the longest sequence the run trains on, what a memory plan must fit: data.window, or
    with 0 the longest training video as read (every data.frame_stride-th frame), from rank
    0's reading of the shards' headers."""
    if cfg.data.window:
        return cfg.data.window
    urls = expand(cfg.data.train, "data.train", "train")
    longest = -(-longest_sample(urls, "data.train") // cfg.data.frame_stride) if info.is_main else 0
    frames = int(from_rank_zero(torch.tensor([longest], device=info.device)).item())
    say(f"memory plan: data.window=0, whole videos: the longest training video is {frames} frames")
    return frames


def _shard_names(urls: str) -> list[str]:
    return [shard_name(url) for url in expand(urls, "data.train", "train")]


def _carries(cfg: Config, saved: RankState, device: torch.device) -> dict[int, Carry] | None:
    if not cfg.data.ordered:
        return None
    carries = {}
    for worker, state in saved.carries.items():
        carries[worker] = carry = Carry()
        carry.state = map_state(lambda t: t.to(device), state)
    return carries


def _batches(run: Run) -> Iterator[Batch]:
    """This rank's training batches from the run's position on, with the RNG states restored."""
    cfg, info = run.cfg, run.info
    rank, world = info.data_rank(cfg.parallel.sequence)  # a sequence group shares its batches
    stream = train_batches(
        cfg.data, seed=run.position.seed, rank=rank, world=world, resume=_resume(run),
        part=run.part,
    )  # fmt: skip
    stream = itertools.chain([next(stream)], stream)
    if run.resumed is not None:
        # Only now: starting the loader just above drew its workers' base seed from torch's
        # RNG, as the uninterrupted run did at its first step.
        restore_rng(run.resumed, run.rank_state, cfg.parallel.sequence)
    if cfg.memory.offload is Offload.frames:
        data = cfg.data
        frame = 3 * data.size**2
        if data.window:
            host = data.batch_size * cfg.optim.accum_steps * data.window * frame
            say(f"memory.offload=frames: up to {format_size(host)} of frames in host memory")
        else:
            say(f"memory.offload=frames: whole videos in host memory, {format_size(frame)} a frame")
    return stream


def _resume(run: Run) -> Resume:
    """Where this rank's stream goes on: from the positions the run's last batches carried; or,
    where the checkpoint has none that fit, anew, saying so."""
    batches, positions = run.position.batches, run.streams
    problem = resume_problem(run.cfg.data, positions, batches) if batches else None
    if problem is None:
        return Resume(batches, positions)
    assert run.resumed is not None  # a run from its start has taken no batch
    say(
        f"distseq: {run.resumed.path}: {problem}: the data stream starts anew here, so the "
        "batches from here on differ from the saved run's"
    )
    return Resume(batches, afresh=f":{batches}")


def _bar(run: Run) -> tqdm:
    """The progress bar, on rank 0 alone. Redraws are for terminals; in a log file each one is a
    line, so it writes one every 30 s. It closes on any error too, so that the error is printed
    on a line of its own."""
    return tqdm(
        total=run.cfg.train.steps,
        initial=run.position.step,
        desc="train",
        disable=not run.info.is_main,
        dynamic_ncols=True,
        mininterval=0.5 if sys.stderr.isatty() else 30.0,
    )


def _step(run: Run, stream: Iterator[Batch], step: int, log: MetricsLog, bar: tqdm) -> None:
    """One optimizer step, its metrics, and their record every train.log_every steps."""
    cfg, info, model, optimizer = run.cfg, run.info, run.model, run.state.optimizer
    asked = time.perf_counter()
    offload = cfg.memory.offload is Offload.frames
    batches = [
        next(stream).to(info.device, frames_on_host=offload) for _ in range(cfg.optim.accum_steps)
    ]
    start = time.perf_counter()
    run.freezing.before_step(step)
    loss, real_frames = train_step(model, optimizer, batches, info.world, run.carries, run.loss)
    real_frames //= cfg.parallel.sequence  # every rank of a sequence group counted its batch
    if step == run.first_step or run.freezing.unfreezes(step):  # and a part's first step
        check_every_parameter_has_grad(model, run.freezing.frozen_at(step))
    run.freezing.after_backward(step)
    grad_norm = clip_grad_norm(model, cfg.optim.grad_clip)
    optimizer.step()
    if run.average is not None:
        run.average.update()
    optimizer.zero_grad(set_to_none=True)
    average_batchnorm_stats(model)
    # optim.lr's share: every group follows it, scaled (and a frozen one from its unfreezing).
    lr = cfg.optim.lr * warmup_cosine(cfg.optim, cfg.train.steps, run.state.schedule.last_epoch)
    run.state.schedule.step()
    seconds = time.perf_counter() - start
    if not math.isfinite(loss):
        raise TrainingError(f"loss is {loss} at step {step}; lower optim.lr?")
    run.position = Position(step, run.position.batches + len(batches), run.position.seed)
    metrics = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm}
    metrics["frames_per_s"] = real_frames / seconds
    metrics["step_seconds"] = seconds
    # Above about 0.1 the loader, not the model, sets the pace: add data.num_workers.
    metrics["data_wait_fraction"] = (start - asked) / (start - asked + seconds)
    run.metrics = metrics
    run.skipped += [bad for batch in batches for bad in batch.skipped]
    run.streams.update((b.worker, b.position) for b in batches if b.position is not None)
    # A refresh per step floods logs.
    bar.set_postfix(loss=f"{loss:.4f}", fps=f"{real_frames / seconds:.0f}", refresh=False)
    bar.update()
    if step % cfg.train.log_every == 0 or step == cfg.train.steps:
        count = torch.tensor([float(len(run.skipped))], device=info.device)
        # All data-parallel ranks, all legs: a sequence group's ranks skipped the same samples.
        metrics["skipped_samples"] = int(all_reduce_sum(count).item()) // cfg.parallel.sequence
        if cfg.model.compile:  # bounded: past dynamo's recompile limit the run fails
            metrics["compiled_graphs"] = compiled_graphs()
        if info.device.type == "cuda":  # the peak since the last record, this rank
            metrics["peak_memory_bytes"] = torch.cuda.max_memory_allocated(info.device)
            torch.cuda.reset_peak_memory_stats(info.device)
        log.write(metrics)
        say(
            f"step {step}: loss {loss:.4f}  lr {lr:.2e}  grad_norm {grad_norm:.3f}  "
            f"{metrics['frames_per_s']:.0f} frames/s"
        )


def _validate(run: Run, step: int, log: MetricsLog) -> bool:
    """The model on the whole validation videos, all ranks sharing them; its scores join the
    step's metrics. Whether it is the best validation so far (train.select)."""
    info, sequence = run.info, run.cfg.parallel.sequence
    val = val_batches(run.cfg.data, run.manifest, *info.data_rank(sequence), run.part)
    # A sequence group's ranks score the same videos: the first of each counts them.
    counted = info.rank % sequence == 0
    with nullcontext() if run.average is None else run.average.applied():  # what export takes
        report = validate(run.model, val, info.device, run.manifest.classes, counted=counted)
    scores = validation_scores(report)
    run.metrics.update(scores)
    log.write({"step": step, **scores})
    say(
        f"step {step}: val per-frame accuracy {scores['val_accuracy']:.3f}, "
        f"video accuracy {scores['val_video_accuracy']:.3f}, "
        f"jaccard {scores['val_jaccard']:.3f}, loss {scores['val_loss']:.4f}"
    )
    if run.selection is None:
        return False
    run.best = run.selection.after(run.best, step, scores)
    return run.best.step == step


def _save(run: Run) -> None:
    """A checkpoint at the run's position; every rank takes part."""
    held = (run.carries or {}).items()
    carries = {w: c.state for w, c in held if c.state is not None}
    rank_state = RankState(run.skipped, carries, run.streams)
    cfg = run.cfg
    best = None if run.selection is None else run.best
    save_checkpoint(
        run.checkpoints, run.state, run.position, run.metrics, cfg.train.keep_last, rank_state,
        best,
    )  # fmt: skip
