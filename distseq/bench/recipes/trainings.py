"""The trainings of ``distseq bench recipes`` (does end to end pay on my data?): a config trained
each way people train long-video models, the same number of optimizer steps per training, over
several seeds:

- ``per_frame``: the CNN alone (``model.head.kind=none``), stage 1 of the staged pipelines;
- ``tbptt``: the config's CNN and RNN with truncated BPTT (``memory.tbptt_frames=k``);
- ``two_stage``: ``per_frame``'s CNN, its features written once (``distseq features``), the head
  trained on them over whole videos (``data.features=true``, ``data.window=0``), the config's
  keys that features do not take set back to their defaults (``_FEATURE_RESETS``);
- ``three_stage``: end to end from ``per_frame``'s backbone and ``two_stage``'s head, under the
  stage-3 recipe (STAGE3, ``configs/stages/3-end-to-end.yaml``'s groups);
- ``end_to_end``: the config as it is: exact gradients through every frame of its windows
  (``data.window``) from the backbone's configured weights.

Every training is a plain ``distseq train`` run in a folder of its own (``OUT/seed-N/NAME``), with
its config.yaml, metrics.jsonl and checkpoints, so any one can be reported or rerun alone. Its
validations select its checkpoint (``train.select``); a later stage starts from the earlier
stages' selected checkpoints, and the features are those of stage 1's. A finished training
leaves ``result.json``: the selected checkpoint's step and scores on data.val and, given
``--test``, on the test split. Run again, the bench reads those (refusing one made with other
options) and resumes the others from their last checkpoint (saved at every validation; SIGTERM
saves one at once). A recipe's steps and seconds are those of all its trainings (three_stage's
include stage 1, the features and stage 2); its scores are its last training's.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from distseq.checkpoint.export import Loaded, load_model
from distseq.checkpoint.sharded import read_meta, resolve_checkpoint
from distseq.config import (
    NOT_WITH_FEATURES,
    Config,
    load_config,
    to_dict,
    to_yaml,
    with_absolute_paths,
)
from distseq.data.tar import expand, shard_name
from distseq.errors import ConfigError, TrainingError
from distseq.evaluate.judging import Judging, evaluate
from distseq.files import write_atomic
from distseq.infer.features import write_features
from distseq.infer.predict import frame_sampling
from distseq.launch.slurm import SlurmOptions
from distseq.parallel import close_distributed, init_distributed
from distseq.score.metrics import SEGMENT_METRICS
from distseq.score.validate import validation_scores
from distseq.train.loop import train
from distseq.train.select import Selection
from distseq.train.signals import StopSignals

RECIPES = ("per_frame", "tbptt", "two_stage", "three_stage", "end_to_end")
# Each recipe's trainings, in order; "features" is the features of the first, written once.
TRAININGS = {
    "per_frame": ("frames",),
    "tbptt": ("tbptt",),
    "two_stage": ("frames", "features", "head"),
    "three_stage": ("frames", "features", "head", "stage3"),
    "end_to_end": ("end_to_end",),
}
# What the bench reports of a checkpoint on a split: validation's val_<name> of these names.
SCORES = ("accuracy", "jaccard", *SEGMENT_METRICS)
# Stage 3's learning rates, as scales of the config's optim.lr (measured: docs/benchmarks.md,
# "Recipes"). configs/stages/3-end-to-end.yaml holds the same groups.
STAGE3 = ["optim.groups=[{prefix: backbone, lr_scale: 0.1}, {prefix: head, lr_scale: 0.1}]"]
# Head options that only some kinds take: reset for the per-frame CNN, which has no head.
_KIND_OPTIONS = ("bidirectional", "causal", "stages", "span", "attention_heads", "chrono_frames")
# Keys of the user's config that the head on features does not take (those refused with
# data.features; features are written at the frames' stride, once, and read whole) and that
# stages 1 and 2 train without (one learning rate): set back to their defaults there.
_FEATURE_RESETS = (
    *NOT_WITH_FEATURES,
    "data.frame_stride",
    "data.length_buckets",
    "data.manifest",
    "data.ordered",
    "optim.groups",
)


@dataclass(frozen=True)
class RecipesBench:
    """One ``bench recipes`` run: its options, as the command line gives them."""

    config: str
    overrides: list[str]
    steps: int  # optimizer steps of every training
    seeds: list[int]
    tbptt: int  # k of the tbptt recipe
    eval_every: int  # steps between validations (and checkpoints)
    recipes: list[str]
    stage2: list[str]  # overrides of two_stage's head training
    stage3: list[str]  # overrides of three_stage's last training, after STAGE3's
    test: str  # shards the selected checkpoints are scored on ("": data.val's scores reported)
    out: str
    json: bool
    slurm: SlurmOptions | None = None  # each training a SLURM job (recipes/slurm.py)


@dataclass
class Training:
    """One finished training (or the features): what its ``result.json`` holds."""

    name: str
    seconds: float  # wall time of all its legs, validations included
    steps: int
    selected: int = -1  # the step of the checkpoint its validations selected (train.select)
    val: dict[str, float] = field(default_factory=dict)  # SCORES of it on data.val
    test: dict[str, float] = field(default_factory=dict)  # SCORES of it on --test; {} without
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, val accuracy)
    made_with: str = ""  # SeedRuns.made_with
    tested_on: str = ""  # the --test shards ``test`` is of


_RECORD = {f.name for f in fields(Training)}  # a result.json's keys


@dataclass
class Result:
    """One recipe on one seed: its last training's selected checkpoint."""

    recipe: str
    seed: int
    steps: int  # all its trainings'
    seconds: float  # all its trainings', the features included
    selected: int
    val: dict[str, float]
    test: dict[str, float]
    curve: list[tuple[int, float]]  # its last training's validations
    stage2: dict[str, float]  # three_stage's: its stage 2's reported scores; {} for the others

    @property
    def reported(self) -> dict[str, float]:
        """The scores the table shows: on the test split where there is one."""
        return self.test or self.val


def defaults_of(cfg: Config, keys: tuple[str, ...]) -> list[str]:
    """``key=default`` overrides for those of ``keys`` (dotted) where ``cfg`` differs."""
    given, default = to_dict(cfg), to_dict(Config())
    out = []
    for key in keys:
        mine, theirs = given, default
        for part in key.split("."):
            mine, theirs = mine[part], theirs[part]
        if mine != theirs:
            out.append(f"{key}={json.dumps(theirs)}")
    return out


def per_frame_overrides(cfg: Config) -> list[str]:
    """The per-frame CNN of ``cfg``: no temporal head, the options of its head kind reset."""
    head = tuple(f"model.head.{key}" for key in _KIND_OPTIONS)
    return ["model.head.kind=none", *defaults_of(cfg, (*head, "optim.groups"))]


def _in_folder(urls: str, folder: Path, key: str, split: str = "") -> str:
    """``urls``' shards by name in ``folder`` (where ``distseq features`` wrote them)."""
    return "::".join(str(folder / shard_name(url)) for url in expand(urls, key, split))


class SeedRuns:
    """The trainings of one seed under ``OUT/seed-N``, each made once and then read back."""

    def __init__(self, args: RecipesBench, seed: int) -> None:
        self.args, self.seed = args, seed
        self.root = Path(args.out) / f"seed-{seed}"
        self.base = [
            *args.overrides,
            f"train.seed={seed}",
            f"train.steps={args.steps}",
            f"train.eval_every={args.eval_every}",
            f"train.save_every={args.eval_every}",
            "train.stop_after=0",  # each training to its end: result.json says it is done
        ]
        self.cfg = load_config(args.config, self.base)
        self.done: dict[str, Training] = {}

    def overrides(self, name: str) -> list[str]:
        """What ``name``'s training adds to the config: its ``distseq train`` overrides."""
        if name == "frames":
            return per_frame_overrides(self.cfg)
        if name == "tbptt":
            return [f"memory.tbptt_frames={self.args.tbptt}"]
        if name == "head":
            features = self.root / "features"
            data = self.cfg.data
            return [
                f"data.train={_in_folder(data.train, features, 'data.train', 'train')}",
                f"data.val={_in_folder(data.val, features, 'data.val', 'val')}",
                "data.features=true",
                "data.window=0",
                *defaults_of(self.cfg, _FEATURE_RESETS),
                *self.args.stage2,
            ]
        if name == "stage3":
            init = f"['{self.root / 'frames'}:backbone','{self.root / 'head'}']"
            return [f"train.init_from={init}", *STAGE3, *self.args.stage3]
        return []  # end_to_end: the config as it is

    def config(self, name: str, check: bool = False) -> Config:
        """``name``'s training config; ``check``: before stages 1 and 2 exist (stage 3 starts
        from nothing then), to refuse a config that would fail later, before any training."""
        late = ["train.init_from=[]"] if check and name == "stage3" else []
        out = f"train.out_dir={self.root / name}"
        try:
            cfg = load_config(self.args.config, [*self.base, *self.overrides(name), *late, out])
            if check and cfg.train.select:  # else refused only as the training starts
                Selection.of(cfg.train.select, cfg.train.patience)
            return cfg
        except ConfigError as e:
            raise ConfigError(f"bench recipes, the {name} training: {e}") from None

    def made_with(self, name: str) -> str:
        """What ``name`` is made from: its resolved config as ``train`` records it, or for the
        features, stage 1's."""
        if name == "features":
            return "the features of\n" + self.made_with("frames")
        return to_yaml(with_absolute_paths(self.config(name)))

    def get(self, name: str, stop: StopSignals) -> Training:
        """``name``'s training, made or read back, and scored on the bench's --test (again,
        where it was scored on another: the checkpoints stay)."""
        if name not in self.done:
            made_with = self.made_with(name)
            made = self._read(name, made_with) or self._make(name, made_with, stop)
            if made.tested_on != self.args.test:
                made = self._tested(made)
            self.done[name] = made
        return self.done[name]

    def finished(self, name: str) -> bool:
        """Whether ``name``'s training is done and scored on this bench's --test (its config is
        read only then: stage 3's names stages 1 and 2, which may not be there yet)."""
        if not (self.root / name / "result.json").is_file():
            return False
        made = self._read(name, self.made_with(name))
        return made is not None and made.tested_on == self.args.test

    def _read(self, name: str, made_with: str) -> Training | None:
        """The finished training, or None; one made from another config is refused (a rerun
        with other options, into the same --out, would otherwise mix old and new)."""
        out = self.root / name
        path, config = out / "result.json", out / "config.yaml"
        record = json.loads(path.read_text()) if path.is_file() else None
        found = record["made_with"] if record else config.is_file() and config.read_text()
        if (found and found != made_with) or (record and set(record) != _RECORD):
            raise ConfigError(
                f"bench recipes: {out} was made with other options than these, or by another "
                "distseq: give another --out, or delete that folder to make it again"
            )
        if record is None:
            return None
        record["curve"] = [tuple(point) for point in record["curve"]]
        return Training(**record)

    def _make(self, name: str, made_with: str, stop: StopSignals) -> Training:
        out = self.root / name
        if self.args.slurm is not None:  # never on the login node: its job makes it
            raise TrainingError(
                f"bench recipes --slurm: {out} is not done though its job ended: run the same "
                "command again"
            )
        say(f"== seed {self.seed}: {name} -> {out}")
        # What a training or the features print goes to stderr with the bench's progress, so
        # that stdout holds the bench's results alone (--json: one record a line, pipeable).
        with contextlib.redirect_stdout(sys.stderr):
            if name == "features":
                seconds = _timed(out, lambda: self._features(out))
                made = Training(name, seconds, 0, made_with=made_with, tested_on=self.args.test)
                return self._record(made)
            cfg = self.config(name)
            seconds = _timed(out, lambda: train(cfg, stop))
        meta = read_meta(resolve_checkpoint(out))  # the checkpoint its validations selected
        scores = meta["metrics"]  # the step's, its validation's among them
        return self._record(
            Training(
                name,
                seconds,
                cfg.train.steps,
                meta["position"]["step"],
                {key: scores[f"val_{key}"] for key in SCORES},
                curve=_curve(out / "metrics.jsonl"),
                made_with=made_with,
            )
        )

    def _tested(self, made: Training) -> Training:
        """``made`` scored on the bench's --test: the features written for its shards too, a
        training's selected checkpoint judged as ``distseq eval`` judges it."""
        out, made.test, made.tested_on = self.root / made.name, {}, self.args.test
        with contextlib.redirect_stdout(sys.stderr):
            if made.name == "features" and self.args.test:
                self._features(out)  # the test split's shards; those written before are kept
            elif self.args.test:
                made.test = self._test_scores(load_model(out), self.test_split(made.name), out)
        return self._record(made)

    def _record(self, made: Training) -> Training:
        write_atomic(self.root / made.name / "result.json", json.dumps(asdict(made)).encode())
        return made

    def test_split(self, name: str) -> str:
        """The shards ``name``'s training is scored on: the test split's, or for the head on
        features, their features."""
        features = self.root / "features"
        return _in_folder(self.args.test, features, "--test") if name == "head" else self.args.test

    def _test_scores(self, loaded: Loaded, split: str, out: Path) -> dict[str, float]:
        info = init_distributed()
        try:
            report = evaluate(loaded, split, "", Judging(), None, out / "test", info)
        finally:
            close_distributed()
        scores = validation_scores(report)
        return {key: scores[f"val_{key}"] for key in SCORES}

    def _features(self, out: Path) -> None:
        """Stage 1's selected CNN's features of every split the bench trains, selects and
        scores on (a shard written before is kept)."""
        loaded = load_model(self.root / "frames")
        data = self.cfg.data
        inputs = [data.train, data.val, *([self.args.test] if self.args.test else [])]
        info = init_distributed()
        try:
            write_features(
                loaded, inputs, frame_sampling(loaded), self.cfg.memory.chunk_frames, out, info
            )
        finally:
            close_distributed()


def _timed(out: Path, work: Callable[[], object]) -> float:
    """The wall time of ``work`` and of the legs before it that stopped (``legs.json``: a leg is
    recorded however it ends, SIGTERM included, but for SIGKILL)."""
    legs = out / "legs.json"
    before = json.loads(legs.read_text()) if legs.is_file() else []
    start = time.perf_counter()
    try:
        work()
    finally:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(legs, json.dumps([*before, time.perf_counter() - start]).encode())
    return sum(before) + time.perf_counter() - start


def _curve(metrics: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [(int(r["step"]), float(r["val_accuracy"])) for r in records if "val_accuracy" in r]


def run_recipe(runs: SeedRuns, recipe: str, stop: StopSignals) -> Result:
    trainings = [runs.get(name, stop) for name in TRAININGS[recipe]]
    last = trainings[-1]
    stage2 = (trainings[-2].test or trainings[-2].val) if recipe == "three_stage" else {}
    return Result(
        recipe,
        runs.seed,
        sum(t.steps for t in trainings),
        sum(t.seconds for t in trainings),
        last.selected,
        last.val,
        last.test,
        last.curve,  # three_stage's from step 0: the trainer validates a warm start there
        stage2,
    )


def say(line: str) -> None:
    """Progress and notices go to stderr: with --json, stdout holds the records alone."""
    print(line, file=sys.stderr, flush=True)
