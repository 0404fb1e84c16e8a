"""What the commands' parsers share: an option's old spelling, read as the new one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def renamed(p: argparse.ArgumentParser, old: str, new: str) -> None:
    """Read ``old``, an option a command had, as ``new`` (added to ``p`` before this), with a
    one-line notice on stderr: old spellings keep working for one release, as renamed config
    keys do, and both given are refused as both keys are. Hidden from the help, so each option
    name keeps one meaning across distseq."""
    target = next(a for a in p._actions if new in a.option_strings)
    given = f"distseq: {new} given as"  # the namespace's note of the spelling given first

    def once(parser: argparse.ArgumentParser, namespace: argparse.Namespace, as_: str) -> None:
        first = vars(namespace).setdefault(given, as_)
        if first != as_:
            parser.error(f"{old} and {new} are one option: give only {new}")

    class Renamed(argparse.Action):
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: str | Sequence[Any] | None,
            option_string: str | None = None,
        ) -> None:
            once(parser, namespace, old)
            print(f"{parser.prog}: {old} is now {new}", file=sys.stderr, flush=True)
            target(parser, namespace, values, old)

    # The new option's own action, which argparse calls by its class, notes its spelling too.
    class New(type(target)):  # type: ignore[misc]
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: str | Sequence[Any] | None,
            option_string: str | None = None,
        ) -> None:
            if option_string != old:  # else Renamed's call, which noted it
                once(parser, namespace, new)
            super().__call__(parser, namespace, values, option_string)

    target.__class__ = New
    # Converted as the new option's values are.
    converted: dict[str, Any] = {} if target.type is None else {"type": target.type}
    p.add_argument(old, action=Renamed, nargs=target.nargs, help=argparse.SUPPRESS, **converted)
