"""How the backbone runs over time: chunks of k frames, each under activation checkpointing.

Only each chunk's input (a uint8 slice of the sequence, already in memory) and its features
outlive the chunk's forward; the CNN's inner activations are recomputed chunk by chunk in
backward. Gradients are those of the plain model (docs/design.md, "Exact gradients").

What each chunk keeps from forward to backward is its :class:`Hold`, the first of the backbone's
stages (memory.stages) whose activations it keeps:

- ``WHOLE``, stage 0: the chunk is not checkpointed. The chunks of the last ``keep_frames``
  frames do this; backward visits the chunks in reverse, so those are consumed and freed before
  the first recompute, and they cost memory only beyond one recomputed chunk's.
- ``NOTHING``: plain checkpointing, every activation recomputed.
- ``Hold(h)``, the late stages from the h-th stage start on: the chunk is checkpointed, but what
  its ops save for backward from that stage on goes to saved-tensor hooks of its own, which keep
  it. Backward recomputes only the early stages: torch's recompute stops once it has saved again
  every tensor the checkpoint dropped (non-reentrant checkpoint's early stop), which is where
  the held stages begin.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from distseq.config import Recompute
from distseq.errors import ConfigError, ModelError
from distseq.memory.prefetch import FramePrefetch, to_device
from distseq.model.backbone import checked_feature_dim, frame_features
from distseq.model.frames import Normalize
from distseq.model.norms import batchnorms
from distseq.model.video import VideoModel


@dataclass(frozen=True)
class Hold:
    """What a chunk keeps from its forward for its backward (module docstring)."""

    # The first stage whose activations are kept: 0 the whole chunk, h >= 1 the stages from the
    # h-th stage start (ChunkedModel.stages[h - 1]) on; None: nothing, every activation recomputed.
    stage: int | None

    @property
    def whole(self) -> bool:
        return self.stage == 0


WHOLE = Hold(0)
NOTHING = Hold(None)


@contextmanager
def frozen_bn_stats(bns: list[_BatchNorm]) -> Iterator[None]:
    """Run BatchNorm forwards without touching running stats, for the recompute pass.

    Recompute must save the same tensors as the first forward, so BN has to stay in training
    mode (``track_running_stats=False`` raises CheckpointError); momentum 0 keeps the update a
    no-op, and ``num_batches_tracked`` is put back afterwards.
    """
    saved = [
        (bn.momentum, None if bn.num_batches_tracked is None else bn.num_batches_tracked.clone())
        for bn in bns
    ]
    for bn in bns:
        bn.momentum = 0.0
    try:
        yield
    finally:
        for bn, (momentum, tracked) in zip(bns, saved, strict=True):
            bn.momentum = momentum
            if tracked is not None:
                assert bn.num_batches_tracked is not None
                bn.num_batches_tracked.copy_(tracked)


def _fairscale_bn_hooks(backbone: nn.Module) -> None:
    """Keep BatchNorm statistics exact under fairscale's recompute.

    Without these hooks the recompute would update the statistics a second time. fairscale's own
    remedy, the BN patch that ``checkpoint_wrapper`` applies (distseq calls its checkpoint
    function without the wrapper), defers each chunk's update to its recompute, which runs in
    reverse chunk order, so the statistics come out wrong with more than one chunk. These hooks
    update them in the first (forward-order) pass and freeze them during the recompute, as the
    torch recompute does. They sit on the BN layers because fairscale recomputes by calling the
    checkpointed function directly, past any module's own hooks.
    """
    from fairscale.nn.checkpoint.checkpoint_activations import is_recomputing

    active: dict[int, AbstractContextManager[None]] = {}

    def enter(bn: nn.Module, args: Any) -> None:
        if is_recomputing():
            assert isinstance(bn, _BatchNorm)
            active[id(bn)] = ctx = frozen_bn_stats([bn])
            ctx.__enter__()

    def leave(bn: nn.Module, args: Any, output: Any) -> None:
        ctx = active.pop(id(bn), None)
        if ctx is not None:
            ctx.__exit__(None, None, None)

    # fairscale feeds its autograd function a dummy tensor that requires grad, so torch's
    # "None of the inputs have requires_grad=True" is false here; the trainer's first-step check
    # still catches a parameter that really gets no gradient.
    warnings.filterwarnings(
        "ignore", "None of the inputs have requires_grad", UserWarning, "fairscale"
    )
    for bn in batchnorms(backbone):
        bn.register_forward_pre_hook(enter)
        bn.register_forward_hook(leave)


class ChunkedModel(VideoModel):
    """A video model whose backbone runs ``chunk_frames`` frames at a time, each chunk
    recomputed in backward as far as its hold asks; the same modules under the same names, so
    its ``state_dict`` loads into the plain model and back.

    frames [B, T, C, H, W] (uint8 in [0, 255] by default; ``frames="float"`` for float) + mask
    [B, T] bool -> logits [B, T, K]. ``backbone``: any module [N, C, H, W] -> [N, F];
    ``head``: any module (features [B, T, F], mask [B, T]) -> [B, T, K] (or [S, B, T, K], a
    multi-stage head's every stage), or, if its forward takes
    ``state``, -> (logits, state), the state carried by a :class:`distseq.Carry` passed as the
    third argument. ``recompute``: "torch" (non-reentrant checkpoint), "fairscale" or "none"
    (no recompute: the plain model's memory). Gradients and BatchNorm statistics equal the plain
    model's run in the same chunks (docs/library.md). ``feature_dim``: F, learnt from the first
    chunk if not given. ``keep_frames``: the last N frames of a sequence keep their activations.

    This module owns the chunk loop, so sharding it as one unit gathers the CNN's parameters once
    per step rather than once per chunk and recompute (docs/design.md, "Communication").
    """

    def __init__(
        self,
        backbone: nn.Module,
        head: nn.Module,
        feature_dim: int | None = None,
        *,
        chunk_frames: int = 8,
        recompute: Recompute | str = Recompute.torch,
        keep_frames: int = 0,
        frames: str = "uint8",
        normalize: Normalize = "imagenet",
        prefetch_frames: bool = False,
    ) -> None:
        super().__init__(backbone, head, feature_dim, frames=frames, normalize=normalize)
        if recompute not in [r.value for r in Recompute]:
            raise ModelError(
                f"recompute={recompute!r}: must be one of {[r.value for r in Recompute]}"
            )
        counts = (chunk_frames, keep_frames)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts):
            raise ModelError(
                f"chunk_frames={chunk_frames!r}, keep_frames={keep_frames!r}: both are whole "
                "numbers of frames (int)"
            )
        if chunk_frames < 1 or keep_frames < 0:
            raise ModelError(
                f"chunk_frames={chunk_frames}, keep_frames={keep_frames}: chunk_frames must be "
                ">= 1 and keep_frames >= 0"
            )
        recompute = Recompute(recompute)
        self.chunk_frames = chunk_frames
        self.recompute = recompute
        self.keep_frames = keep_frames
        # memory.offload=frames: copy each chunk's frames in one chunk ahead (memory.prefetch).
        self.prefetch_frames = prefetch_frames
        self._prefetch: FramePrefetch | None = None
        # Where the backbone's second and later stages begin (hold_stages); none until a plan
        # asks for them.
        self.stages: list[str] = []
        # memory.budget: each chunk's hold for a T-frame sequence (memory.plan), in place of
        # keep_frames.
        self.plan: Callable[[int, int], list[Hold]] | None = None
        self._stage = 0  # the stage the running chunk is in
        self._holding: int | None = None  # in a chunk's first forward: the stage it holds from
        self._held = ExitStack()  # the running chunk's held-tensor hooks, once pushed
        self._stage_hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._bns = batchnorms(backbone)
        if recompute is Recompute.fairscale:
            _fairscale_bn_hooks(backbone)
        self.compiled = False  # compile_backbone

    def compile_backbone(self, backend: str) -> None:
        """Compile the backbone in place with ``torch.compile`` (model.compile); its parameters
        keep their names. Its input's frame count is dynamic from the first call (marked in
        ``frame_features``): chunks of other sizes (a sequence's last, padding) would otherwise
        compile a second graph, and a recompute could then pick another graph than its forward
        ran (pytorch#166926). More compilations than dynamo's limit fail rather than fall back
        to eager unseen. Stages cannot be held then: their saved-tensor hooks do not reach into
        a compiled graph (tried: the recompute's tensors differ from the forward's)."""
        if self.stages:
            raise ValueError("model.compile cannot hold stages (memory.plan): whole chunks only")
        if backend not in torch._dynamo.list_backends(exclude_tags=()):
            raise ConfigError(
                f"config key model.compile_backend: {backend!r} is not a torch.compile backend "
                "(e.g. inductor, aot_eager, eager, cudagraphs)"
            )
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        self.backbone.compile(backend=backend)
        self.compiled = True

    def hold_stages(self, starts: list[str]) -> None:
        """Let chunks hold their late stages: stage i (from 1) begins at ``starts[i - 1]``, the
        names of backbone modules in forward order (memory.stages.stage_starts)."""
        if self.recompute is not Recompute.torch and starts:
            raise ValueError("holding stages needs memory.recompute=torch (its early stop)")
        if self.compiled and starts:  # e.g. a run planned without model.compile, resumed with it
            raise ConfigError(
                "config key model.compile: a compiled backbone cannot hold stages, as this run's "
                "memory plan (plan.json) asks; leave model.compile as the run began"
            )
        for hook in self._stage_hooks:
            hook.remove()
        self._stage_hooks = [
            self.backbone.get_submodule(name).register_forward_pre_hook(
                functools.partial(self._enter_stage, i)
            )
            for i, name in enumerate(starts, start=1)
        ]
        self.stages = list(starts)

    def follow(
        self, chunk_frames: int, stages: list[str], holds: Callable[[int, int], list[Hold]]
    ) -> None:
        """Run by a memory plan from the next forward on (``memory.plan.Plan.apply``): chunks of
        ``chunk_frames``, stages beginning at ``stages`` (:meth:`hold_stages`), and each chunk's
        hold for t frames of a T-frame sequence ``holds(t, T)`` in place of ``keep_frames``
        (t = T but under a sequence split)."""
        self.hold_stages(stages)
        self.chunk_frames = chunk_frames
        self.plan = holds

    @contextmanager
    def holding(self, chunk_frames: int, holds: Callable[[int, int], list[Hold]]) -> Iterator[None]:
        """Run in chunks of ``chunk_frames``, each held as ``holds(t, T)`` says, while inside:
        what a probe measures one level by. The chunk size and the plan are put back on the way
        out."""
        saved = (self.chunk_frames, self.plan)
        self.chunk_frames, self.plan = chunk_frames, holds
        try:
            yield
        finally:
            self.chunk_frames, self.plan = saved

    def _enter_stage(self, stage: int, module: nn.Module, args: Any) -> None:
        self._stage = stage
        if stage == self._holding:
            # The innermost saved-tensor hooks take what autograd saves: from here to the end
            # of the chunk, these, not the checkpoint's, so it is kept rather than recomputed.
            self._held.enter_context(saved_tensors_hooks(_keep, _as_kept))

    def _contexts(self) -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
        return nullcontext(), frozen_bn_stats(self._bns)

    def _holding_contexts(
        self, stage: int
    ) -> tuple[AbstractContextManager[None], AbstractContextManager[None]]:
        return self._holding_from(stage), frozen_bn_stats(self._bns)

    @contextmanager
    def _holding_from(self, stage: int) -> Iterator[None]:
        self._holding = stage
        try:
            yield
        finally:
            self._holding = None

    def _chunk_features(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One chunk's features. Its frames come to the mask's device here, inside what is
        checkpointed: frames kept in host memory (memory.offload) are copied in for the forward
        and again for the recompute, and no device copy outlives either."""
        self._stage = 0
        prefetch = self._prefetch
        x = to_device(frames, mask.device) if prefetch is None else prefetch.take(frames)
        with self._held:
            return frame_features(
                self.backbone, x, mask, self.input, self.mean, self.std, self.feature_dim
            )

    def _chunk(self, *chunk: torch.Tensor, hold: Hold) -> torch.Tensor:
        if hold.whole or not torch.is_grad_enabled() or self.recompute is Recompute.none:
            return self._chunk_features(*chunk)
        if hold.stage is not None:  # late stages: the whole chunk returned above
            return checkpoint(
                self._chunk_features,
                *chunk,
                use_reentrant=False,
                context_fn=functools.partial(self._holding_contexts, hold.stage),
                early_stop=True,  # what stops the recompute where the held stages begin
            )
        if self.recompute is Recompute.fairscale:
            from fairscale.nn.checkpoint.checkpoint_activations import _checkpointed_forward

            # What fairscale's checkpoint_wrapper puts in place of a module's forward, for one
            # chunk: wrapping this module would checkpoint the whole chunk loop as one, and
            # wrapping the backbone would keep each chunk's float input, 4x its uint8 frames.
            # It takes this module's parameters to decide that the output needs a gradient.
            return _checkpointed_forward(
                ChunkedModel._chunk_features, weakref.ref(self), False, *chunk
            )
        # Non-reentrant on purpose: reentrant checkpointing gives the CNN no gradients (only a
        # warning) when the frames do not require grad, which they never do.
        return checkpoint(
            self._chunk_features, *chunk, use_reentrant=False, context_fn=self._contexts
        )

    def holds(self, length: int, whole: int) -> list[Hold]:
        """Each chunk's hold for ``length`` frames of a ``whole``-frame sequence (the same but
        under a sequence split): the plan's, or else the chunks of the last ``keep_frames``
        frames whole and the rest recomputed."""
        if self.plan is not None:
            return self.plan(length, whole)
        held_from = length - self.keep_frames
        return [WHOLE if s >= held_from else NOTHING for s in range(0, length, self.chunk_frames)]

    def features(
        self, frames: torch.Tensor, mask: torch.Tensor, of: int | None = None
    ) -> torch.Tensor:
        k, length = self.chunk_frames, frames.shape[1]
        # Which chunks hold a real frame, in one device-to-host copy for the whole sequence. A
        # chunk of padding alone costs nothing and never reaches a checkpoint: fairscale's raises
        # in backward on an output that needs no gradient.
        padded = F.pad(mask, (0, -length % k)).view(mask.shape[0], -1, k)
        real = padded.any(2).any(0).tolist()
        dtype = next(self.backbone.parameters()).dtype
        holds = self.holds(length, of or length)
        if self.prefetch_frames:
            starts = [s for i, s in enumerate(range(0, length, k)) if real[i]]
            recomputes = torch.is_grad_enabled() and self.recompute is not Recompute.none
            again = [s for s in reversed(starts) if recomputes and not holds[s // k].whole]
            self._prefetch = FramePrefetch(frames, k, mask.device, starts, again)
        feats: list[torch.Tensor | None] = []
        for i, start in enumerate(range(0, length, k)):
            chunk = frames[:, start : start + k], mask[:, start : start + k]
            feats.append(self._chunk(*chunk, hold=holds[i]) if real[i] else None)
            if feats[-1] is not None:
                self.feature_dim = checked_feature_dim(self.feature_dim, feats[-1])
        if self.feature_dim is None:
            raise ModelError(
                "no real frame in this batch (mask all False), and the backbone's feature size "
                "is not known yet: give feature_dim"
            )
        return torch.cat(
            [
                f
                if f is not None
                else mask.new_zeros(
                    (mask.shape[0], min(k, length - i * k), self.feature_dim), dtype=dtype
                )
                for i, f in enumerate(feats)
            ],
            dim=1,
        )


def compiled_graphs() -> int:
    """The graphs torch.compile has made in this process so far (model.compile logs them)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _keep(t: torch.Tensor) -> torch.Tensor:
    # detach, as torch's own recompute hook does: a saved output kept with its grad_fn would
    # hold its own graph in a reference cycle.
    return t.detach() if t.requires_grad else t


def _as_kept(t: torch.Tensor) -> torch.Tensor:
    return t
