"""One rank of a small CNN and LSTM head (the user's own) under FSDP2 or DDP with a weight
average (train.ema's ``WeightAverage``, decay 0.75) over three SGD steps.

argv: modes (``fsdp ddp``), run one after the other in this one process group. Reports, per
mode, every parameter in full before the steps and after each, the average after the three, and
whether the trained weights came back exactly after the average was applied for a while.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import distseq
from conftest import report
from distseq.train.ema import WeightAverage

DECAY = 0.75  # not 0.5, where d and 1 - d would look alike


def full(t: torch.Tensor) -> list[float]:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().flatten().tolist()


def run(mode: str, info: distseq.DistInfo) -> dict[str, object]:
    from own_model import LSTMHead, small_cnn

    torch.manual_seed(0)
    plain = distseq.ChunkedModel(small_cnn(8), LSTMHead(8, 3, 4), feature_dim=8, chunk_frames=2)
    model = distseq.parallelize(plain, mode, "fp32", info)
    average = WeightAverage(getattr(model, "module", model), DECAY)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(1 + info.rank)
    frames = torch.randint(0, 256, (2, 6, 3, 16, 16), generator=g, dtype=torch.uint8)
    labels, mask = torch.randint(0, 3, (2, 6), generator=g), torch.ones(2, 6, dtype=torch.bool)
    names = list(average.params)
    steps = [{n: full(average.params[n]) for n in names}]
    for _ in range(3):
        F.cross_entropy(model(frames, mask)[mask], labels[mask]).backward()
        opt.step()
        opt.zero_grad()
        average.update()
        steps.append({n: full(average.params[n]) for n in names})
    with average.applied():
        applied = {n: full(average.params[n]) for n in names}
    back = {n: full(average.params[n]) for n in names} == steps[-1]
    return {"steps": steps, "average": {n: full(average.average[n]) for n in names},
            "applied": applied, "back": back}  # fmt: skip


def main() -> None:
    info = distseq.init_distributed()
    report({mode: run(mode, info) for mode in sys.argv[1:]})
    distseq.close_distributed()


if __name__ == "__main__":
    main()
