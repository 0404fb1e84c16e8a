"""One rank of a 2-rank gloo run that counts known collectives: FSDP2, explicit, DTensor, DDP.

Writes result<rank>.json with each counter's counts, bytes and log.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from conftest import report
from distseq.bench.collectives import CollectiveCounter

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
group_bytes = [sum(p.nbytes for p in model[i].parameters()) for i in (0, 2)]
fully_shard(model[0])
fully_shard(model[2])
fully_shard(model)  # the root holds no parameters of its own: no collectives for it
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(3, 8)

with CollectiveCounter() as fwd:
    loss = model(x).sum()
with CollectiveCounter() as bwd:
    loss.backward()
with CollectiveCounter() as step:
    opt.step()  # on the sharded DTensor parameters: local, no traffic

with CollectiveCounter() as ar:
    a = torch.arange(6, dtype=torch.float64)
    dist.all_reduce(a)
    b = torch.ones(5)
    dist.all_reduce(b)
ok = torch.equal(a, 2 * torch.arange(6, dtype=torch.float64)) and torch.equal(b, 2 * torch.ones(5))

mesh = init_device_mesh("cpu", (2,))
dt = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
with CollectiveCounter() as dtensor:
    full = dt.redistribute(mesh, [Replicate()]).to_local()
ok = ok and torch.equal(full, torch.arange(8.0))

ddp = DistributedDataParallel(nn.Linear(8, 4))
with CollectiveCounter() as ddp_bwd:
    ddp(x).sum().backward()

res: dict[str, Any] = {"group_bytes": group_bytes, "values_ok": ok}
counters = {"fwd": fwd, "bwd": bwd, "step": step, "ar": ar, "dtensor": dtensor, "ddp": ddp_bwd}
for name, c in counters.items():
    res[name] = {"counts": dict(c.counts), "bytes": dict(c.bytes), "log": c.log}
report(res)
dist.barrier()
dist.destroy_process_group()
# A process that used DDP on gloo sometimes aborts in C++ teardown at interpreter exit
# ("terminate called without an active exception", no Python frame); all is done, so skip it.
os._exit(0)
