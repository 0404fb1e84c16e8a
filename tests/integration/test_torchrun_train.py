"""A real 2-rank FSDP2 run of ``distseq train`` under torchrun, then ``distseq export``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from conftest import assert_identical, full_state, tiny_config
from conftest import run_distseq as distseq
from distseq.checkpoint.export import load_exported
from distseq.config import load_config
from distseq.data.manifest import load_manifest
from distseq.data.val_stream import val_batches


def test_torchrun_fsdp_training_run(tmp_path: Path, shards: Path) -> None:
    # Videos of 9 to 14 frames: even a model that predicts one class everywhere, as a barely
    # trained one does, scores a different share of frames on each (see the end).
    config = str(tiny_config(tmp_path, shards))
    proc = distseq("train", config, "data.frames=8", cwd=tmp_path, torchrun=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Rank 0 alone prints: each metrics line and notice once, not once per rank.
    for step in (1, 2, 3):
        assert proc.stdout.count(f"step {step}: loss ") == 1, proc.stdout
    assert proc.stdout.count("val per-frame accuracy") == 1
    assert proc.stderr.count("config key data.frames is now data.window") == 1
    records = [
        json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["loss"] > 0 and r["frames_per_s"] > 0 for r in steps)
    ckpt = tmp_path / "run/checkpoints"
    assert (ckpt / "latest").read_text().strip() == "step_00000003"
    # the sharded checkpoint holds the whole model: read it back without any process group
    meta = dcp.FileSystemReader(str(ckpt / "step_00000003")).read_metadata()
    keys = set(meta.state_dict_metadata)
    assert "model.backbone.0.weight" in keys and "model.head.classifier.bias" in keys
    assert not any("encoder" in key for key in keys)  # no wrapper in the names
    assert torch.Size(meta.state_dict_metadata["model.head.classifier.bias"].size) == (3,)
    # and `distseq export` consolidates it into one file that loads without unpickling code
    proc = distseq(
        "export", str(tmp_path / "run"), "--out", str(tmp_path / "model.pt"), cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    exported = torch.load(tmp_path / "model.pt", weights_only=True)
    assert exported["step"] == 3 and exported["model"]["head.classifier.bias"].shape == (3,)

    # The validation accuracy the 2 ranks logged is the one a single process computes with the
    # trained model over every real val frame, each counted once.
    model = load_exported(tmp_path / "model.pt").model
    cfg = load_config(tmp_path / "run" / "config.yaml")
    manifest = load_manifest(cfg.data)

    def accuracy(rank: int, world: int) -> tuple[int, int]:
        correct = total = 0
        with torch.no_grad():
            for batch in val_batches(cfg.data, manifest, rank, world):
                pred = model(batch.frames, batch.mask).argmax(-1)
                correct += int((pred[batch.mask] == batch.labels[batch.mask]).sum())
                total += int(batch.mask.sum())
        return correct, total

    correct, total = accuracy(0, 1)
    assert total == sum(s.frames for s in manifest.shards.values() if s.split == "val")
    logged = [r["val_accuracy"] for r in records if "val_accuracy" in r]
    assert logged == [pytest.approx(correct / total, abs=1e-12)]
    # Neither rank's share alone gives that number, so the check above sees a rank that counts
    # only its own frames.
    for rank in (0, 1):
        share = accuracy(rank, 2)
        assert share[0] / share[1] != pytest.approx(correct / total), (rank, share)


def test_a_budget_under_fsdp_is_planned_once_for_both_ranks(tmp_path: Path, shards: Path) -> None:
    # The probe runs the sharded model on both ranks (its steps are collectives too); rank 0's
    # measurements become the plan of both, and rank 0 alone says it.
    config = str(tiny_config(tmp_path, shards))
    proc = distseq("train", config, "memory.budget=1GB", "data.val=", cwd=tmp_path, torchrun=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plans = [line for line in proc.stdout.splitlines() if line.startswith("memory plan: ")]
    assert len(plans) == 1 and plans[0].startswith("memory plan: T=8 chunk="), proc.stdout
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step_00000003\n"


def test_a_compiled_backbone_trains_as_eager_under_fsdp_and_a_budget(
    tmp_path: Path, shards: Path
) -> None:
    config = str(tiny_config(tmp_path, shards))
    compiled = ("model.compile=true", "model.compile_backend=aot_eager", "memory.budget=1GB")
    out = f"train.out_dir={tmp_path / 'compiled'}"
    proc = distseq("train", config, *compiled, "data.val=", out, cwd=tmp_path, torchrun=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The plan measured the compiled backbone and holds whole chunks only.
    assert json.loads((tmp_path / "compiled" / "plan.json").read_text())["stages"] == []
    lines = (tmp_path / "compiled" / "metrics.jsonl").read_text().splitlines()
    got = [json.loads(line) for line in lines]
    graphs = [r["compiled_graphs"] for r in got]
    assert len(graphs) == 3 and graphs[0] >= 1 and graphs[-1] == graphs[0], graphs  # no more
    eager = distseq("train", config, "data.val=", cwd=tmp_path, torchrun=2)
    assert eager.returncode == 0, eager.stderr[-3000:]
    eager_lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ref = [json.loads(line) for line in eager_lines]
    # The first step starts from the same parameters on the same frames: the same loss and
    # gradient. (Later ones are not compared: AdamW's first steps move each parameter by about
    # the learning rate whatever the size of its gradient, so a gradient of nearly 0 that comes
    # out +1e-9 in one run and -1e-9 in the other moves its parameter 2 lr apart.)
    assert got[0]["loss"] == pytest.approx(ref[0]["loss"], rel=1e-5)
    assert got[0]["grad_norm"] == pytest.approx(ref[0]["grad_norm"], rel=1e-5)


@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_a_frozen_backbone_stays_then_resumes_bit_exact_on_two_ranks(
    tmp_path: Path, shards: Path, mode: str
) -> None:
    # The frozen backbone runs without autograd: FSDP2 reduces no gradient for it, and DDP
    # looks for the parameters that got none.
    config = str(tiny_config(tmp_path, shards))
    frozen = "optim.groups=[{prefix: backbone, frozen_until: 2, warmup_steps: 2}]"
    common = [config, frozen, "train.steps=4", "model.backbone.norm=batchnorm"]
    common.append(f"parallel.mode={mode}")

    def run(out: str, *extra: str) -> Path:
        proc = distseq(
            "train", *common, f"train.out_dir={tmp_path / out}", *extra, cwd=tmp_path, torchrun=2
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return tmp_path / out / "checkpoints"

    parts = run("parts", "train.stop_after=2", "train.save_every=1")
    first, second = full_state(parts / "step_00000001"), full_state(parts / "step_00000002")
    backbone = [k for k in first["model"] if k.startswith("backbone.")]
    assert any(k.endswith("running_mean") for k in backbone)
    for key in backbone:  # sharded over two ranks, the frozen CNN and its statistics stay
        assert torch.equal(first["model"][key], second["model"][key]), key
    assert not torch.equal(
        first["model"]["head.classifier.weight"], second["model"]["head.classifier.weight"]
    )
    assert not [k for k in second["optim"]["state"] if k.startswith("backbone.")]
    whole = run("whole")
    run("parts")  # resumed across the unfreeze at step 2
    final = full_state(parts / "step_00000004")
    assert not torch.equal(
        final["model"]["backbone.0.weight"], second["model"]["backbone.0.weight"]
    )
    assert_identical(final, full_state(whole / "step_00000004"))
