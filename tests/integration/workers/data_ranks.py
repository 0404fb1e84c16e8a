"""One rank reading the val split and the first train batch, with its rank and world passed in.

argv: shard folder. Reports the val batches (keys, labels, mask) and the first train keys.
"""

from __future__ import annotations

import os
import sys

import torch.distributed as dist

from conftest import report
from distseq.config import DataConfig
from distseq.data.manifest import load_manifest
from distseq.data.train_stream import train_batches
from distseq.data.val_stream import val_batches

root = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
cfg = DataConfig(
    train=root + "/train-{000000..000003}.tar",
    val=root + "/val-{000000..000001}.tar",
    size=32,
    window=12,
    batch_size=2,
    num_workers=1,
    shuffle_buffer=4,
)
val = [
    {"keys": b.keys, "labels": b.labels.tolist(), "mask": b.mask.tolist()}
    for b in val_batches(cfg, load_manifest(cfg), rank, world)
]
first = next(train_batches(cfg, seed=5, rank=rank, world=world)).keys
report({"val": val, "first_train": first})
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # skip interpreter teardown, where gloo can abort
