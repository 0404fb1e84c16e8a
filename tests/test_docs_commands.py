"""Every distseq command in the README's and the manual's bash blocks, as a user copies it: each
one parses (the README's SLURM line once did not: its overrides came after the options), and each
`distseq submit` of a shipped config shows its job with --dry-run. The quick start itself runs
end to end in tests/integration/test_readme.py; the rest need GPUs, a cluster or a dataset."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from conftest import REPO
from distseq.cli import main, parse

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SYNOPSIS = "<!-- distseq: cli-reference -->"  # cli.md's usage lines, [options] and all


def commands() -> list[tuple[str, list[str]]]:
    """(page and line, the distseq arguments) of every command line in a bash block that runs
    distseq: directly, or through ``-m distseq`` (torchrun, docker run)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        if SYNOPSIS in text:
            text = text.split("```bash", 1)[0] + text.split(SYNOPSIS, 1)[1]
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if "distseq" not in words or words[0] in ("pip", "python3", "mkdir"):
                    continue
                at = words.index("distseq")
                if at == 0 or words[at - 1] == "-m":
                    found.append(
                        (f"{page.relative_to(REPO)}: {line.strip()[:60]}", words[at + 1 :])
                    )
    return found


COMMANDS = commands()


def test_the_pages_have_the_commands_users_copy() -> None:
    said = [args[0] for _, args in COMMANDS]
    for command in ("shard", "train", "eval", "report", "predict", "export", "submit", "bench"):
        assert command in said, f"no distseq {command} in the README or the manual"


@pytest.mark.parametrize("where,args", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_every_command_of_the_pages_parses(where: str, args: list[str]) -> None:
    parsed = parse(args)  # argparse exits 2 on a command it refuses
    # A usage line's [--option] is no command: it would be read as an override.
    assert all("=" in o for o in getattr(parsed, "overrides", [])), parsed.overrides


SUBMITS = [(w, a) for w, a in COMMANDS if a[0] == "submit" and (REPO / a[1]).is_file()]


@pytest.mark.parametrize("where,args", SUBMITS, ids=[where for where, _ in SUBMITS])
def test_every_submit_of_the_pages_shows_its_job(
    where: str, args: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    args = [str(REPO / a) if a.startswith("configs/") else a for a in args]
    assert main([*args, "--dry-run"]) == 0
    assert not list(tmp_path.iterdir())  # a dry run writes nothing
