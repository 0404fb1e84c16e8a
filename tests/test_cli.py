"""The command line as users run it: config errors, a run's own config, the options."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from conftest import run_distseq as distseq
from conftest import tiny_config
from distseq import __version__
from distseq.cli import commands, main, parse
from streams import N_TRAIN, sequences_of


@pytest.mark.parametrize(
    "override,key",
    [
        ("memory.chunk_size=4", "memory.chunk_size"),  # unknown key
        ("data.window=many", "data.window"),  # wrong type
        ("memory.chunk_frames=0", "memory.chunk_frames"),  # out of range
        ("memory.recompute=fsdp1", "memory.recompute"),  # not a choice
        ("model.backbone.name=resnet7", "model.backbone.name"),
        ("model.backbone.weights=/nonexistent.pth", "model.backbone.weights"),
        ("data.train=", "data.train"),  # no shards at all
        ("data.length_buckets=2 data.ordered=true", "data.length_buckets"),  # keys that clash
        ("memory.budget=40", "memory.budget"),  # no unit
        ("memory.budget=1GB memory.recompute=none", "memory.budget"),
        ("memory.budget=1GB memory.keep_frames=8", "memory.keep_frames"),
        ("memory.budget=0.5", "memory.budget"),  # a fraction of a GPU, on the CPU
        ("memory.budget=200KB", "memory.budget"),  # below the floor: found by the probe
        ("parallel.sequence=0", "parallel.sequence"),
        ("parallel.sequence=2", "parallel.sequence"),  # one process: S does not divide it
    ],
)
def test_config_errors_name_the_key_and_exit_2(
    override: str, key: str, tmp_path: Path, shards: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # In this process, as `distseq train` runs it (a subprocess each cost 5-11 s of torch's
    # start-up); test_missing_config_file runs the real command and reads its exit status.
    code = main(["train", str(tiny_config(tmp_path, shards)), *override.split()])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], err


@pytest.mark.slow
def test_a_budget_plans_the_run_and_says_how(tmp_path: Path, shards: Path) -> None:
    config = str(tiny_config(tmp_path, shards))
    argv = ["memory.budget=1GB", "memory.offload=frames", "data.val="]
    proc = distseq("train", config, *argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 2 sequences of 8 frames at 32 px, 3 bytes a pixel
    assert "memory.offload=frames: up to 0.0492 MB of frames in host memory" in proc.stdout
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("memory plan: ")]
    # 1 GB is far more than plain autograd needs for 8 frames: nothing is recomputed.
    assert line.startswith("memory plan: T=8 chunk=") and "recompute 0% of forward" in line, line
    assert "USDT" not in proc.stderr  # the profiler's native chatter during the probe


@pytest.mark.slow
def test_whole_videos_of_frames_are_planned_for_the_longest(tmp_path: Path, shards: Path) -> None:
    config = str(tiny_config(tmp_path, shards))
    argv = ["data.window=0", "memory.budget=1GB", "data.val=", "train.steps=1"]
    proc = distseq("train", config, *argv, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    longest = max(len(labels) for _, labels in sequences_of("train", N_TRAIN).values())
    said = f"memory plan: data.window=0, whole videos: the longest training video is {longest} "
    assert said in proc.stdout, proc.stdout
    assert f"memory plan: T={longest} chunk=" in proc.stdout, proc.stdout
    # A budget that a whole video does not fit in says what the video needs, in one line (300
    # KB: above tiny_cnn's parameters and AdamW state, 0.1 MB, below a 14-frame step's 0.53 MB).
    argv += ["memory.budget=300KB", f"train.out_dir={tmp_path / 'small'}"]
    small = distseq("train", config, *argv, cwd=tmp_path)
    assert small.returncode == 2, small.stderr[-3000:]
    (line,) = small.stderr.strip().splitlines()
    assert f"that T={longest} needs with every chunk" in line, line


@pytest.mark.slow
def test_missing_config_file(tmp_path: Path) -> None:
    proc = distseq("train", str(tmp_path / "nope.yaml"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "nope.yaml" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_run_trains_again_from_its_own_config(tmp_path: Path, shards: Path) -> None:
    # As a user would: switch validation off with an empty value, then rerun the run's config.
    proc = distseq("train", str(tiny_config(tmp_path, shards)), "data.val=", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = tmp_path / "run" / "config.yaml"
    assert "on_error: raise\n" in saved.read_text() and "  val: ''\n" in saved.read_text()
    again = distseq("train", str(saved), "train.steps=4", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from" in again.stderr and "at step 3" in again.stderr
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step_00000004\n"


@pytest.mark.slow
def test_a_shard_folder_is_its_splits(tmp_path: Path, shards: Path) -> None:
    # data.train and data.val name the folder distseq shard wrote; its index.json splits it:
    # the run is the one on the config's brace patterns, validation included.
    records = []
    for data in ([], [f"data.train={shards}", f"data.val={shards}"]):
        out = f"train.out_dir={tmp_path / str(len(data))}"
        argv = [str(tiny_config(tmp_path, shards)), *data, "train.steps=1", out]
        proc = distseq("train", *argv, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = (tmp_path / str(len(data)) / "metrics.jsonl").read_text().splitlines()
        records.append([json.loads(line) for line in lines])
    assert "val_accuracy" in records[0][-1]
    timing = {"frames_per_s", "step_seconds", "data_wait_fraction"}
    for ours, theirs in zip(*records, strict=True):
        assert {k: v for k, v in ours.items() if k not in timing} == {
            k: v for k, v in theirs.items() if k not in timing
        }


@pytest.mark.slow
def test_an_error_during_training_stands_on_its_own_line(tmp_path: Path, shards: Path) -> None:
    # A val shard that index.json does not list fails at the first validation, bar open.
    unlisted = tmp_path / "val-000099.tar"
    unlisted.write_bytes((shards / "val-000000.tar").read_bytes())
    config = str(tiny_config(tmp_path, shards))
    proc = distseq(
        "train", config, f"data.val={unlisted}", f"data.manifest={shards}/index.json", cwd=tmp_path
    )
    assert proc.returncode == 1
    assert "train: 100%" in proc.stderr  # the bar was drawn
    errors = [line for line in proc.stderr.split("\n") if "distseq: error" in line]
    assert errors == [f"distseq: error: val shard {unlisted} is not listed in index.json"]


@pytest.mark.slow
def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"distseq {__version__}\n"


@pytest.mark.parametrize(
    "argv",
    [
        # The README's SLURM line: overrides after the options.
        ["submit", "c.yaml", "--nodes", "4", "--partition", "gpu", "a=1", "b=2"],
        ["submit", "c.yaml", "a=1", "--dry-run", "b=2"],
        ["train", "c.yaml", "a=1", "b=2"],
        ["config", "c.yaml", "--keys", "a=1", "b=2"],
        ["demo", "a=1", "--out", "demo", "b=2"],
        ["bench", "recipes", "c.yaml", "a=1", "--steps", "3", "b=2"],
    ],
)
def test_overrides_come_before_or_after_the_options(argv: list[str]) -> None:
    assert parse(argv).overrides == ["a=1", "b=2"]


@pytest.mark.parametrize(
    "argv,unknown",
    [
        (["train", "c.yaml", "a=1", "--nodes", "4", "b=2"], "--nodes"),
        # The issue's: the overrides before it, and its value, were named with it.
        (["train", "c.yaml", "data.train=shards/", "--bogus-option", "3"], "--bogus-option"),
        (
            ["bench", "recipes", "c.yaml", "--bogus=-1", "--bogus-too", "-1", "a=1"],
            "--bogus --bogus-too",
        ),
        (["bench", "traffic", "--sizes", "32"], "--sizes"),  # a command without overrides
    ],
)
def test_an_unknown_option_is_named_alone(
    argv: list[str], unknown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    assert stop.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == f"distseq: error: unrecognized option: {unknown}"
    )


def test_every_help_shows_its_defaults_and_no_markup() -> None:
    parsers = commands()
    assert {"distseq shard", "distseq bench data", "distseq train"} <= set(parsers)
    for name, parser in parsers.items():
        text = parser.format_help()
        assert "``" not in text and ":class:" not in text, name
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            default = action.default
            if default is None or default is False or default in ("", [], argparse.SUPPRESS):
                continue
            # argparse shows no default for an option without help text.
            help_text = parser._get_formatter()._expand_help(action) if action.help else ""
            assert "default" in help_text, (name, action.option_strings, help_text)
    shard = " ".join(parsers["distseq shard"].format_help().split())
    assert "output frame rate (default: 1)" in shard and "(default: 224)" in shard
    assert "seed of the train/val split (default: 0)" in shard  # 0 is a default worth saying
    submit = " ".join(parsers["distseq submit"].format_help().split())
    assert "%j is the job id" in submit and "%%" not in submit  # help text as written


def test_an_option_name_means_one_thing() -> None:
    # The same option in two commands takes the same number of values in the same way.
    kinds: dict[str, set[tuple[object, str]]] = {}
    for parser in commands().values():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for option in action.option_strings:
                kinds.setdefault(option, set()).add((action.nargs, type(action).__name__))
    assert not {o: k for o, k in kinds.items() if len(k) > 1}


@pytest.mark.parametrize(
    "argv,new,value",
    [
        (["bench", "traffic", "--chunks", "1", "4"], "--chunks-per-sequence", ("chunks", [1, 4])),
        (["bench", "gpu", "--frames", "64"], "--length", ("frames", 64)),
        (["bench", "data", "--workers", "1"], "--num-workers", ("workers", [1])),
        (["bench", "heads", "--classes", "4"], "--num-classes", ("classes", 4)),
        (["shard", "in", "--out", "o", "--window", "32"], "--sample-frames", ("sample_frames", 32)),
    ],
)
def test_an_old_spelling_reads_as_the_new_one_with_a_notice(
    argv: list[str], new: str, value: tuple[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    assert getattr(parse(argv), value[0]) == value[1]
    command = "distseq " + " ".join(argv[: 2 if argv[0] == "bench" else 1])
    old = next(
        a for a in argv if a in ("--chunks", "--frames", "--workers", "--classes", "--window")
    )
    assert capsys.readouterr().err == f"{command}: {old} is now {new}\n"


@pytest.mark.parametrize(
    "argv,old,new",
    [
        (
            ["shard", "in", "--out", "o", "--window", "10", "--sample-frames", "20"],
            "--window",
            "--sample-frames",
        ),
        (["bench", "heads", "--classes", "3", "--num-classes", "5"], "--classes", "--num-classes"),
        # The new first, at its default: a value cannot tell that it was given.
        (["bench", "heads", "--num-classes", "19", "--classes", "3"], "--classes", "--num-classes"),
        (
            ["bench", "traffic", "--chunks-per-sequence", "2", "--chunks", "4"],
            "--chunks",
            "--chunks-per-sequence",
        ),
    ],
)
def test_an_option_given_by_its_old_and_new_names_is_refused(
    argv: list[str], old: str, new: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """As config keys are (config.load): one of the two values would be taken silently."""
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    assert stop.value.code == 2
    command = "distseq " + " ".join(argv[: 2 if argv[0] == "bench" else 1])
    said = capsys.readouterr().err.splitlines()[-1]
    assert said == f"{command}: error: {old} and {new} are one option: give only {new}"


def test_an_option_s_value_is_shown_under_its_own_name() -> None:
    """``--num-classes CLASSES`` in the help named the value by the old option."""
    for name, parser in commands().items():
        for action in parser._actions:
            hidden = action.help == argparse.SUPPRESS or action.metavar is not None  # or chosen
            if hidden or action.nargs == 0 or not action.option_strings:
                continue
            options = [o.lstrip("-").replace("-", "_").upper() for o in action.option_strings]
            assert action.dest.upper() in options, (name, action.option_strings, action.dest)


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "RUN", "video.mp4"],
        ["features", "RUN", "video.mp4"],
        ["eval", "RUN"],
        ["report", "RUN"],
        ["shard", "videos/", "--labels", "labels/"],
        ["demo"],
        ["bench", "compare"],
        ["bench", "gpu"],
        ["bench", "recipes", "config.yaml"],
    ],
)
@pytest.mark.parametrize("where", ["taken", "taken/below"])
def test_an_out_folder_that_names_a_file_is_one_line(
    argv: list[str], where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` at a file, or below one: mkdir's FileExistsError was a traceback. Refused before
    the model or the inputs are read (here they do not exist)."""
    (tmp_path / "taken").write_text("a file")
    out = tmp_path / where
    assert main([*argv, "--out", str(out)]) == 2
    names = "it is" if where == "taken" else f"{tmp_path / 'taken'} is"
    assert capsys.readouterr().err == (
        f"distseq: error: --out {out}: {names} a file, not a folder; give a folder\n"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "{model}", "video.mp4", "--out", "p"],
        ["features", "{model}", "video.mp4", "--out", "f"],
        ["eval", "{model}"],
        ["export", "{model}", "--out", "m.pt"],
        ["report", "{model}"],
    ],
)
@pytest.mark.parametrize("model", ["runs/typo", "model.pt"])
def test_a_missing_model_exits_2_naming_it(
    argv: list[str], model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing file is a bad argument, exit 2 (docs/cli.md); it exited 1, as a broken run."""
    path = tmp_path / model
    assert main([a.format(model=path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"distseq: error: {path}: no such ") and err.count("\n") == 1, err
