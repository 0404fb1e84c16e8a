"""The model of own_model.py, sharded with FSDP2 across the ranks of torchrun, each rank
training on its share of the videos: the same losses as one process on all of them.

    torchrun --nproc_per_node=2 examples/fsdp_torchrun.py
    python examples/fsdp_torchrun.py            # one process, the same global batch

Its CNN uses GroupNorm: BatchNorm's batch statistics would be each rank's own videos', which
one process on all the videos cannot reproduce (distseq.average_batchnorm_stats keeps the
running statistics one across ranks all the same).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import distseq
from own_model import LSTMHead, small_cnn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=2, help="global batch (default: 2)")
    parser.add_argument("--frames", type=int, default=500, help="T (default: 500)")
    parser.add_argument("--size", type=int, default=64, help="frames are size x size (64)")
    parser.add_argument("--chunk", type=int, default=16, help="frames a chunk (default: 16)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (default: 3)")
    args = parser.parse_args()

    info = distseq.init_distributed()  # joins torchrun's group; alone without torchrun
    if args.videos % info.world:
        raise SystemExit(f"--videos {args.videos} does not split over {info.world} ranks")
    torch.manual_seed(0)  # the same initial parameters on every rank
    model = distseq.ChunkedModel(
        small_cnn(norm=lambda c: nn.GroupNorm(8, c)), LSTMHead(64, 4), chunk_frames=args.chunk
    )
    # FSDP2: the head one unit, the CNN with the chunk loop the root, so the CNN's parameters
    # are gathered once a step however many chunks run. Names stay the plain model's.
    model = distseq.parallelize(model, "fsdp", precision="fp32", info=info)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(1)
    shape = (args.videos, args.frames, 3, args.size, args.size)
    frames = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 4, shape[:2], generator=g)
    mine = slice(info.rank, None, info.world)  # this rank's videos
    frames, labels = frames[mine].to(info.device), labels[mine].to(info.device)
    mask = torch.ones(labels.shape, dtype=torch.bool, device=info.device)

    for i in range(args.steps):
        optimizer.zero_grad()
        # Each rank's mean over its frames; FSDP2 averages the gradients over the ranks, which
        # is the global mean's gradient when every rank has as many frames.
        loss = F.cross_entropy(model(frames, mask).flatten(0, 1), labels.flatten())
        loss.backward()
        optimizer.step()
        mean = loss.detach() / info.world
        if dist.is_initialized():
            dist.all_reduce(mean)  # gloo has no AVG
        if info.is_main:
            print(f"step {i + 1}: loss {mean.item():.6f}", flush=True)
    del model, optimizer
    distseq.close_distributed()


if __name__ == "__main__":
    main()
