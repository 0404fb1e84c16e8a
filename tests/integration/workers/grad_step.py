"""One rank of a sharded training step on a fixed global batch, split across the ranks.

argv: mode (fsdp|ddp), micro-batches per step, what the chunks hold as a memory plan would
have them: ``none``, ``keep`` (the last 6 frames whole, memory.keep_frames) or ``stages`` (the
3 chunks of 4 frames hold their late stages from stage 2, 3 and 4 on), and the head (a key of
HEADS: its options and its loss). Writes
out_<mode>_<rank>.pt (full parameters after the steps, gradients of the first) and reports the
losses.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from conftest import random_batch, report, tiny_model
from distseq.config import LossConfig, ParallelConfig, ParallelMode
from distseq.data.batch import IGNORE_INDEX, Batch
from distseq.memory.chunked import Hold
from distseq.memory.stages import stage_starts
from distseq.parallel import DistInfo, close_distributed, init_distributed, parallelize
from distseq.train.loss import Loss
from distseq.train.step import clip_grad_norm, train_step

STEPS = 3
# Padding differs per sequence, so ranks see different numbers of real frames: the loss scaling
# in train_step must still give the gradient of the global mean.
LENGTHS = [10, 6, 8, 3]
# SGD, not AdamW: Adam's first step is lr * sign(grad), which turns 1e-7 rounding differences in
# near-zero gradients into lr-sized parameter differences and would hide real mismatches.
LR = 0.01
# The heads, each with the loss it is trained with: MS-TCN's stages summed, class-weighted and
# smoothed; the transformer weighted.
HEADS: dict[str, tuple[dict[str, Any], Loss]] = {
    "lstm": ({}, Loss(LossConfig(), None)),
    "mstcn": (
        {"kind": "mstcn", "stages": 2, "layers": 3, "causal": True},
        Loss(LossConfig(smoothing=0.15), [1.0, 2.0, 0.5]),
    ),
    "transformer": (
        {"kind": "transformer", "layers": 2, "span": 3, "attention_heads": 2},
        Loss(LossConfig(), [1.0, 2.0, 0.5]),
    ),
}


def global_batch() -> Batch:
    """Four sequences of unequal length, and unequal numbers of unlabelled frames on each rank's
    half: the loss is the mean over labelled frames, whichever rank holds them."""
    batch = random_batch(4, 10, lengths=LENGTHS)
    batch.labels[0, 2:7] = IGNORE_INDEX
    batch.labels[3, 0] = IGNORE_INDEX
    return batch


def main() -> None:
    mode, accum, holding, head = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    info = init_distributed()
    steps(mode, accum, holding, head, info)
    close_distributed()  # after steps() let go of the model, which holds the group


def steps(mode: str, accum: int, holding: str, head: str, info: DistInfo) -> None:
    cfg = ParallelConfig(mode=ParallelMode(mode))
    options, loss_fn = HEADS[head]
    chunked = tiny_model("torch", chunk=4, **options)
    if holding == "keep":
        chunked.keep_frames = 6
    elif holding == "stages":
        chunked.hold_stages(stage_starts(chunked, chunked.backbone, 32, torch.device("cpu")))
        chunked.plan = lambda frames, whole: [Hold(1), Hold(2), Hold(3)]
    model = parallelize(chunked, cfg.mode, cfg.precision, info)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    glob = global_batch()
    per_rank = 4 // info.world
    rows = range(info.rank * per_rank, (info.rank + 1) * per_rank)
    micro = [
        Batch(glob.frames[list(r)], glob.labels[list(r)], glob.mask[list(r)])
        for r in (rows[i::accum] for i in range(accum))
    ]
    losses, grads = [], {}
    for step in range(STEPS):
        loss, _ = train_step(model, opt, micro, info.world, None, loss_fn)
        if step == 0:
            for name, p in getattr(model, "module", model).named_parameters():  # DDP nests
                assert p.grad is not None, name
                full = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                grads[name] = full.clone()
        clip_grad_norm(model, 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    params = {k: v.clone() for k, v in full.items() if isinstance(v, torch.Tensor)}
    torch.save({"params": params, "grads": grads}, f"out_{mode}_{info.rank}.pt")
    report({"losses": losses})


if __name__ == "__main__":
    main()
