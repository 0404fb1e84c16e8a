"""memory.budget: the plan's step stays under its budget, measured, and holds as much as fits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import TINY, random_batch, tiny_model
from distseq.errors import ConfigError
from distseq.memory import plan as planning
from distseq.memory.budget import budget_bytes
from distseq.memory.chunked import NOTHING, WHOLE, Hold
from distseq.memory.measure import measure_step
from distseq.memory.plan import Plan
from distseq.memory.probe import Probe, RunShape, probe, resident_bytes

CPU = torch.device("cpu")
T, SIZE = 48, 32
SHAPE = RunShape(batch_size=1, size=SIZE, num_classes=3, window=T, device=CPU)
# The probe's own checks run on distseq's small CNN, TINY (a probe of ResNet-18 over 48 frames
# took ~10 s here); a real step under its plan runs on two torchvision CNNs.


@pytest.mark.slow
@pytest.mark.parametrize("backbone", ["resnet18", "mobilenet_v3_small"])
@pytest.mark.parametrize("share", [0.3, 0.7])
def test_a_plan_keeps_a_real_step_under_its_budget(backbone: str, share: float) -> None:
    model = tiny_model("torch", chunk=8, backbone=backbone)
    measured = probe(model, model, SHAPE, 4)
    assert measured.chunk_frames == 4
    # A budget between the floor (all recomputed) and plain autograd's peak.
    floor, plain = Plan(measured, 0).floor_bytes(T), Plan(measured, 0).top_bytes(T)
    plan = Plan(measured, int(floor + share * (plain - floor)), tuple(model.stages))
    plan.check(T)
    plan.apply(model)
    holds = plan.holds(T)
    assert len(holds) == T // 4 and set(holds) not in ({WHOLE}, {NOTHING})  # neither floor nor top

    batch = random_batch(1, T, size=SIZE)
    cost = measure_step(model, batch.frames, batch.mask, batch.labels)
    # What the device holds at the step's peak: what was there before it, and the step's own.
    total = resident_bytes(model) + batch.frames.numel() + cost.peak_bytes
    assert total <= plan.budget_bytes, (total, plan.budget_bytes)
    # More memory would save time here (not all is held), so the plan uses nearly all of it.
    assert total >= 0.85 * plan.budget_bytes, (total, plan.budget_bytes)
    assert abs(total - plan.peak_bytes(T)) < 0.02 * total  # the prediction, to 2%


@pytest.mark.slow
def test_the_probe_leaves_the_model_and_the_rng_as_they_were() -> None:
    model = tiny_model("torch", chunk=8, norm="batchnorm", backbone=TINY)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    probe(model, model, SHAPE, 4)
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert all(p.grad is None for p in model.parameters())
    assert (model.chunk_frames, model.keep_frames, model.plan) == (8, 0, None)


@pytest.mark.slow
def test_a_budget_below_the_floor_says_what_would_fit() -> None:
    model = tiny_model("torch", chunk=8, backbone=TINY)
    measured = probe(model, model, SHAPE, 4)
    floor = Plan(measured, 0).floor_bytes(T)
    plan = Plan(measured, int(floor) - 1)
    with pytest.raises(ConfigError) as error:
        plan.check(T)
    message = str(error.value)
    assert "\n" not in message and message.startswith("config key memory.budget: ")
    largest = int(message.split("data.window <= ")[1].split(",")[0])
    assert largest == T - 1  # a byte short: one frame fewer fits
    plan.check(largest)


def test_a_fraction_of_the_device_needs_a_gpu() -> None:
    assert budget_bytes("2GB", CPU) == 2 * 10**9
    with pytest.raises(ConfigError, match=r"memory\.budget='0\.5': a fraction is of a GPU"):
        budget_bytes("0.5", CPU)


@pytest.mark.slow
def test_offloaded_frames_cost_the_device_nothing_per_frame() -> None:
    model = tiny_model("torch", chunk=8, backbone=TINY)
    on_device = probe(model, model, SHAPE, 4)
    on_host = probe(model, model, replace(SHAPE, frames_on_host=True), 4)
    # On the CPU the step itself is the same; the plan stops counting the uint8 frames.
    assert on_device.per_frame_bytes - on_host.per_frame_bytes == 3 * SIZE * SIZE
    assert Plan(on_host, 10**9).peak_bytes(T) < Plan(on_device, 10**9).peak_bytes(T)


# A probe worked by hand, in MB: chunks of 2 frames; 100 fixed and 1 a frame; recomputing a
# frame costs 1 s forward (and its chunk 20 of recompute peak); holding its one late stage costs
# 2 and leaves 0.25 s of recompute (12 peak); holding it whole costs 10.
MB = 10**6
HAND = Probe(
    chunk_frames=2,
    fixed_bytes=100 * MB,
    per_frame_bytes=1.0 * MB,
    recompute_bytes=20.0 * MB,
    held_base_bytes=0.0,
    activation_bytes=10.0 * MB,
    forward_seconds=1.0,
    backward_seconds=1.0,
    stage_bytes=(2.0 * MB,),
    stage_seconds=(0.25,),
    stage_recompute_bytes=(12.0 * MB,),
)


@pytest.mark.parametrize(
    ("budget", "holds", "peak", "seconds"),
    [
        # 108 for 8 frames, then 20 for the first recompute: the floor. Two chunks' late stages
        # fit in it too, recomputed first, at 12 + 2 x 2 x 2 = 20; then the rest recompute at
        # 20 with those freed: 16 + 4 x 0.25 + 4 x 1 s.
        (128, (2, 2, 1, 1), 128, 21.0),
        # 4 more: three chunks' late stages: 16 + 6 x 0.25 + 2 x 1 s.
        (132, (2, 1, 1, 1), 132, 19.5),
        # 8 more: every chunk's late stage: 108 + 12 + 8 x 2 for the first recompute.
        (136, (1, 1, 1, 1), 136, 18.0),
        # 12 more: the last chunk whole instead (2 x 10 freed before the first recompute, at
        # 12 + 6 x 2), the rest holding their late stages: 16 + 6 x 0.25 s.
        (140, (1, 1, 1, 0), 140, 17.5),
    ],
)
def test_the_plan_is_the_best_layout_worked_by_hand(
    budget: int, holds: tuple[int, ...], peak: float, seconds: float
) -> None:
    plan = Plan(HAND, budget * MB, ("layer4",))
    plan.check(8)
    # The holds by their stage in this one-split probe: 0 whole, 1 the late stage, 2 nothing.
    stage = {WHOLE: 0, Hold(1): 1, NOTHING: 2}
    assert (tuple(stage[h] for h in plan.holds(8)), plan.peak_bytes(8), plan.step_seconds(8)) == (
        holds,
        peak * MB,
        seconds,
    )


def test_the_plan_line_says_what_is_held() -> None:
    assert Plan(HAND, 140 * MB, ("layer4",)).describe(8) == (
        "T=8 chunk=2: 1/4 chunks kept, 3 hold stage 2 of 2 (from layer4); predicted peak "
        "0.14 GB of 0.14 GB, recompute 19% of forward time"
    )
    assert Plan(HAND, 132 * MB, ("layer4",)).describe(8) == (
        "T=8 chunk=2: 0/4 chunks kept, 3 hold stage 2 of 2 (from layer4) and 1 recomputes all; "
        "predicted peak 0.132 GB of 0.132 GB, recompute 44% of forward time"
    )
    with pytest.raises(ConfigError, match=r"below the 0\.128 GB that T=8 needs"):
        Plan(HAND, 127 * MB).check(8)


def test_a_level_above_the_line_between_its_neighbours_is_never_used() -> None:
    # A second stage split that holds 8 MB a frame for 0.2 s of recompute: mixing the first
    # split (2 MB, 0.25 s) with whole frames (10 MB, 0 s) gives 0.0625 s at 8 MB, faster.
    probe = replace(
        HAND,
        stage_bytes=(2.0 * MB, 8.0 * MB),
        stage_seconds=(0.25, 0.2),
        stage_recompute_bytes=(12.0 * MB, 12.0 * MB),
    )
    hull = planning._lower_hull(planning.levels(probe))
    assert [level.hold for level in hull] == [NOTHING, Hold(1), WHOLE]
    for budget in range(128, 200, 2):
        assert Hold(2) not in Plan(probe, budget * MB).holds(8)


@pytest.mark.slow
def test_a_floor_above_the_budget_is_tried_again_at_a_smaller_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The plan starts from chunks of 4, whose floor is above the budget; chunks of 2 recompute
    # half as much at a time and fit.
    monkeypatch.setattr(planning, "CHUNKS", (2, 4))
    model = tiny_model("torch", chunk=8, backbone=TINY)
    # Each chunk size probed once; the planner is handed these measurements, in the order it
    # asks for them.
    probes = {k: probe(model, model, SHAPE, k) for k in (2, 4)}
    floors = {k: Plan(probes[k], 0).floor_bytes(T) for k in (2, 4)}
    assert floors[2] < floors[4]
    budget = int((floors[2] + floors[4]) / 2)
    probed, said = [], []

    def plan_at(chunk: int) -> Plan:
        probed.append(chunk)
        return Plan(probes[chunk], budget)

    plan = planning.fit(plan_at, 4, T, said.append)
    assert probed == [4, 2] and plan.probe.chunk_frames == 2
    assert plan.peak_bytes(T) <= budget
    assert len(said) == 1 and said[0].startswith("memory plan: chunk=4 needs "), said
    # Below the smallest chunk's floor too: the one-line refusal, after trying both.
    probed.clear()
    budget = int(floors[2]) - 1
    with pytest.raises(ConfigError, match="every chunk of 2 recomputed"):
        planning.fit(plan_at, 4, T, said.append)
    assert probed == [4, 2]
