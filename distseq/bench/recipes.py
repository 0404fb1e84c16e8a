"""``distseq bench recipes``: does end to end pay on my data? A config trained each way people
train long-video models, the same number of optimizer steps per training, over several seeds:

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
its config.yaml, metrics.jsonl and checkpoints, so any one can be reported or rerun alone. A
finished training leaves ``result.json``: run again, the bench reads those (refusing one made
with other options) and resumes the others from their last checkpoint (saved at every
validation; SIGTERM saves one at once). A recipe's steps and seconds are those of
all its trainings (three_stage's include stage 1, the features and stage 2); its scores are its
last training's final validation.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed
import matplotlib.pyplot as plt

from distseq.checkpoint.export import load_model
from distseq.config import (
    NOT_WITH_FEATURES,
    RNNS,
    Config,
    load_config,
    to_dict,
    to_yaml,
    with_absolute_paths,
)
from distseq.data.tar import expand, shard_name
from distseq.errors import ConfigError
from distseq.files import output_folder, write_atomic
from distseq.infer.features import write_features
from distseq.infer.predict import frame_sampling
from distseq.parallel import close_distributed, init_distributed
from distseq.score.metrics import SEGMENT_METRICS
from distseq.train.loop import train
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
SCORES = ("val_accuracy", "val_jaccard", *(f"val_{m}" for m in SEGMENT_METRICS))
# Stage 3's learning rates, as scales of the config's optim.lr (measured: docs/benchmarks.md,
# "Recipes"). configs/stages/3-end-to-end.yaml holds the same groups.
STAGE3 = ["optim.groups=[{prefix: backbone, lr_scale: 0.1}, {prefix: head, lr_scale: 0.1}]"]
# Frame accuracies closer than this tie whatever the seeds say: three seeds of 0.999 and 1.000
# make a standard error of 0, and a "win" by 0.001 that no user would rent GPUs for.
CLOSE = 0.01
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
    out: str
    json: bool


@dataclass
class Training:
    """One finished training (or the features): what its ``result.json`` holds."""

    name: str
    seconds: float  # wall time of all its legs, validations included
    steps: int
    scores: dict[str, float] = field(default_factory=dict)  # SCORES at its last validation
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, val_accuracy)
    made_with: str = ""  # SeedRuns.made_with


@dataclass
class Result:
    """One recipe on one seed."""

    recipe: str
    seed: int
    steps: int  # all its trainings'
    seconds: float  # all its trainings', the features included
    scores: dict[str, float]
    curve: list[tuple[int, float]]  # its last training's validations


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


def _in_folder(urls: str, folder: Path, key: str, split: str) -> str:
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
            return load_config(self.args.config, [*self.base, *self.overrides(name), *late, out])
        except ConfigError as e:
            raise ConfigError(f"bench recipes, the {name} training: {e}") from None

    def made_with(self, name: str) -> str:
        """What ``name`` is made from: its resolved config as ``train`` records it, or for the
        features, stage 1's."""
        if name == "features":
            return "the features of\n" + self.made_with("frames")
        return to_yaml(with_absolute_paths(self.config(name)))

    def get(self, name: str, stop: StopSignals) -> Training:
        if name not in self.done:
            made_with = self.made_with(name)
            self.done[name] = self._read(name, made_with) or self._make(name, made_with, stop)
        return self.done[name]

    def _read(self, name: str, made_with: str) -> Training | None:
        """The finished training, or None; one made from another config is refused (a rerun
        with other options, into the same --out, would otherwise mix old and new)."""
        out = self.root / name
        path, config = out / "result.json", out / "config.yaml"
        record = json.loads(path.read_text()) if path.is_file() else None
        found = record["made_with"] if record else config.is_file() and config.read_text()
        if found and found != made_with:
            raise ConfigError(
                f"bench recipes: {out} was made with other options than these: give another "
                "--out, or delete that folder to make it again"
            )
        if record is None:
            return None
        record["curve"] = [tuple(point) for point in record["curve"]]
        return Training(**record)

    def _make(self, name: str, made_with: str, stop: StopSignals) -> Training:
        out = self.root / name
        print(f"== seed {self.seed}: {name} -> {out}", file=sys.stderr, flush=True)
        # What a training or the features print goes to stderr with the bench's progress, so
        # that stdout holds the bench's results alone (--json: one record a line, pipeable).
        with contextlib.redirect_stdout(sys.stderr):
            return self._made(name, out, made_with, stop)

    def _made(self, name: str, out: Path, made_with: str, stop: StopSignals) -> Training:
        if name == "features":
            seconds = _timed(out, lambda: self._features(out))
            made = Training(name, seconds, 0, made_with=made_with)
        else:
            cfg = self.config(name)
            metrics: dict[str, float] = {}
            seconds = _timed(out, lambda: metrics.update(train(cfg, stop)))
            made = Training(
                name,
                seconds,
                cfg.train.steps,
                {key: metrics[key] for key in SCORES},
                _curve(out / "metrics.jsonl"),
                made_with,
            )
        write_atomic(out / "result.json", json.dumps(asdict(made)).encode())
        return made

    def _features(self, out: Path) -> None:
        loaded = load_model(self.root / "frames")
        inputs = [self.cfg.data.train, self.cfg.data.val]
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
    return Result(
        recipe,
        runs.seed,
        sum(t.steps for t in trainings),
        sum(t.seconds for t in trainings),
        last.scores,
        last.curve,  # three_stage's from step 0: the trainer validates a warm start there
    )


def check_recipes(args: RecipesBench) -> list[str]:
    """The recipes that apply to the config, each refusal said in one line, every training's
    config checked before any trains."""
    cfg = load_config(args.config, args.overrides)
    refusals = [
        (cfg.data.features, "data.features=true: the recipes train the CNN, give frame shards"),
        (not cfg.data.val, "data.val is empty: the recipes are compared on it"),
        (
            cfg.memory.tbptt_frames > 0,
            f"memory.tbptt_frames={cfg.memory.tbptt_frames} in the config: end_to_end would not "
            "be exact; the tbptt recipe takes --tbptt",
        ),
        (
            bool(cfg.train.init_from),
            "train.init_from in the config: the recipes start from the backbone's weights, and "
            "stage 3 from stages 1 and 2",
        ),
        (args.steps < 1 or args.eval_every < 1, "--steps and --eval-every must be >= 1"),
        (args.tbptt < 1, f"--tbptt {args.tbptt}: must be >= 1"),
        (not args.seeds or len(set(args.seeds)) < len(args.seeds), "--seeds: give each once"),
        (len(set(args.recipes)) < len(args.recipes), "--recipes: give each once"),
    ]
    for refused, why in refusals:
        if refused:
            raise ConfigError(f"bench recipes: {why}")
    unknown = [r for r in args.recipes if r not in RECIPES]
    if unknown:
        raise ConfigError(f"--recipes {' '.join(unknown)}: each must be one of {list(RECIPES)}")
    recipes = list(args.recipes)
    head = cfg.model.head
    if "tbptt" in recipes and (head.kind not in RNNS or head.bidirectional):
        what = "a bidirectional RNN" if head.bidirectional else f"model.head.kind={head.kind}"
        say(f"tbptt left out: {what} carries no state forward to truncate")
        recipes.remove("tbptt")
    if "tbptt" in recipes and 0 < cfg.data.window <= args.tbptt:
        say(f"tbptt: --tbptt {args.tbptt} >= data.window={cfg.data.window}: it is end_to_end")
    if not recipes:
        raise ConfigError("bench recipes: no recipe left to compare")
    runs = SeedRuns(args, args.seeds[0])
    for name in dict.fromkeys(n for r in recipes for n in TRAININGS[r] if n != "features"):
        runs.config(name, check=True)
    return recipes


def say(line: str) -> None:
    """Progress and notices go to stderr: with --json, stdout holds the records alone."""
    print(line, file=sys.stderr, flush=True)


@dataclass
class Row:
    """One recipe over the seeds: mean and std of each score, steps and seconds."""

    recipe: str
    seeds: int
    steps: int
    mean: dict[str, float]
    std: dict[str, float]  # 0 with one seed
    accuracy: dict[int, float]  # each seed's frame accuracy


def summarize(results: list[Result]) -> list[Row]:
    rows = []
    for recipe in dict.fromkeys(r.recipe for r in results):
        mine = [r for r in results if r.recipe == recipe]
        values = {key: [r.scores[key] for r in mine] for key in SCORES}
        values["seconds"] = [r.seconds for r in mine]
        rows.append(
            Row(
                recipe,
                len(mine),
                mine[0].steps,
                {k: statistics.fmean(v) for k, v in values.items()},
                {k: statistics.stdev(v) if len(v) > 1 else 0.0 for k, v in values.items()},
                {r.seed: r.scores["val_accuracy"] for r in mine},
            )
        )
    return rows


def table(rows: list[Row]) -> str:
    """A Markdown table: mean ± std over the seeds (the sample std; 0 for one seed)."""
    names = ["frame acc", "Jaccard", "edit", *(f"F1@{m[3:]}" for m in SEGMENT_METRICS[1:])]
    head = f"| recipe | seeds | steps | {' | '.join(names)} | train s |"
    lines = [head, "|---|---:|---:|" + "---:|" * (len(SCORES) + 1)]
    for row in rows:
        cells = [f"{row.mean[k]:.3f} ± {row.std[k]:.3f}" for k in SCORES]
        seconds = f"{row.mean['seconds']:.0f} ± {row.std['seconds']:.0f}"
        lines.append(
            f"| {row.recipe} | {row.seeds} | {row.steps} | {' | '.join(cells)} | {seconds} |"
        )
    return "\n".join(lines)


def advice(rows: list[Row]) -> str:
    """One line: the winner by frame accuracy against the runner-up, the gap weighed against its
    standard error over the seeds (sqrt(std_a^2 / n_a + std_b^2 / n_b)); a gap under CLOSE ties."""
    ranked = sorted(rows, key=lambda r: r.mean["val_accuracy"], reverse=True)
    best = ranked[0]
    acc = f"frame accuracy {best.mean['val_accuracy']:.3f}"
    if len(ranked) == 1:
        return f"{best.recipe}: {acc} (one recipe, nothing to compare)"
    second = ranked[1]
    gap = best.mean["val_accuracy"] - second.mean["val_accuracy"]
    against = f"{acc} against {second.recipe}'s {second.mean['val_accuracy']:.3f} (+{gap:.3f})"
    if gap < CLOSE:
        cheaper = min(ranked[:2], key=lambda r: r.mean["seconds"])
        return (
            f"{best.recipe} and {second.recipe} tie: {against} is less than {CLOSE} apart; "
            f"{cheaper.recipe} is the cheaper ({cheaper.mean['seconds']:.0f} s)"
        )
    if min(best.seeds, second.seeds) < 2:
        return f"{best.recipe} leads: {against}, on one seed: run more seeds to judge the gap"
    error = math.sqrt(
        best.std["val_accuracy"] ** 2 / best.seeds + second.std["val_accuracy"] ** 2 / second.seeds
    )
    seeds = [seed for seed in best.accuracy if seed in second.accuracy]
    ahead = sum(best.accuracy[seed] > second.accuracy[seed] for seed in seeds)
    if gap > 2 * error:
        return (
            f"{best.recipe} wins: {against}, more than twice the gap's standard error "
            f"({error:.3f}); ahead on {ahead} of {len(seeds)} seeds"
        )
    cheaper = min(ranked[:2], key=lambda r: r.mean["seconds"])
    return (
        f"{best.recipe} and {second.recipe} tie: {against} is within twice the gap's standard "
        f"error ({error:.3f}); {best.recipe} ahead on {ahead} of {len(seeds)} seeds; "
        f"{cheaper.recipe} is the cheaper ({cheaper.mean['seconds']:.0f} s)"
    )


def from_stage2(results: list[Result]) -> str:
    """three_stage on each seed: stage 2's accuracy, where stage 3 ended, and its lowest
    validation on the way (so a stage 3 that undoes stage 2 shows), or "" without it."""
    mine = [r for r in results if r.recipe == "three_stage"]
    seeds = [
        f"seed {r.seed} {r.curve[0][1]:.3f} -> {r.curve[-1][1]:.3f} "
        f"(lowest {min(a for _, a in r.curve):.3f})"
        for r in mine
    ]
    below = sum(r.curve[-1][1] < r.curve[0][1] for r in mine)
    ended = "ended below stage 2 on no seed" if not below else f"ENDED BELOW stage 2 on {below}"
    return f"three_stage from stage 2's accuracy: {'; '.join(seeds)}: {ended}" if mine else ""


def plot(results: list[Result], path: Path) -> None:
    """Validation frame accuracy against the last training's step, a line per recipe and seed."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {recipe: f"C{i}" for i, recipe in enumerate(RECIPES)}
    labelled = set()
    for r in results:
        steps, accuracy = zip(*r.curve, strict=True) if r.curve else ((), ())
        label = None if r.recipe in labelled else r.recipe
        labelled.add(r.recipe)
        ax.plot(steps, accuracy, color=colours[r.recipe], marker=".", alpha=0.8, label=label)
    ax.set(
        xlabel="step of the recipe's last training",
        ylabel="validation frame accuracy",
        title="recipes: a line per seed",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def bench_recipes(args: RecipesBench) -> list[Row]:
    out = output_folder(args.out)
    recipes = check_recipes(args)
    out.mkdir(parents=True, exist_ok=True)
    # SIGTERM or SIGUSR2 (a preemption, a time limit) stops the training under way with a
    # checkpoint and its time recorded; run again, the bench goes on from there.
    stop = StopSignals()
    results = []
    for seed in args.seeds:
        runs = SeedRuns(args, seed)
        for recipe in recipes:
            results.append(run_recipe(runs, recipe, stop))
            if args.json:
                print(json.dumps(asdict(results[-1])), flush=True)
    rows = summarize(results)
    text = "\n\n".join(line for line in (table(rows), advice(rows), from_stage2(results)) if line)
    text += "\n"
    write_atomic(out / "recipes.md", text.encode())
    write_atomic(out / "recipes.json", json.dumps([asdict(r) for r in results], indent=1).encode())
    plot(results, out / "recipes.png")
    if not args.json:
        print("\n" + text + f"\nwrote {out / 'recipes.md'}, recipes.json and recipes.png")
    return rows
