"""MkDocs hooks: the manual's reference pages made from the code at every build (the config keys
from the schema's documentation, the command line from the parsers, the API from ``__all__``), and
the build stopped where the code leaves something undocumented. ``mkdocs build --strict`` runs
them in CI."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from mkdocs.exceptions import PluginError

HELP_WIDTH = "100"  # argparse wraps help to $COLUMNS: fixed, so every build prints the same page


def config_keys() -> str:
    from distseq.config.keys import reference_table

    return reference_table()


def cli_reference() -> str:
    from distseq.cli import commands

    os.environ["COLUMNS"] = HELP_WIDTH
    sections = []
    for name, parser in commands().items():
        sections.append(f"## `{name}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
    return "\n".join(sections)


def api_reference() -> str:
    import distseq

    undocumented, sections = [], []
    for name in distseq.__all__:
        if name == "__version__":
            continue
        obj = getattr(distseq, name)
        # A class's own docstring, not one it inherits (an Enum's would say "An enumeration").
        own = vars(obj).get("__doc__") if isinstance(obj, type) else obj.__doc__
        if not (own or "").strip():
            undocumented.append(name)
        sections.append(f"::: {obj.__module__}.{name}\n")
    if undocumented:
        raise PluginError(f"public names without a docstring: {', '.join(undocumented)}")
    return "\n".join(sections)


MARKERS: dict[str, Callable[[], str]] = {
    "<!-- distseq: config-keys -->": config_keys,
    "<!-- distseq: cli-reference -->": cli_reference,
    "<!-- distseq: api-reference -->": api_reference,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


# The docstrings cross-reference in Sphinx's roles (:class:`Carry`), which Markdown renders as
# the role's name before a code span: the page shows the code span alone.
SPHINX_ROLE = re.compile(r":(?:class|func|meth|attr|mod):(?=<code>)")


def on_page_content(html: str, **_: Any) -> str:
    return SPHINX_ROLE.sub("", html)
