"""Real multi-process runs (torchrun, gloo): the sharded step equals the single-process step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import tiny_model, torchrun
from distseq.train.step import clip_grad_norm, train_step
from workers.grad_step import HEADS, LR, STEPS, global_batch


def reference(head: str) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One process, no process group, the whole global batch in one micro-batch."""
    options, loss_fn = HEADS[head]
    model = tiny_model("torch", chunk=4, **options)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    batch = global_batch()
    losses, grads = [], {}
    for step in range(STEPS):
        loss, _ = train_step(model, opt, [batch], 1, None, loss_fn)
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        clip_grad_norm(model, 1.0)
        opt.step()
        opt.zero_grad()
        losses.append(loss)
    return losses, grads, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "mode,accum,holding,head",
    [
        ("fsdp", 2, "none", "lstm"),
        ("ddp", 1, "none", "lstm"),
        ("fsdp", 1, "keep", "lstm"),
        ("fsdp", 1, "stages", "lstm"),
        ("fsdp", 2, "none", "mstcn"),
        ("ddp", 1, "none", "transformer"),
    ],
)
def test_two_ranks_match_one_process(
    mode: str, accum: int, holding: str, head: str, tmp_path: Path
) -> None:
    # keep: the last chunks (frames 4-9 of 10) hold their activations, as a memory plan does;
    # stages: each chunk holds its late stages from a different one on. The reference recomputes
    # every chunk. Exact gradients make them one computation.
    ref_losses, ref_grads, ref_params = reference(head)
    records = torchrun("grad_step", 2, tmp_path, mode, str(accum), holding, head)
    ranks = [torch.load(tmp_path / f"out_{mode}_{r}.pt", weights_only=True) for r in (0, 1)]

    for name, ref in ref_grads.items():
        err = (ranks[0]["grads"][name] - ref).abs().max() / ref.abs().max().clamp_min(1e-12)
        assert err < 1e-5, (name, float(err))
    for rec in records:
        # the first loss is the same computation; later ones carry fp32 rounding of earlier steps
        assert rec["losses"][0] == pytest.approx(ref_losses[0], rel=1e-6)
        assert rec["losses"] == pytest.approx(ref_losses, rel=5e-5)
    assert ref_losses[-1] < ref_losses[0]
    # both ranks hold the same full parameters, equal to the single-process run's
    for name, ref in ref_params.items():
        assert torch.equal(ranks[0]["params"][name], ranks[1]["params"][name]), name
        assert torch.allclose(ranks[0]["params"][name], ref, rtol=0, atol=1e-5), name
