"""The trainer's word on a sequence split (parallel.sequence), before any work: the start-up
line, or one ConfigError line naming the key for a split that cannot run."""

from __future__ import annotations

import pytest
import torch

from distseq.config import load_config
from distseq.errors import ConfigError
from distseq.parallel import DistInfo, Node
from distseq.train.loop import sequence_line


def info(world: int) -> DistInfo:
    return DistInfo(0, world, torch.device("cpu"))


def node(host: str, *ranks: int) -> Node:
    return Node(host, "10.0.0.1", "eth0", "", ranks)


def config(*overrides: str):  # type: ignore[no-untyped-def]
    return load_config(None, ["data.train=x.tar", "memory.chunk_frames=4", *overrides])


def test_the_start_up_line_names_each_group() -> None:
    line = sequence_line(config("parallel.sequence=2"), info(4), [])
    assert line == "parallel.sequence=2: each video's frames split across ranks 0-1, 2-3"
    assert sequence_line(config(), info(4), []) == ""


@pytest.mark.parametrize(
    "overrides,world,found,says",
    [
        (["parallel.sequence=3"], 4, [], "does not divide the 4 ranks; launch a multiple of 3"),
        (["parallel.sequence=2", "data.features=true"], 2, [], "data.features trains the head"),
        (["parallel.sequence=2", "data.window=7"], 2, [], "data.window=7 is shorter than 2 chunks"),
        (
            ["parallel.sequence=2"],
            6,
            [node("a", 0, 1, 2), node("b", 3, 4, 5)],
            "ranks 2-3 would split a video across a and b although one node holds 2 ranks",
        ),
    ],
)
def test_a_split_that_cannot_run_is_one_line(
    overrides: list[str], world: int, found: list[Node], says: str
) -> None:
    with pytest.raises(ConfigError, match=f"config key parallel.sequence=.*{says}"):
        sequence_line(config(*overrides), info(world), found)


def test_a_group_wider_than_a_node_spans_whole_nodes() -> None:
    found = [node("a", 0, 1), node("b", 2, 3)]
    line = sequence_line(config("parallel.sequence=4"), info(4), found)
    assert line.endswith("ranks 0-3")
