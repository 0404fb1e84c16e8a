"""The config schema: every check at load time, old key names, empty values, the run's YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from distseq.cli import main
from distseq.config import RENAMED, Config, load_config, to_yaml
from distseq.config.keys import DOCS, key_values, reference_table
from distseq.errors import ConfigError


def test_a_resolved_config_reads_back_as_the_same_config(tmp_path: Path) -> None:
    cfg = load_config(None, ["data.train=s/x.tar", "data.on_error=skip", "memory.recompute=none"])
    text = to_yaml(cfg)
    # Values as a user types them, never an enum's Python name.
    assert "on_error: skip" in text and "recompute: none" in text and "norm: groupnorm" in text
    assert "on_error: raise" in to_yaml(Config())
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert load_config(path) == cfg
    path.write_text(to_yaml(Config()))
    assert load_config(path) == Config()


def test_an_empty_value_is_the_empty_string(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("data: {train: s/x.tar, val: s/v.tar}\n")
    assert load_config(path, ["data.val="]).data.val == ""
    with pytest.raises(ConfigError, match=r"data\.window"):  # not a string: still an error
        load_config(path, ["data.window="])


def test_renamed_keys_are_read_with_a_notice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(
        "data: {frames: 12}\nmemory: {backend: fairscale}\n"
        "model: {head: {kind: transformer, window: 16}}\n"
    )
    cfg = load_config(path)
    assert cfg.data.window == 12 and cfg.memory.recompute.value == "fairscale"
    assert cfg.model.head.span == 16
    err = capsys.readouterr().err
    assert "config key data.frames is now data.window" in err
    assert "config key memory.backend is now memory.recompute" in err
    assert "config key model.head.window is now model.head.span" in err
    assert load_config(None, ["data.frames=7"]).data.window == 7
    # A newer override wins over an old name in the file, as over any value there.
    assert load_config(path, ["data.window=5"]).data.window == 5
    path.write_text("data: {frames: 12, window: 8}\n")
    with pytest.raises(ConfigError, match=r"data\.frames and data\.window are one key"):
        load_config(path)
    # The manual names each, with its new name.
    manual = " ".join((REPO / "docs/config.md").read_text().split())
    for old, new in RENAMED.items():
        assert f"`{old}`: `{new}`" in manual, old


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["memory.tbptt_frames=64", "model.head.bidirectional=true"], "memory.tbptt_frames"),
        (["data.ordered=true", "model.head.bidirectional=true"], "data.ordered"),
        (["parallel.precision=bf16", "parallel.mode=ddp"], "parallel.precision"),
        (["parallel.timeout_s=0"], "parallel.timeout_s"),
        (["data.train=pipe:cat shards/x.tar"], "data.manifest"),
        (["data.train=http://host/x.tar"], "data.manifest"),
        (["data.on_error=ignore"], "data.on_error"),
        (["data.length_buckets=2", "data.ordered=true"], "data.length_buckets"),
    ],
)
def test_cross_key_checks_fail_at_load_time(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"config key {key}=") as e:
        load_config(None, overrides)
    assert "\n" not in str(e.value)


def test_remote_shards_with_a_manifest_are_fine() -> None:
    cfg = load_config(None, ["data.train=pipe:cat x.tar", "data.manifest=index.json"])
    assert cfg.data.manifest == "index.json"


@pytest.mark.parametrize("name", ["configs/cholec-resnet50-lstm.yaml", "distseq/demo/demo.yaml"])
def test_the_shipped_configs_load(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(REPO / name, ["data.train=shards/train-000000.tar"])
    assert cfg.data.window > 1
    assert capsys.readouterr().err == ""  # no renamed key in them


def test_one_init_from_value_is_a_list_of_one(tmp_path: Path) -> None:
    # The manual writes train.init_from=RUN; it used to fail with OmegaConf's "AnyNode is not a
    # ListConfig".
    run, other = tmp_path / "run", tmp_path / "other"
    run.mkdir()
    other.mkdir()
    assert load_config(None, [f"train.init_from={run}"]).train.init_from == [str(run)]
    one = load_config(None, [f"train.init_from={run}:backbone"]).train.init_from
    assert one == [f"{run}:backbone"]
    both = load_config(None, [f"train.init_from=[{run},{other}:head]"]).train.init_from
    assert both == [str(run), f"{other}:head"]
    path = tmp_path / "c.yaml"
    path.write_text(f"train:\n  init_from: {run}\n")
    assert load_config(path).train.init_from == [str(run)]
    path.write_text(f"train:\n  init_from: [{run}, {other}]\n")
    assert load_config(path).train.init_from == [str(run), str(other)]
    # Empty is none, as for every other list: not the current directory.
    assert load_config(None, ["train.init_from="]).train.init_from == []


def test_every_key_has_its_meaning_and_the_manual_its_table() -> None:
    # config.keys is the one reference: it covers the schema, and the manual's page is made from
    # it at each build (docs/hooks.py), so it shows the table as made.
    keys = [key for key, _ in key_values()]
    assert len(keys) == len(set(keys)) > 60
    assert set(DOCS) == set(keys), set(DOCS) ^ set(keys)
    assert "<!-- distseq: config-keys -->" in (REPO / "docs/config.md").read_text()
    assert all(f"| `{key}` |" in reference_table() for key in keys)


def test_distseq_config_prints_every_key_and_a_resolved_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "--keys"]) == 0
    text = capsys.readouterr().out
    assert "data.window = 64\n    T, frames per training window;" in text
    assert "optim.lr = 0.001\n" in text and "`" not in text
    assert text.count("\n    ") >= len(DOCS)
    path = tmp_path / "c.yaml"
    path.write_text("data: {train: s/x.tar, window: 16}\n")
    assert main(["config", str(path), "optim.lr=0.5"]) == 0
    resolved = tmp_path / "run" / "config.yaml"  # a run folder's, as train writes it
    resolved.parent.mkdir()
    resolved.write_text(capsys.readouterr().out)
    again = load_config(resolved)
    assert (again.data.window, again.optim.lr, again.data.train) == (16, 0.5, "s/x.tar")
    assert main(["config", str(resolved.parent)]) == 0
    assert capsys.readouterr().out == resolved.read_text()
