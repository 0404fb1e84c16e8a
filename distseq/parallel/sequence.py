"""One long video split across a sequence group of S ranks (``parallelize(..., sequence=S)``,
``parallel.sequence``).

Every rank of a group gets the group's whole batch. Each runs the CNN over its own contiguous
slice of the frames, cut on chunk boundaries so that every chunk, and so every BatchNorm
statistic, is the one a single process computes; the slices' features are gathered so that the
temporal head, replicated on the group, runs over the whole sequence on every rank and every
rank computes the group's loss in full. In backward no collective runs: each rank takes its own
slice of the features' gradient, which is the same on every rank of the group, times S. DDP and
FSDP2 then average the gradients over all D x S ranks: the head's are S equal copies per group,
and the CNN's, S times each slice's share, sum to the group's whole gradient. Nothing is
counted S times. The ranks of a group check in that all-gather that they hold the same
sequence (:func:`_signature`). docs/design.md ("A video split across ranks") has the costs and
the choice.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from distseq.config import Config
from distseq.data.batch import slices
from distseq.errors import ConfigError, ModelError
from distseq.model.norms import batchnorms
from distseq.model.video import VideoModel


def sequence_line(cfg: Config, world: int, hosts: dict[int, str]) -> str:
    """What a run of ``world`` ranks at ``cfg``'s parallel.sequence does, in one line (which
    ranks share each video), or one ConfigError line for a split that cannot run; "" without a
    split. ``hosts``: each rank's host ({} on one): a group stays inside one where it can."""
    s, data = cfg.parallel.sequence, cfg.data
    if s == 1:
        return ""
    key = f"config key parallel.sequence={s}"
    if world % s:
        raise ConfigError(f"{key}: does not divide the {world} ranks; launch a multiple of {s}")
    if data.features:
        raise ConfigError(
            f"{key}: data.features trains the head alone, over stored features: there is no "
            "CNN work to split; use parallel.sequence=1"
        )
    k = cfg.memory.chunk_frames
    if data.window and data.window < s * k:
        raise ConfigError(
            f"{key}: data.window={data.window} is shorter than {s} chunks of "
            f"memory.chunk_frames={k}, so some rank would get no frame; lower either or raise "
            "data.window"
        )
    groups = [range(g, g + s) for g in range(0, world, s)]
    per_host = [list(hosts.values()).count(h) for h in set(hosts.values())]
    if hosts and s <= min(per_host):
        for group in groups:
            if len(across := sorted({hosts[r] for r in group})) > 1:
                raise ConfigError(
                    f"{key}: ranks {group[0]}-{group[-1]} would split a video across "
                    f"{' and '.join(across)} although one node holds {s} ranks; launch a "
                    f"multiple of {s} ranks a node"
                )
    split = ", ".join(f"{g[0]}-{g[-1]}" for g in groups)
    return f"parallel.sequence={s}: each video's frames split across ranks {split}"


# What each rank's slice of the features' all-gather begins with: _signature's 4 int64 values.
SIGNATURE_BYTES = 32


class _Gather(torch.autograd.Function):
    """Every rank's features of its slice, [B, t_i, F], joined along time on every rank; each
    rank's :func:`_signature` rides in front of its slice, and ranks whose signatures differ
    are refused, on every rank alike."""

    @staticmethod
    def forward(
        ctx: Any,
        local: torch.Tensor,
        bounds: list[tuple[int, int]],
        index: int,
        group: dist.ProcessGroup,
        signature: torch.Tensor,
    ) -> torch.Tensor:
        ctx.bounds, ctx.index, ctx.size = bounds, index, len(bounds)
        width = max(b - a for a, b in bounds)
        padded = torch.nn.functional.pad(local, (0, 0, 0, width - local.shape[1]))
        # As bytes, so that the int64 signature and features of any dtype travel as one message
        # (the signature first: a view as int64 needs an offset that is a multiple of 8).
        payload = torch.cat(
            [signature.to(local.device).view(torch.uint8), padded.reshape(-1).view(torch.uint8)]
        )
        parts = [torch.empty_like(payload) for _ in bounds]
        dist.all_gather(parts, payload, group=group)
        signed = SIGNATURE_BYTES
        # One device-to-host copy of S x 4 values: the head's launch waits for the gather, which
        # it needs before it can run anyway.
        _check_alike(torch.stack([p[:signed] for p in parts]).view(torch.int64).tolist())
        return torch.cat(
            [
                p[signed:].view(local.dtype).view(padded.shape)[:, : b - a]
                for p, (a, b) in zip(parts, bounds, strict=True)
            ],
            dim=1,
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, b = ctx.bounds[ctx.index]
        # Every rank of the group ran the same head over the same features: its gradient is the
        # group's, so this slice's share needs no collective. Times S, because DDP and FSDP2
        # average over every rank while only this one made these frames (module docstring).
        return grad[:, a:b] * ctx.size, None, None, None, None


def _signature(mask: torch.Tensor, frames: torch.Tensor | None) -> torch.Tensor:
    """What every rank of a group must hold alike, as int64 [4] on the mask's device: T,
    a checksum of the mask, and, where this rank was given the whole sequence's ``frames``, a
    checksum of a few of them (a rank given its slice alone has other frames than its group's).

    A mask sliced along with the frames has nothing wrong with its shapes: each rank would run
    a slice of its slice and the group join pieces of different sequences. Where the slices are
    of one length, T is alike too, and only the frames (or a padded mask) tell them apart.
    Integer sums (of a float's bits), so that equal tensors sum alike in any order."""
    rows, length = mask.shape
    at = torch.arange(1, rows * length + 1, device=mask.device).view(rows, length)
    sums = [
        torch.tensor(length, device=mask.device),
        (mask * at).sum(),
        torch.tensor(0),
        torch.tensor(0),
    ]
    if frames is not None:
        sample = frames[:, :: max(1, length // 4)].contiguous()
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
            sample.element_size()
        ]
        sums[2:] = [torch.tensor(1), sample.view(bits).sum(dtype=torch.int64)]
    return torch.stack([x.to(mask.device, torch.int64) for x in sums])


def _check_alike(signatures: list[list[int]]) -> None:
    """Refuse, on every rank of the group alike, ranks that hold different sequences."""
    lengths = [s[0] for s in signatures]
    whole = {s[3] for s in signatures if s[2]}
    if len(set(lengths)) == 1 and len({s[1] for s in signatures}) == 1 and len(whole) <= 1:
        return
    held = (
        f"masks of T={', '.join(map(str, lengths))}"
        if len(set(lengths)) > 1
        else f"different sequences of T={lengths[0]} (their masks or frames differ)"
    )
    raise ModelError(
        f"sequence={len(signatures)}: the ranks of a group hold {held}: each takes the group's "
        "batch, the mask (and labels) whole, the frames whole or its slice alone; a mask "
        "sliced with the frames is one such mistake"
    )


class SequenceSplit:
    """What a :class:`VideoModel` calls in place of its ``features`` under a sequence split:
    this rank's slice through the CNN, every slice's features back."""

    def __init__(self, model: VideoModel, group: dist.ProcessGroup) -> None:
        self.group = group
        self.index, self.size = group.rank(), group.size()
        if any(bn.momentum is None for bn in batchnorms(model.backbone)):
            raise ModelError(
                f"sequence={self.size}: a BatchNorm layer with momentum=None (a cumulative "
                "average) cannot be joined across a sequence group; give it a momentum, freeze "
                "it or use GroupNorm"
            )

    def __call__(self, model: VideoModel, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Every slice's features [B, T, F] for ``mask`` [B, T]: ``frames`` are the whole
        sequence's, or this rank's slice of them alone (as a ``data.Part`` batch holds them)."""
        given = frames.shape[1] if isinstance(frames, torch.Tensor) and frames.dim() == 5 else None
        whole = given is None or not isinstance(mask, torch.Tensor) or mask.shape[1:] == (given,)
        if whole:  # or a bad input: the one-line error
            model.input.check(frames, mask)
        length = mask.shape[1]
        # A ChunkedModel's chunk (read at each call: a memory plan may change it), else a frame.
        unit = getattr(model, "chunk_frames", None)
        if unit is None and model.training and _updating(model):
            raise ModelError(
                f"sequence={self.size}: the backbone's BatchNorm statistics are taken over all "
                "of a sequence's frames at once, which a split cannot give; run it in chunks "
                "(ChunkedModel), freeze its BatchNorm (.eval()) or use GroupNorm"
            )
        unit = unit or 1
        bounds = slices(length, unit, self.size)
        a, b = bounds[self.index]
        signature = _signature(mask, frames if whole else None)
        if whole:
            frames = frames[:, a:b]
        elif given != b - a:
            raise ModelError(
                f"frames of T={given} with a mask of T={length}: under sequence={self.size}, "
                f"rank {self.index} of the group takes the whole sequence's frames or its slice "
                f"[{a}, {b}) alone, {b - a} frames (chunks of {unit})"
            )
        else:
            model.input.check(frames, mask[:, a:b])
        before = _bn_state(model)
        # The real frames' check syncs with the device: only while the feature size is unknown.
        if b > a and (model.feature_dim is not None or bool(mask[:, a:b].any())):
            local = self._features(model, frames, mask[:, a:b], length)
        elif model.feature_dim is None:
            # Not the backbone's "no real frame in this batch": the batch may have some.
            held = f", frames [{a}, {b}) of {length}, is all padding" if b > a else " is empty"
            raise ModelError(
                f"sequence={self.size}: this rank's slice of the batch (rank {self.index} of its "
                f"group){held}, and the backbone's feature size is not known yet: give "
                "feature_dim"
            )
        else:
            dtype = next(model.backbone.parameters()).dtype
            local = frames.new_zeros((frames.shape[0], 0, model.feature_dim), dtype=dtype)
        if before:
            _join_bn(before, mask, bounds, unit, self.index, self.group)
        trained = [p for p in model.backbone.parameters() if p.requires_grad]
        if torch.is_grad_enabled() and local.grad_fn is None and trained:
            # A slice of padding alone runs no chunk, so here the CNN would get no gradient
            # while the other ranks wait for this one's share (FSDP2's reduce-scatter, DDP's
            # all-reduce; FSDP2 hung). A zero that depends on every parameter gives it zeros.
            local = local + sum(p.sum() for p in trained) * 0
        return _Gather.apply(local, bounds, self.index, self.group, signature)

    def _features(
        self, model: VideoModel, frames: torch.Tensor, mask: torch.Tensor, length: int
    ) -> torch.Tensor:
        """This rank's slice through the CNN, its random draws (dropout) forked off: the head's
        draws after it must be the same on every rank of the group, or the replicated head would
        be S different computations. Rank 0's slice draws as one process's first frames do, each
        other's from a seed of its own; a CNN that draws nothing leaves the head's draws one
        process's."""
        devices = [mask.device.index] if mask.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            if self.index:
                torch.manual_seed(int(torch.randint(2**62, ())) + self.index)
            return model.features(frames, mask, of=length)


def _updating(model: VideoModel) -> bool:
    return any(bn.training for bn in batchnorms(model.backbone))


_State = list[tuple[_BatchNorm, torch.Tensor, torch.Tensor, torch.Tensor]]


def _bn_state(model: VideoModel) -> _State:
    """The running statistics of the backbone's BatchNorm layers that this forward updates, as
    they are before it. (A recompute does not come here: it runs the chunks, not the model.)"""
    return [
        (bn, bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone())  # type: ignore[union-attr]
        for bn in batchnorms(model.backbone)
        if bn.training
    ]


def _join_bn(
    before: _State,
    mask: torch.Tensor,
    bounds: list[tuple[int, int]],
    unit: int,
    index: int,
    group: dist.ProcessGroup,
) -> None:
    """Make each layer's running statistics those of one process that ran every chunk in order.

    A chunk with a real frame updates r to (1 - m) r + m x. Rank i ran n_i such chunks from the
    same r0: r_i = (1 - m)^n_i r0 + c_i. One process running them all in order ends at
    (1 - m)^N r0 + sum_i (1 - m)^(chunks after rank i's) c_i: one all-reduce of every layer's
    weighted c_i. Every rank has the whole mask, so each knows every n_i.
    """
    real = mask.any(0)
    counts = [
        sum(bool(real[s : min(s + unit, b)].any()) for s in range(a, b, unit)) for a, b in bounds
    ]
    total, after = sum(counts), sum(counts[index + 1 :])
    parts = []
    for bn, mean0, var0, _ in before:
        decay = 1 - float(bn.momentum)  # type: ignore[arg-type]
        for now, start in ((bn.running_mean, mean0), (bn.running_var, var0)):
            assert now is not None
            own = now - decay ** counts[index] * start
            parts.append((own * decay**after).flatten())
    flat = torch.cat(parts)
    dist.all_reduce(flat, group=group)
    offset = 0
    for bn, mean0, var0, tracked0 in before:
        decay = 1 - float(bn.momentum)  # type: ignore[arg-type]
        for now, start in ((bn.running_mean, mean0), (bn.running_var, var0)):
            assert now is not None
            joined = flat[offset : offset + now.numel()].view_as(now)
            # Through .data, which leaves the version alone: a chunk held whole saved these
            # buffers for its BatchNorm's backward (which in training reads the batch's own
            # statistics, not these), and autograd would refuse them as changed in place.
            now.data.copy_(decay**total * start + joined)
            offset += now.numel()
        bn.num_batches_tracked.copy_(tracked0 + total)  # type: ignore[union-attr]
