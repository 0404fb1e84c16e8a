"""The sequence split's arithmetic, its plan line and its refusals, without a process group (the
split itself, on torchrun ranks: tests/integration/test_sequence.py)."""

from __future__ import annotations

import pytest

import distseq
from distseq.config import Config, load_config
from distseq.data.batch import slices
from distseq.errors import ConfigError
from distseq.model.video import FeatureModel
from distseq.parallel.sequence import sequence_line
from own_model import LSTMHead, small_cnn


@pytest.mark.parametrize(
    "length,unit,size,expected",
    [
        (13, 4, 2, [(0, 8), (8, 13)]),  # chunks 4, 4 | 4, 1
        (13, 4, 3, [(0, 4), (4, 8), (8, 13)]),
        (16, 4, 4, [(0, 4), (4, 8), (8, 12), (12, 16)]),
        (5, 4, 3, [(0, 0), (0, 4), (4, 5)]),  # fewer chunks than ranks: one rank has none
        (7, 1, 2, [(0, 3), (3, 7)]),  # a plain VideoModel: cut anywhere
    ],
)
def test_slices_are_contiguous_cut_on_chunks_and_cover_the_sequence(
    length: int, unit: int, size: int, expected: list[tuple[int, int]]
) -> None:
    got = slices(length, unit, size)
    assert got == expected
    assert all(a % unit == 0 for a, _ in got)


def model() -> distseq.ChunkedModel:
    return distseq.ChunkedModel(small_cnn(16), LSTMHead(16, 3, 8), feature_dim=16)


@pytest.mark.parametrize(
    "sequence,says",
    [
        (2, "sequence=2 does not divide the 1 ranks of this group"),
        (0, "sequence=0: a whole number of ranks >= 1"),
        ("2", "sequence='2': a whole number of ranks >= 1"),
        (True, "sequence=True: a whole number of ranks >= 1"),  # == 1, but not a number of ranks
    ],
)
def test_a_bad_sequence_is_one_line(sequence: object, says: str) -> None:
    with pytest.raises(distseq.ModelError, match=says):
        distseq.parallelize(model(), "ddp", sequence=sequence)  # type: ignore[arg-type]


def test_a_model_without_a_cnn_has_nothing_to_split() -> None:
    features = FeatureModel(LSTMHead(16, 3, 8), 16)  # the head over stored features
    with pytest.raises(distseq.ModelError, match="FeatureModel runs no CNN"):
        distseq.parallelize(features, "ddp", sequence=2)


def test_sequence_one_is_no_split() -> None:
    m = distseq.parallelize(model(), "ddp", sequence=1)
    assert isinstance(m, distseq.ChunkedModel) and m.split is None


def config(*overrides: str) -> Config:
    return load_config(None, ["data.train=x.tar", "memory.chunk_frames=4", *overrides])


def test_the_plan_line_names_each_group() -> None:
    line = sequence_line(config("parallel.sequence=2"), 4, {})
    assert line == "parallel.sequence=2: each video's frames split across ranks 0-1, 2-3"
    assert sequence_line(config(), 4, {}) == ""
    across = {0: "a", 1: "a", 2: "b", 3: "b"}  # a group wider than a node spans whole nodes
    assert sequence_line(config("parallel.sequence=4"), 4, across).endswith("ranks 0-3")


@pytest.mark.parametrize(
    "overrides,world,hosts,says",
    [
        (["parallel.sequence=3"], 4, {}, "does not divide the 4 ranks; launch a multiple of 3"),
        (["parallel.sequence=2", "data.features=true"], 2, {}, "data.features trains the head"),
        (["parallel.sequence=2", "data.window=7"], 2, {}, "data.window=7 is shorter than 2 chunks"),
        (
            ["parallel.sequence=2"],
            6,
            {r: "ab"[r // 3] for r in range(6)},
            "ranks 2-3 would split a video across a and b although one node holds 2 ranks",
        ),
    ],
)
def test_a_split_that_cannot_run_is_one_line(
    overrides: list[str], world: int, hosts: dict[int, str], says: str
) -> None:
    with pytest.raises(ConfigError, match=f"config key parallel.sequence=.*{says}"):
        sequence_line(config(*overrides), world, hosts)
