"""``bench recipes``' results for people: a table over the seeds, a line of advice, stage 3
against the stage 2 it started from, and the validation curves as a picture. Every number says
which split it is from: the checkpoints are selected on data.val and, given ``--test``, scored
on a split that no choice saw."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed
import matplotlib.pyplot as plt

from distseq.bench.recipes.trainings import RECIPES, SCORES, Result

# Frame accuracies closer than this tie whatever the seeds say: three seeds of 0.999 and 1.000
# make a standard error of 0, and a "win" by 0.001 that no user would rent GPUs for.
CLOSE = 0.01
_NAMES = {"accuracy": "frame acc", "jaccard": "Jaccard", "edit": "edit"}


@dataclass
class Row:
    """One recipe over the seeds: mean and std of each score of the reported split, steps and
    seconds, and where each seed's checkpoint was selected."""

    recipe: str
    seeds: int
    steps: int
    mean: dict[str, float]
    std: dict[str, float]  # 0 with one seed
    accuracy: dict[int, float]  # each seed's frame accuracy
    selected: list[int]  # each seed's selected step, in the last training's steps
    selection: float  # the mean of the selected checkpoints' data.val frame accuracy


def split_of(results: list[Result]) -> str:
    """The split the scores are reported on: ``test`` where the bench was given one."""
    return "test" if results and results[0].test else "val"


def summarize(results: list[Result]) -> list[Row]:
    rows = []
    for recipe in dict.fromkeys(r.recipe for r in results):
        mine = [r for r in results if r.recipe == recipe]
        values = {key: [r.reported[key] for r in mine] for key in SCORES}
        values["seconds"] = [r.seconds for r in mine]
        rows.append(
            Row(
                recipe,
                len(mine),
                mine[0].steps,
                {k: statistics.fmean(v) for k, v in values.items()},
                {k: statistics.stdev(v) if len(v) > 1 else 0.0 for k, v in values.items()},
                {r.seed: r.reported["accuracy"] for r in mine},
                [r.selected for r in mine],
                statistics.fmean(r.val["accuracy"] for r in mine),
            )
        )
    return rows


def heading(split: str, select: str, test: str) -> str:
    """What the table's numbers are: where the checkpoints were chosen, where they are scored
    (``test``: the test shards, ``::``-joined)."""
    chosen = f"Each training's checkpoint selected on data.val by `train.select: {select}`"
    if split == "test":
        shards = test.split("::")
        where = f"{len(shards)} shard" + "s" * (len(shards) > 1)
        folders = {str(Path(shard).parent) for shard in shards}
        if len(folders) == 1:
            where += f" in {folders.pop()}"
        return f"{chosen}; scores on the test split (--test: {where}), which no choice saw."
    return (
        f"{chosen}; scores on data.val, the split that selected them: optimistic, give --test "
        "for a split no choice saw."
    )


def table(rows: list[Row], split: str) -> str:
    """A Markdown table: mean ± std over the seeds (the sample std; 0 for one seed)."""
    names = [f"{split} {_NAMES.get(k, k.replace('f1', 'F1'))}" for k in SCORES]
    head = f"| recipe | seeds | steps | selected at | val acc (selection) | {' | '.join(names)} |"
    lines = [head + " train s |", "|---|---:|---:|---:|---:|" + "---:|" * (len(SCORES) + 1)]
    for row in rows:
        cells = [f"{row.mean[k]:.3f} ± {row.std[k]:.3f}" for k in SCORES]
        seconds = f"{row.mean['seconds']:.0f} ± {row.std['seconds']:.0f}"
        selected = "/".join(map(str, row.selected))
        lines.append(
            f"| {row.recipe} | {row.seeds} | {row.steps} | {selected} | {row.selection:.3f} | "
            f"{' | '.join(cells)} | {seconds} |"
        )
    return "\n".join(lines)


def advice(rows: list[Row], split: str) -> str:
    """One line: the winner by ``split`` frame accuracy against the runner-up, the gap weighed
    against its standard error over the seeds (sqrt(std_a^2 / n_a + std_b^2 / n_b)); a gap under
    CLOSE ties."""
    ranked = sorted(rows, key=lambda r: r.mean["accuracy"], reverse=True)
    best = ranked[0]
    acc = f"{split} frame accuracy {best.mean['accuracy']:.3f}"
    if len(ranked) == 1:
        return f"{best.recipe}: {acc} (one recipe, nothing to compare)"
    second = ranked[1]
    gap = best.mean["accuracy"] - second.mean["accuracy"]
    against = f"{acc} against {second.recipe}'s {second.mean['accuracy']:.3f} (+{gap:.3f})"
    cheaper = min(ranked[:2], key=lambda r: r.mean["seconds"])
    cheap = f"{cheaper.recipe} is the cheaper ({cheaper.mean['seconds']:.0f} s)"
    if gap < CLOSE:
        tie = f"{best.recipe} and {second.recipe} tie"
        return f"{tie}: {against} is less than {CLOSE} apart; {cheap}"
    if min(best.seeds, second.seeds) < 2:
        return f"{best.recipe} leads: {against}, on one seed: run more seeds to judge the gap"
    error = math.sqrt(
        best.std["accuracy"] ** 2 / best.seeds + second.std["accuracy"] ** 2 / second.seeds
    )
    seeds = [seed for seed in best.accuracy if seed in second.accuracy]
    ahead = sum(best.accuracy[seed] > second.accuracy[seed] for seed in seeds)
    if gap > 2 * error:
        return (
            f"{best.recipe} wins: {against}, more than twice the gap's standard error "
            f"({error:.3f}); ahead on {ahead} of {len(seeds)} seeds"
        )
    return (
        f"{best.recipe} and {second.recipe} tie: {against} is within twice the gap's standard "
        f"error ({error:.3f}); {best.recipe} ahead on {ahead} of {len(seeds)} seeds; {cheap}"
    )


def from_stage2(results: list[Result], split: str) -> str:
    """three_stage on each seed against the stage 2 it started from, by ``split`` frame accuracy
    of each's selected checkpoint (a stage 3 selected at step 0 never beat its start on
    data.val), or "" without it."""
    mine = [r for r in results if r.recipe == "three_stage"]
    seeds = [
        f"seed {r.seed} {r.stage2['accuracy']:.3f} -> {r.reported['accuracy']:.3f} "
        f"(step {r.selected})"
        for r in mine
    ]
    below = sum(r.reported["accuracy"] < r.stage2["accuracy"] for r in mine)
    ended = "below stage 2 on no seed" if not below else f"BELOW stage 2 on {below}"
    return (
        f"three_stage against its stage 2, {split} frame accuracy of the selected checkpoints: "
        f"{'; '.join(seeds)}: {ended}"
        if mine
        else ""
    )


def plot(results: list[Result], path: Path) -> None:
    """Validation frame accuracy against the last training's step, a line per recipe and seed,
    a star where its checkpoint was selected."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {recipe: f"C{i}" for i, recipe in enumerate(RECIPES)}
    labelled = set()
    for r in results:
        steps, accuracy = zip(*r.curve, strict=True) if r.curve else ((), ())
        label = None if r.recipe in labelled else r.recipe
        labelled.add(r.recipe)
        colour = colours[r.recipe]
        ax.plot(steps, accuracy, color=colour, marker=".", alpha=0.8, label=label)
        ax.plot([r.selected], [r.val["accuracy"]], color=colour, marker="*", markersize=12)
    ax.set(
        xlabel="step of the recipe's last training (a star: the selected checkpoint)",
        ylabel="validation frame accuracy",
        title="recipes: a line per seed",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
