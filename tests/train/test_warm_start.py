"""``train.init_from``: a new run starts from an earlier run's tensors, by key, never over a
resume; a shape that differs is refused, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from distseq.checkpoint.export import export
from distseq.config import load_config
from distseq.errors import ConfigError
from distseq.model.video import build_model
from distseq.train.loop import train
from distseq.train.warm_start import warm_start


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory, shards: Path) -> Path:
    """A 2-step run and its exported model.pt."""
    root = tmp_path_factory.mktemp("earlier")
    train(load_config(tiny_config(root, shards), ["train.steps=2"]))
    export(root / "run", root / "model.pt")
    return root / "model.pt"


@pytest.mark.slow
def test_every_tensor_of_the_source_is_loaded(earlier: Path, shards: Path, tmp_path: Path) -> None:
    cfg = load_config(tiny_config(tmp_path, shards))
    torch.manual_seed(1)  # not the earlier run's initialisation
    model = build_model(cfg.model, 3)
    said: list[str] = []
    for source in (earlier, earlier.parent / "run"):  # an exported file, a run directory
        warm_start(model, [str(source)], said.append)
        want = torch.load(earlier, weights_only=True)["model"]
        got = model.state_dict()
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)
    head = f"train.init_from {earlier} (exported at step 2): loaded {len(want)} tensors: backbone."
    assert said[0].startswith(head)
    assert said[0].endswith("; not in it: nothing")


def test_a_shape_that_differs_is_refused_naming_the_key(
    earlier: Path, shards: Path, tmp_path: Path
) -> None:
    cfg = load_config(tiny_config(tmp_path, shards), ["model.head.hidden=8"])
    with pytest.raises(ConfigError, match=r"init_from .*model\.pt: head\.rnn\.\S+ has shape"):
        warm_start(build_model(cfg.model, 3), [str(earlier)], print)


def test_a_source_that_gives_the_model_no_tensor_is_refused(earlier: Path) -> None:
    # It printed "loaded 0 tensors" and trained from scratch, with exit 0.
    with pytest.raises(ConfigError) as e:
        warm_start(torch.nn.Linear(2, 3), [str(earlier)], print)
    assert str(e.value).startswith(f"train.init_from {earlier}: this model takes none of its ")
    assert str(e.value).endswith("; the model's own are bias (1), weight (1)")


@pytest.mark.slow
def test_a_new_run_starts_from_it_and_a_resume_does_not(
    earlier: Path, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tiny_config(tmp_path, shards)
    train(load_config(config, ["train.steps=1", f"train.init_from=[{earlier}]"]))
    assert f"train.init_from {earlier} (exported at step 2): loaded" in capsys.readouterr().out
    train(load_config(config, ["train.steps=2", f"train.init_from=[{earlier}]"]))
    out = capsys.readouterr().out
    assert "train.init_from not loaded: resuming from" in out and "loaded 1" not in out
    with pytest.raises(ConfigError, match=r"train.init_from='.*nothing.pt': does not exist"):
        load_config(config, [f"train.init_from=[{tmp_path / 'nothing.pt'}]"])
