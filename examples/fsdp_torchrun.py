"""The model of own_model.py, sharded with FSDP2 across the ranks of torchrun, each rank
training on its share of the videos: the same losses as one process on all of them, though the
videos differ in length (padding masked in place) and each rank holds another number of frames.

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
    # Video v has T - v * T // 4 real frames, then padding: the ranks hold different numbers.
    mask = (
        torch.arange(args.frames)
        < (args.frames - torch.arange(args.videos) * args.frames // 4)[:, None]
    )
    labels[~mask] = -100  # cross_entropy's ignore_index
    mine = slice(info.rank, None, info.world)  # this rank's videos
    frames, labels, mask = (x[mine].to(info.device) for x in (frames, labels, mask))

    for i in range(args.steps):
        optimizer.zero_grad()
        logits = model(frames, mask)
        # Padding's scores zeroed in place, a common way to mask them: parallelize makes the
        # output a fresh tensor, so that FSDP2's backward hook survives it.
        logits.masked_fill_(~mask[..., None], 0.0)
        total = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
        # The global mean over real frames, not each rank's own mean: its sum over the frames of
        # every rank, times the world, since FSDP2 averages the gradients over the ranks.
        counts = torch.stack([total.detach(), mask.sum().to(total.dtype)])
        if dist.is_initialized():
            dist.all_reduce(counts)  # the sum over ranks and the frames of all ranks
        (total * info.world / counts[1]).backward()
        optimizer.step()
        if info.is_main:
            print(f"step {i + 1}: loss {(counts[0] / counts[1]).item():.6f}", flush=True)
    del model, optimizer
    distseq.close_distributed()


if __name__ == "__main__":
    main()
