"""``distseq config [CONFIG] [key=value ...]``: a config as a run resolves it, or, with
``--keys``, every key with its default and meaning."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from distseq.config.keys import DOCS, key_values, plain, shown
from distseq.config.load import load_config, to_yaml
from distseq.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("config", help="print a config as a run resolves it, or every key (--keys)")
    p.add_argument("config", nargs="?", help="YAML config file, or a run folder (its config.yaml)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, as train takes them")
    p.add_argument("--keys", action="store_true", help="every key, its default and its meaning")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    if args.keys:
        print(keys_text(), end="")
        return
    if args.config is None:
        raise ConfigError("give a config file or a run folder, or --keys for every key")
    path = Path(args.config)
    if path.is_dir():
        path = path / "config.yaml"
    print(to_yaml(load_config(path, args.overrides)), end="")


def keys_text() -> str:
    """Every key as a terminal shows it: the key and its default, then its meaning, indented."""
    blocks = []
    for key, value in key_values():
        meaning = textwrap.fill(
            plain(DOCS[key]), 96, initial_indent="    ", subsequent_indent="    "
        )
        blocks.append(f"{key} = {plain(shown(key, value))}\n{meaning}\n")
    return "".join(blocks)
