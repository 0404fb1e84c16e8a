"""memory.budget for a run (budget.py): the plan chosen once at the run's start, recorded, and
reused by every later start; a changed budget or device plans only the holds anew; a budget no
chunk size can meet refused before any probing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import TINY, tiny_model
from distseq.config import Config, load_config
from distseq.errors import ConfigError
from distseq.memory import budget, probe
from distseq.memory.chunked import ChunkedModel
from distseq.memory.plan import Plan

CPU = torch.device("cpu")
T, K = 16, 2  # the probe runs 2K and 4K frames: a few seconds at 32 px


def config(out: Path, *overrides: str) -> Config:
    base = [f"data.window={T}", "data.size=32", "data.batch_size=1", f"memory.chunk_frames={K}"]
    return load_config(None, [*base, f"train.out_dir={out}", *overrides])


def plan(cfg: Config, model: ChunkedModel, said: list[str] | None = None) -> Plan:
    say = (said if said is not None else []).append
    window = cfg.data.window
    return budget.plan_for_budget(cfg, model, model, 3, window, CPU, lambda x: x, say, True)


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The chunk sizes probed, in order."""
    chunks: list[int] = []
    real = budget.probe

    def counted(*args: Any) -> Any:
        chunks.append(args[-1])
        return real(*args)

    monkeypatch.setattr(budget, "probe", counted)
    return chunks


def between(planned: Plan, share: float) -> str:
    """A budget between the floor (every chunk recomputed) and plain autograd's peak."""
    floor, top = planned.floor_bytes(T), planned.top_bytes(T)
    return f"memory.budget={int(floor + share * (top - floor))}B"


@pytest.mark.slow
def test_a_run_plans_once_and_every_later_start_reuses_it(
    tmp_path: Path, probes: list[int]
) -> None:
    model = tiny_model("torch", chunk=8, norm="batchnorm", backbone=TINY)
    cfg = config(tmp_path, "memory.budget=1GB")
    first = plan(cfg, model)
    assert probes == [K] and (tmp_path / "plan.json").is_file()
    said: list[str] = []
    again = plan(cfg, tiny_model("torch", chunk=8, norm="batchnorm", backbone=TINY), said)
    assert probes == [K]  # no probing: the recorded measurements
    assert again.holds(T) == first.holds(T) and again.probe == first.probe
    assert said == [f"memory plan: {first.describe(T)} (as planned at the run's start)"]


@pytest.mark.slow
def test_another_budget_plans_the_holds_anew_at_the_recorded_chunk(
    tmp_path: Path, probes: list[int]
) -> None:
    model = tiny_model("torch", chunk=8, norm="batchnorm", backbone=TINY)
    ample = plan(config(tmp_path / "ample", "memory.budget=1GB"), model)
    first = plan(config(tmp_path, between(ample, 0.2)), model)
    # memory.chunk_frames changes too: the run's chunk size does not, under BatchNorm or not.
    said: list[str] = []
    high = between(ample, 0.8)
    second = plan(config(tmp_path, high, "memory.chunk_frames=4"), model, said)
    assert probes == [K, K, K] and second.probe.chunk_frames == first.probe.chunk_frames == K
    assert said[0].startswith(f"memory plan: {tmp_path / 'plan.json'} was planned for a budget ")
    assert said[0].endswith(f"planning the holds anew at the run's chunk={K}")
    assert sum(h.whole for h in second.holds(T)) > sum(h.whole for h in first.holds(T))
    recorded = json.loads((tmp_path / "plan.json").read_text())
    assert f"memory.budget={recorded['budget_bytes']}B" == high  # the run's plan from now on


@pytest.mark.slow
def test_the_recorded_chunk_is_kept_even_where_a_smaller_one_would_fit(
    tmp_path: Path, probes: list[int]
) -> None:
    model = tiny_model("torch", chunk=8, backbone=TINY)
    ample = plan(config(tmp_path, "memory.budget=1GB"), model)
    short = f"memory.budget={int(ample.floor_bytes(T)) - 1}B"
    with pytest.raises(ConfigError, match=f"every chunk of {K} recomputed"):
        plan(config(tmp_path, short), model)
    assert probes == [K, K]  # the recorded chunk alone, never a smaller one


def test_a_budget_below_the_parameters_is_refused_before_any_probing(
    tmp_path: Path, probes: list[int]
) -> None:
    with pytest.raises(ConfigError) as error:
        plan(config(tmp_path, "memory.budget=1KiB"), tiny_model("torch", backbone=TINY))
    message = str(error.value)
    assert "\n" not in message and "below the parameters and optimizer state alone" in message
    assert probes == [] and not (tmp_path / "plan.json").exists()


@pytest.mark.slow
def test_a_budget_no_chunk_size_meets_is_refused_after_one_probe(
    tmp_path: Path, probes: list[int]
) -> None:
    # Above the parameters, below what the T-long part of the step takes at any chunk size:
    # the first probe shows it, and no smaller chunk is probed.
    model = tiny_model("torch", backbone=TINY)
    fixed = probe.resident_bytes(model)
    with pytest.raises(ConfigError, match="is below the"):
        plan(config(tmp_path, f"memory.budget={fixed + 1000}B"), model)
    assert probes == [K]


@pytest.mark.slow
def test_the_same_config_plans_the_same_chunks_under_load(tmp_path: Path) -> None:
    # Two fresh runs of one config, the second while two processes keep both cores busy: the
    # chunk size, part of the model under BatchNorm, comes from the config, not from timings.
    # The holds do come from the probe's timings, and under load they once differed (on
    # ResNet-18, one chunk held from layer3 instead of layer2): they change a step's time, never
    # its result.
    model = tiny_model("torch", chunk=8, norm="batchnorm", backbone=TINY)
    spec = between(plan(config(tmp_path / "ample", "memory.budget=1GB"), model), 0.5)
    quiet = plan(config(tmp_path / "quiet", spec), model)
    spin = "import time\nend = time.time() + 120\nwhile time.time() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads among two hogs wait on each other: 6x slower
    try:
        loaded = plan(config(tmp_path / "loaded", spec), model)
    finally:
        torch.set_num_threads(threads)
        for hog in hogs:
            hog.kill()
    assert loaded.probe.chunk_frames == quiet.probe.chunk_frames == K
    for planned in (quiet, loaded):
        assert len(planned.holds(T)) == T // K and planned.peak_bytes(T) <= planned.budget_bytes


def test_an_unreadable_record_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text("{")
    with pytest.raises(Exception, match=r"plan\.json is unreadable .*delete it to plan anew"):
        plan(config(tmp_path, "memory.budget=1GB"), tiny_model("torch", backbone=TINY))
