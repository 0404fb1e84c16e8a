"""One rank stepping through train batches in lockstep with the other, on unequal shards.

argv: train shard URLs. Every step all-reduces a one, so a rank that ran dry would hang the other.
"""

from __future__ import annotations

import os
import sys
from itertools import islice

import torch
import torch.distributed as dist

from conftest import report
from distseq.config import DataConfig
from distseq.data.train_stream import train_batches

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
cfg = DataConfig(
    train=sys.argv[1], size=32, window=12, batch_size=1, num_workers=2, shuffle_buffer=1
)
batches = []
for batch in islice(train_batches(cfg, seed=3, rank=rank, world=world), 12):
    step = torch.ones(1)
    dist.all_reduce(step)  # every rank takes part in every step, or this hangs
    batches.append({"keys": batch.keys, "worker": batch.worker, "ranks": int(step)})
report({"batches": batches})
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # skip interpreter teardown, where gloo can abort
