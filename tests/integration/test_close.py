"""A finished run frees its process group before the interpreter exits: one freed during the
interpreter's finalization ended a gloo thread inside C++ ("terminate called without an active
exception", SIGABRT) now and then, and torchrun reported the finished job as failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import tiny_config, torchrun


@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_training_leaves_no_gloo_thread_running(mode: str, tmp_path: Path, shards: Path) -> None:
    config = tiny_config(tmp_path, shards)
    for rank in torchrun("close_group", 2, tmp_path, str(config), mode):
        # While the group lives, gloo runs two work threads and a transport loop per process.
        assert rank["gloo_threads"] == [], rank
