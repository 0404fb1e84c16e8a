"""One rank counting the collectives of one training step, at T/k = 1 and 8 (and 8 with half
the chunks held whole, or every chunk's late stages held, as a memory plan holds them), with
the model sharded as distseq shards it and, for contrast, with each ResNet stage a unit of its
own; and a CNN and a head of a user's, through the public API."""

from __future__ import annotations

import torch
from torch.distributed.fsdp import fully_shard

import distseq
from conftest import random_batch, report, tiny_model
from distseq.bench.collectives import CollectiveCounter
from distseq.memory.chunked import Hold
from distseq.memory.stages import stage_starts
from distseq.parallel import DistInfo, close_distributed, init_distributed, parallelize
from distseq.train.step import clip_grad_norm, train_step
from own_model import LSTMHead, small_cnn

T = 16


def one_step(
    info: DistInfo,
    chunk: int,
    per_stage: bool = False,
    keep: int = 0,
    stages: bool = False,
    user: bool = False,
) -> dict[str, object]:
    batch = random_batch(1, T, seed=info.rank)
    model = tiny_model("torch", chunk=chunk)
    if user:  # through the public API, with a CNN and a stateful head distseq did not write
        model = distseq.ChunkedModel(small_cnn(16), LSTMHead(16, 3, 8), chunk_frames=chunk)
    model.keep_frames = keep
    if stages:  # layer2 on held in every chunk: only the stem and layer1 recomputed
        model.hold_stages(stage_starts(model, model.backbone, 32, torch.device("cpu")))
        model.plan = lambda frames, whole: [Hold(2)] * (frames // chunk)
    if per_stage:  # the wrapping docs/design.md warns about: units inside the chunk loop
        for stage in ("layer1", "layer2", "layer3", "layer4"):
            fully_shard(model.backbone.get_submodule(stage))
    sharded = parallelize(model, info=info)
    opt = torch.optim.AdamW(sharded.parameters())
    with CollectiveCounter() as counter:
        train_step(sharded, opt, [batch], info.world)
        clip_grad_norm(sharded, 1.0)
        opt.step()
    return {"counts": counter.counts, "bytes": counter.bytes}


def main() -> None:
    info = init_distributed()
    report(
        {
            "k=T": one_step(info, T),
            "k=T/8": one_step(info, T // 8),
            "k=T/8 half held": one_step(info, T // 8, keep=T // 2),
            "k=T/8 stages held": one_step(info, T // 8, stages=True),
            "per_stage k=T": one_step(info, T, per_stage=True),
            "per_stage k=T/8": one_step(info, T // 8, per_stage=True),
            "user k=T": one_step(info, T, user=True),
            "user k=T/8": one_step(info, T // 8, user=True),
        }
    )
    close_distributed()


if __name__ == "__main__":
    main()
