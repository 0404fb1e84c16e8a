"""``distseq bench recipes``: its options checked before any training, every recipe on every
seed (here one after another, or each training a SLURM job: ``slurm.py``), then the report."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

from distseq.bench.recipes.report import (
    advice,
    from_stage2,
    heading,
    plot,
    split_of,
    summarize,
    table,
)
from distseq.bench.recipes.slurm import run_on_slurm
from distseq.bench.recipes.trainings import (
    RECIPES,
    TRAININGS,
    RecipesBench,
    Result,
    SeedRuns,
    run_recipe,
    say,
)
from distseq.config import RNNS, Config, load_config
from distseq.data.manifest import find_manifest
from distseq.data.tar import check_shards_exist, expand, local_path, shard_name
from distseq.errors import ConfigError, DataError
from distseq.files import output_folder, write_atomic
from distseq.train.signals import StopSignals


def checked(args: RecipesBench) -> RecipesBench:
    """``args`` with the recipes that apply to the config, its paths absolute and --test as the
    shards it names; each refusal said in one line, every training's config checked before any
    trains."""
    cfg = load_config(args.config, args.overrides)
    if args.test:  # first: the trainings are run before the test split is read
        existing(args.test, "--test", "test")
    refusals = [
        (cfg.data.features, "data.features=true: the recipes train the CNN, give frame shards"),
        (not cfg.data.val, "data.val is empty: the recipes select each checkpoint on it"),
        (
            not cfg.train.select,
            "train.select is empty: the recipes are compared at the checkpoint their "
            "validations select",
        ),
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
    existing(cfg.data.train, "data.train", "train")
    existing(cfg.data.val, "data.val", "val")  # else found missing at the first validation
    # Absolute, for people and for the records. A SLURM job starts in this folder (sbatch's
    # default), where relative paths among the overrides mean what they mean here.
    args = replace(
        args,
        config=str(Path(args.config).resolve()),
        out=str(Path(args.out).resolve()),
        recipes=recipes,
        test=held_out_shards(args.test, cfg),
    )
    runs = SeedRuns(args, args.seeds[0])
    for name in dict.fromkeys(n for r in recipes for n in TRAININGS[r] if n != "features"):
        runs.config(name, check=True)
    return args


def held_out_shards(test: str, cfg: Config) -> str:
    """--test's shards, ``::``-joined (a folder: its test split), refused where one is also a
    training or validation shard, or its classes are not the config's."""
    if not test:
        return ""
    shards = expand(test, "--test", "test")
    splits = {"data.train": (cfg.data.train, "train"), "data.val": (cfg.data.val, "val")}
    seen = {
        canonical(url): key
        for key, (urls, split) in splits.items()
        for url in expand(urls, key, split)
    }
    names = {shard_name(url): key for url, key in seen.items()}
    for url in shards:
        if canonical(url) in seen:
            raise ConfigError(
                f"--test: {url} is also in {seen[canonical(url)]}: score on shards that no "
                "training or selection saw"
            )
        if shard_name(url) in names:  # features are written, and found, by their shard's name
            raise ConfigError(
                f"--test: {url} has the name of a shard of {names[shard_name(url)]}: give the "
                "test shards names of their own"
            )
    given = find_manifest(test, "", "--test")
    theirs = find_manifest(cfg.data.val, cfg.data.manifest, "data.val")
    if given.classes != theirs.classes:
        raise ConfigError(
            f"--test: its classes {given.classes} ({given.path}) are not data.val's "
            f"{theirs.classes}"
        )
    return "::".join(str(canonical(url)) for url in shards)


def existing(urls: str, key: str, split: str) -> None:
    """Refuse shards ``urls`` (config key or option ``key``) where a local one is missing: a
    training's stream finds it only when it reads it, after hours of work for the test split."""
    try:
        check_shards_exist(expand(urls, key, split))
    except DataError as e:
        raise ConfigError(f"{key}: {e}") from None


def canonical(url: str) -> str:
    """A shard's one name: a local file's resolved path, else its URL."""
    path = local_path(url)
    return url if path is None else str(path.resolve())


def bench_recipes(args: RecipesBench) -> list[Result]:
    out = output_folder(args.out)
    args = checked(args)
    out.mkdir(parents=True, exist_ok=True)
    if args.slurm is not None:
        run_on_slurm(args, args.slurm)  # returns once every training is done
    # SIGTERM or SIGUSR2 (a preemption, a time limit) stops the training under way with a
    # checkpoint and its time recorded; run again, the bench goes on from there. After the
    # SLURM jobs, every training is read back.
    stop = StopSignals()
    results = []
    for seed in args.seeds:
        runs = SeedRuns(args, seed)
        for recipe in args.recipes:
            results.append(run_recipe(runs, recipe, stop))
            if args.json:
                print(json.dumps(asdict(results[-1])), flush=True)
    report(args, results, out)
    return results


def report(args: RecipesBench, results: list[Result], out: Path) -> None:
    """recipes.md (the table, the advice, stage 3 against stage 2), recipes.json, recipes.png."""
    rows, split = summarize(results), split_of(results)
    select = load_config(args.config, args.overrides).train.select
    parts = [
        heading(split, select, args.test),
        table(rows, split),
        advice(rows, split),
        from_stage2(results, split),
    ]
    text = "\n\n".join(part for part in parts if part) + "\n"
    write_atomic(out / "recipes.md", text.encode())
    write_atomic(out / "recipes.json", json.dumps([asdict(r) for r in results], indent=1).encode())
    plot(results, out / "recipes.png")
    if not args.json:
        print("\n" + text + f"\nwrote {out / 'recipes.md'}, recipes.json and recipes.png")
