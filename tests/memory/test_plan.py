"""memory.budget: the plan's step stays under its budget, measured, and holds as much as fits."""

from __future__ import annotations

import pytest
import torch

from conftest import random_batch, tiny_model
from distseq.errors import ConfigError
from distseq.memory import plan as planning
from distseq.memory.measure import measure_step
from distseq.memory.plan import Plan, budget_bytes, probe, resident_bytes

CPU = torch.device("cpu")
T, SIZE = 48, 32


@pytest.fixture(autouse=True)
def _chunks_of_four(monkeypatch: pytest.MonkeyPatch) -> None:
    # One candidate chunk size: the CPU's throughput decides nothing worth testing here, and
    # chunks of 4 out of 48 frames make the budget's granularity fine.
    monkeypatch.setattr(planning, "CHUNKS", (4,))


@pytest.mark.parametrize("backbone", ["resnet18", "mobilenet_v3_small"])
@pytest.mark.parametrize("share", [0.3, 0.7])
def test_a_plan_keeps_a_real_step_under_its_budget(backbone: str, share: float) -> None:
    model = tiny_model("torch", chunk=8, backbone=backbone)
    measured = probe(model, model, 1, SIZE, 3, T, CPU)
    assert measured.chunk_frames == 4
    # A budget between the floor (all recomputed) and plain autograd's peak.
    floor = Plan(measured, 0).peak_bytes(T, held=0)
    plain = Plan(measured, 0).peak_bytes(T, held=T)
    plan = Plan(measured, int(floor + share * (plain - floor)))
    plan.check(T)
    model.chunk_frames, model.plan = measured.chunk_frames, plan.held_frames
    held = plan.held_frames(T)
    assert 0 < held < T and held % 4 == 0

    batch = random_batch(1, T, size=SIZE)
    cost = measure_step(model, batch.frames, batch.mask, batch.labels)
    # What the device holds at the step's peak: what was there before it, and the step's own.
    total = resident_bytes(model) + batch.frames.numel() + cost.peak_bytes
    assert total <= plan.budget_bytes, (total, plan.budget_bytes)
    # More memory would save time here (held < T), so the plan uses nearly all of it.
    assert total >= 0.85 * plan.budget_bytes, (total, plan.budget_bytes)
    assert abs(total - plan.peak_bytes(T)) < 0.02 * total  # the prediction, to 2%


def test_the_probe_leaves_the_model_and_the_rng_as_they_were() -> None:
    model = tiny_model("torch", chunk=8, norm="batchnorm")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    probe(model, model, 1, SIZE, 3, T, CPU)
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert all(p.grad is None for p in model.parameters())
    assert (model.chunk_frames, model.keep_frames, model.plan) == (8, 0, None)


def test_a_budget_below_the_floor_says_what_would_fit() -> None:
    model = tiny_model("torch", chunk=8)
    measured = probe(model, model, 1, SIZE, 3, T, CPU)
    floor = Plan(measured, 0).peak_bytes(T, held=0)
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


def test_offloaded_frames_cost_the_device_nothing_per_frame() -> None:
    model = tiny_model("torch", chunk=8)
    on_device = probe(model, model, 1, SIZE, 3, T, CPU)
    on_host = probe(model, model, 1, SIZE, 3, T, CPU, frames_on_host=True)
    # On the CPU the step itself is the same; the plan stops counting the uint8 frames.
    assert on_device.per_frame_bytes - on_host.per_frame_bytes == 3 * SIZE * SIZE
    assert Plan(on_host, 10**9).peak_bytes(T) < Plan(on_device, 10**9).peak_bytes(T)
