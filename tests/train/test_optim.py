"""Parameter groups by name prefix (optim.groups, distseq.param_groups): which parameters each
takes, the learning rate and weight decay each gets, and the refusals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

import distseq
from conftest import assert_identical, full_state, random_batch, tiny_model
from distseq.config import OptimConfig, ParamGroup, load_config
from distseq.errors import ConfigError
from distseq.memory.measure import measure_step
from distseq.memory.probe import resident_bytes
from distseq.model.video import build_model
from distseq.train.loop import train
from distseq.train.optim import Freezing, build_optimizer, freeze_for_the_run, param_groups
from distseq.train.step import train_step


def _names(model: nn.Module, groups: list[dict]) -> list[set[str]]:
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [{name_of[id(p)] for p in g["params"]} for g in groups]


def test_each_parameter_goes_to_its_longest_prefix() -> None:
    model = tiny_model(backbone="tiny_cnn")
    groups = param_groups(
        model,
        1e-3,
        0.01,
        [ParamGroup("head", lr_scale=2.0), ParamGroup("head.rnn", 0.5, weight_decay=0.0)],
    )
    names = _names(model, groups)
    everything = {n for n, _ in model.named_parameters()}
    assert names[0] == {n for n in everything if n.startswith("backbone.")}
    assert names[1] == {"head.classifier.weight", "head.classifier.bias"}
    assert names[2] == {n for n in everything if n.startswith("head.rnn.")}
    assert [(g["lr"], g["weight_decay"]) for g in groups] == [
        (1e-3, 0.01),
        (2e-3, 0.01),
        (5e-4, 0.0),
    ]


def test_a_scale_of_a_tenth_moves_the_first_adamw_step_a_tenth() -> None:
    # AdamW's first step moves a parameter by lr * g / (|g| + eps): lr to 1e-4 where |g| > 1e-4
    # (eps is 1e-8). Without weight decay a group at lr_scale 0.1 moves by a tenth of the others'.
    model = tiny_model(backbone="tiny_cnn")
    cfg = OptimConfig(
        lr=1e-2, weight_decay=0.0, warmup_steps=0, groups=[ParamGroup("backbone", 0.1)]
    )
    optimizer, _ = build_optimizer(model, cfg, 10)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_step(model, optimizer, [random_batch(2, 6)], 1)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    optimizer.step()
    for name, p in model.named_parameters():
        moved = (p.detach() - before[name]).abs()[grads[name].abs() > 1e-4]
        want = 1e-3 if name.startswith("backbone.") else 1e-2
        torch.testing.assert_close(moved, torch.full_like(moved, want), rtol=1e-3, atol=0)


def test_a_ddp_wrapped_models_names_are_the_models() -> None:
    model = tiny_model(backbone="tiny_cnn")

    class Wrapped(nn.Module):  # as DDP holds the model: its names begin with module.
        def __init__(self) -> None:
            super().__init__()
            self.module = model

    groups = param_groups(Wrapped(), 1e-3, 0.0, [ParamGroup("backbone", 0.1)])
    assert all(n.startswith("backbone.") for n in _names(model, groups)[1])


def test_a_prefix_naming_no_parameter_is_one_line() -> None:
    model = tiny_model(backbone="tiny_cnn")
    for prefix in ("heads", "head.rn"):  # a dotted beginning, not any beginning
        with pytest.raises(ConfigError, match=f"prefix '{prefix}' names no parameter") as e:
            param_groups(model, 1e-3, 0.0, [ParamGroup(prefix)])
        assert "begin with backbone, head" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "value,error",
    [
        ("[{prefix: head, lr_scale: -1}]", "optim.groups[0].lr_scale=-1.0: must be >= 0"),
        ("[{prefix: head}, {prefix: head}]", "names a prefix twice"),
        ("[{prefix: head}, {lr_scale: 2}]", "optim.groups[1].prefix='': must name a prefix"),
        ("[{prefix: head, weight_decay: -0.1}]", "optim.groups[0].weight_decay=-0.1: must be"),
        # The config library's words, or a TypeError, before: each named by its place now.
        ("5", "optim.groups=5: must be a list of groups, e.g. [{prefix: backbone"),
        ("{prefix: head}", "optim.groups={'prefix': 'head'}: must be a list of groups"),
        ("[5]", "optim.groups[0]=5: must be a group, e.g. {prefix: backbone"),
        (
            "[{prefix: head, learning_rate: 0.1}]",
            "optim.groups[0].learning_rate: not a field of a group; its fields: prefix, lr_scale,",
        ),
        ("[{prefix: head, lr_scale: abc}]", "optim.groups[0].lr_scale: Value 'abc' of type"),
    ],
)
def test_bad_groups_are_refused_by_the_config(value: str, error: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.train=s/x.tar", f"optim.groups={value}"])
    assert error in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_bad_groups_in_a_config_file_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "groups.yaml"
    path.write_text("optim:\n  groups: [{prefix: backbone}, {prefix: head, lr: 0.1}]\n")
    with pytest.raises(ConfigError, match=rf"^{path}: config key optim\.groups\[1\]\.lr: not a"):
        load_config(path)


def test_groups_from_yaml_and_the_public_api(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "data: {train: s/x.tar}\noptim: {groups: [{prefix: backbone, lr_scale: 0.1}]}\n"
    )
    assert load_config(path, []).optim.groups == [ParamGroup("backbone", 0.1)]
    assert distseq.param_groups is param_groups and distseq.ParamGroup is ParamGroup


def _run(shards: Path, out: Path, groups: str, *extra: str) -> None:
    """4 steps of a tiny CNN with BatchNorm and an LSTM on the test shards, under ``groups``."""
    overrides = [
        f"data.train={shards}/train-{{000000..000003}}.tar",
        "data.val=",
        "data.size=32",
        "data.window=8",
        "data.num_workers=0",
        "model.backbone.name=tiny_cnn",
        "model.backbone.norm=batchnorm",
        "model.head.hidden=8",
        "parallel.mode=none",
        "optim.warmup_steps=0",
        "train.steps=4",
        f"train.out_dir={out}",
        f"optim.groups={groups}",
    ]
    train(load_config(None, [*overrides, *extra]))


def _initial() -> nn.Module:
    """The model of ``_run`` as its first step finds it (train.seed 0)."""
    torch.manual_seed(0)
    overrides = ["data.train=x.tar", "model.backbone.name=tiny_cnn", "model.head.hidden=8"]
    cfg = load_config(None, [*overrides, "model.backbone.norm=batchnorm"])
    return build_model(cfg.model, 3)


def _step(out: Path, step: int) -> dict:
    return full_state(out / "checkpoints" / f"step_{step:08d}")


def test_a_run_with_groups_resumes_bit_exact(shards: Path, tmp_path: Path) -> None:
    # The optimizer's state and each group's learning rate come back from the checkpoint.
    groups = "[{prefix: backbone, lr_scale: 0.1}, {prefix: head.rnn, weight_decay: 0}]"
    _run(shards, tmp_path / "whole", groups)
    _run(shards, tmp_path / "parts", groups, "train.stop_after=2")
    _run(shards, tmp_path / "parts", groups)
    final = [_step(tmp_path / run, 4) for run in ("whole", "parts")]
    assert_identical(final[0], final[1])
    assert [g["initial_lr"] for g in final[0]["optim"]["param_groups"]] == pytest.approx(
        [1e-3, 1e-4, 1e-3]
    )


def test_a_frozen_group_stays_through_its_step_then_trains_and_resumes_bit_exact(
    shards: Path, tmp_path: Path
) -> None:
    groups = "[{prefix: backbone, frozen_until: 2, warmup_steps: 2}]"
    _run(shards, tmp_path / "parts", groups, "train.stop_after=2")
    initial = _initial().state_dict()
    at2 = _step(tmp_path / "parts", 2)
    backbone = [k for k in initial if k.startswith("backbone.")]
    assert any(k.endswith("running_mean") for k in backbone)
    for key in backbone:  # weights and BatchNorm statistics alike
        assert torch.equal(at2["model"][key], initial[key]), key
    assert not torch.equal(
        at2["model"]["head.classifier.weight"], initial["head.classifier.weight"]
    )
    state = at2["optim"]["state"]
    assert state and not [k for k in state if k.startswith("backbone.")]  # no AdamW state
    _run(shards, tmp_path / "parts", groups)
    at4 = _step(tmp_path / "parts", 4)
    assert not torch.equal(at4["model"]["backbone.0.weight"], initial["backbone.0.weight"])
    assert [k for k in at4["optim"]["state"] if k.startswith("backbone.")]
    # Resumed across the unfreeze, the run is the uninterrupted one to the bit.
    _run(shards, tmp_path / "whole", groups)
    assert_identical(_step(tmp_path / "whole", 4), at4)


def test_the_frozen_groups_schedule() -> None:
    model = tiny_model(backbone="tiny_cnn")
    groups = [ParamGroup("backbone", frozen_until=2, warmup_steps=4)]
    cfg = OptimConfig(lr=1.0, warmup_steps=0, groups=groups)
    optimizer, schedule = build_optimizer(model, cfg, 100)
    lrs = []
    for _ in range(7):
        lrs.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        schedule.step()
    cosine = [0.5 * (1 + math.cos(math.pi * s / 100)) for s in range(7)]
    assert [lr[0] for lr in lrs] == pytest.approx(cosine)  # the head: optim.lr's schedule
    ramp = [0, 0, 1 / 4, 2 / 4, 3 / 4, 1, 1]  # steps 1-2 frozen, then 4 steps of warm-up
    assert [lr[1] for lr in lrs] == pytest.approx(
        [r * c for r, c in zip(ramp, cosine, strict=True)]
    )


def test_a_frozen_backbone_keeps_no_activation_and_gives_the_head_its_gradients() -> None:
    # Measured, not assumed: the bytes autograd keeps from forward to backward and the step's
    # peak, with the whole backbone frozen (it runs without autograd) and training.
    batch = random_batch(2, 16)
    groups = [ParamGroup("backbone", frozen_until=1)]
    costs, grads = [], []
    for step in (1, 2):  # frozen at step 1, training at step 2
        model = tiny_model(chunk=4)  # GroupNorm: the same forward frozen or not
        Freezing(model, groups).before_step(step)
        assert model.backbone_frozen == (step == 1)
        costs.append(measure_step(model, batch.frames, batch.mask, batch.labels))
        model(batch.frames, batch.mask).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    frozen, training = costs
    # The checkpointed chunks keep their frames (uint8) for the recompute; frozen, none is kept,
    # and the step's peak, the recomputes' activations and the CNN's gradients, goes (133.6 MB
    # training, 9.7 MB frozen: ResNet-18 at 32 px, 2 x 16 frames).
    assert frozen.saved_bytes <= training.saved_bytes - batch.frames.numel(), (frozen, training)
    assert frozen.peak_bytes < training.peak_bytes / 5, (frozen, training)
    assert all(g is None for n, g in grads[0].items() if n.startswith("backbone."))
    head = [n for n in grads[1] if n.startswith("head.")]
    for name in head:  # the same forward: the head's gradients are the training step's
        assert torch.equal(grads[0][name], grads[1][name]), name


def test_a_group_frozen_for_the_whole_run_gets_no_gradient_and_no_moments(
    shards: Path, tmp_path: Path
) -> None:
    _run(shards, tmp_path / "run", "[{prefix: head.rnn, frozen_until: 4}]")
    initial = _initial()
    at4 = _step(tmp_path / "run", 4)
    rnn = [k for k in at4["model"] if k.startswith("head.rnn.")]
    assert rnn and all(torch.equal(at4["model"][k], initial.state_dict()[k]) for k in rnn)
    assert not [k for k in at4["optim"]["state"] if k.startswith("head.rnn.")]
    # The memory plan leaves out its moments, and a step computes no gradient for it.
    batch = random_batch(2, 8)
    whole = resident_bytes(initial)
    before = measure_step(initial, batch.frames, batch.mask, batch.labels)
    assert freeze_for_the_run(initial, [ParamGroup("head.rnn", frozen_until=4)], 4) == len(rnn)
    numel = sum(p.numel() for n, p in initial.named_parameters() if n.startswith("head.rnn."))
    assert whole - resident_bytes(initial) == 8 * numel
    after = measure_step(initial, batch.frames, batch.mask, batch.labels)
    assert before.peak_bytes - after.peak_bytes >= 4 * numel, (before, after)


@pytest.mark.parametrize(
    "groups,message",
    [
        ("[{prefix: backbone, frozen_until: 9}, {prefix: head, frozen_until: 4}]", "every para"),
        (
            "[{prefix: backbone, frozen_until: 2}, {prefix: head, frozen_until: 4}]",
            "through step 2",
        ),
    ],
)
def test_a_run_that_trains_nothing_for_a_while_is_refused(
    groups: str, message: str, shards: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=message):
        _run(shards, tmp_path / "run", groups)


def test_a_backbone_frozen_for_good_needs_no_checkpoint_under_fairscale() -> None:
    # requires_grad off throughout, as a part frozen for the run is: no checkpoint runs (one
    # with nothing to recompute for fails in fairscale's backward), and the head still learns.
    batch = random_batch(2, 8)
    model = tiny_model("fairscale", chunk=4)
    model.backbone.requires_grad_(False)
    model(batch.frames, batch.mask).sum().backward()
    assert all(p.grad is not None for p in model.head.parameters())
    freezing = Freezing(model, [ParamGroup("backbone", frozen_until=2)])
    assert [freezing.unfreezes(step) for step in (1, 2, 3, 4)] == [False, False, True, False]
