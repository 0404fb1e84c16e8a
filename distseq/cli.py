"""distseq command line: train, config, demo, shard, export, predict, features, eval, report,
submit, bench.

Each stage's commands live in ``<stage>/command.py`` (``add_parser`` sets ``run``), thin runs
over that stage's library; this file only assembles them and turns the errors users cause into
one line and an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from distseq import __version__
from distseq.errors import EXIT_STOPPED, error_line, exit_code
from distseq.launch.agent import agent_gone, exit_orphaned, exit_with_agent
from distseq.train.signals import StoppedAtStart


class _Help(argparse.HelpFormatter):
    """Each option's default after its help, unless the help says it or there is none to say
    (None, off, empty)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        # By identity: 0 == False, and a default of 0 is worth saying.
        unsaid = default is None or default is False or default is argparse.SUPPRESS
        if "default" in text or not action.option_strings or unsaid or default in ("", []):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, list | tuple) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})".strip()


class _Parser(argparse.ArgumentParser):
    """Every command's parser: its subcommands' too, since a parser's subparsers are of its
    class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)


# Each command's module by the words that name it. A run imports its own command's module only:
# importing all of them (bench's torchvision models and matplotlib among them) took 4.9 s of a
# 6 s three-step `distseq train`, and every torchrun rank pays it again.
_MODULES = {
    "train": "distseq.train.command",
    "config": "distseq.config.command",
    "demo": "distseq.demo.command",
    "shard": "distseq.shard.command",
    "export": "distseq.checkpoint.command",
    "predict": "distseq.infer.command",
    "features": "distseq.infer.command",
    "eval": "distseq.evaluate.command",
    "report": "distseq.evaluate.command",
    "submit": "distseq.launch.command",
    "bench": "distseq.bench.command",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command``'s module alone where one is named (what
    ``distseq --help`` and an unknown command's error list needs all of)."""
    names = [_MODULES[command]] if command in _MODULES else list(dict.fromkeys(_MODULES.values()))
    parser = _Parser(prog="distseq", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"distseq {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in names:
        importlib.import_module(name).add_parser(sub)
    return parser


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its command line (``distseq bench data``), subcommands after
    their command: what the manual's command-line page prints."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        found[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(child, f"{name} {sub}")

    walk(build_parser(), "distseq")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    exit_with_agent()  # first: the imports below take seconds, and the agent may die meanwhile
    args = parse(argv)
    try:
        args.run(args)
    except KeyboardInterrupt:
        return _failed("interrupted", 130)
    except StoppedAtStart as e:
        return _failed(str(e), EXIT_STOPPED)
    except Exception as e:
        code = exit_code(e)
        if code is None:
            _exit_if_orphaned()
            raise
        return _failed(str(e), code)
    return 0


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, with a command's ``key=value`` overrides before or after its options
    (``submit CONFIG --nodes 4 data.train=shards/``): argparse fills a positional list from one
    run of arguments only, and hands back those after an option as unrecognized."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    args, rest = parser.parse_known_args(argv)
    # The unknown options alone: the words after one may be its values or overrides, and
    # argparse cannot tell which.
    unknown = [a.split("=", 1)[0] for a in rest if a.startswith("-") and not _number(a)]
    if unknown:
        parser.error(f"unrecognized option: {' '.join(unknown)}")
    if rest and hasattr(args, "overrides"):
        args.overrides = [*args.overrides, *rest]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args


def _number(word: str) -> bool:
    """A negative number, such as an unknown option's value: not an option."""
    try:
        float(word)
    except ValueError:
        return False
    return True


def _failed(message: str, code: int) -> int:
    """Print ``message`` as this rank's one line (an error's, unless ``code`` says a stop on
    request); returns ``code``."""
    _exit_if_orphaned()
    print(error_line(message, stopped=code == EXIT_STOPPED), file=sys.stderr)
    return code


def _exit_if_orphaned() -> None:
    """A peer that saw the agent's death first exits, and a collective fails here before this
    worker's own poll (0.5 s) notices: the agent is then the cause, whatever error the collective
    became (seen once in CI: "a collective failed ... every node answers")."""
    if agent_gone():
        exit_orphaned()
