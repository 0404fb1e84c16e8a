"""Your own modules by import path: ``model.backbone.name`` or ``model.head.kind`` written as
``package.module:factory``, called with the keyword arguments of the key's ``args``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from distseq.config import is_import_path
from distseq.errors import ConfigError, first_line


def _factory(path: str, key: str) -> Callable[..., Any]:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # a missing module, or one that fails on import
        raise ConfigError(
            f"config key {key}={path!r}: cannot import {module_name} ({type(e).__name__}: "
            f"{first_line(e)}); is it installed, or on PYTHONPATH?"
        ) from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"config key {key}={path!r}: {module_name} has no {attr}")
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"config key {key}={path!r}: {attr} is not callable")
    return target


def build_imported(path: str, key: str, args: Mapping[str, Any], **given: Any) -> nn.Module:
    """The module ``path``'s factory returns, called with ``given`` and ``args`` (the config's
    ``<key's section>.args``); one line naming ``key`` if it cannot be had."""
    assert is_import_path(path)
    factory = _factory(path, key)
    section = key.rpartition(".")[0]
    clash = sorted(set(given) & set(args))
    if clash:
        raise ConfigError(
            f"config key {section}.args: {clash} are given by distseq; leave them out"
        )
    try:
        module = factory(**given, **args)
    except Exception as e:  # the user's code: a wrong argument, or a failure of its own
        raise ConfigError(
            f"config key {key}={path!r}: calling it with {sorted([*given, *args])} failed "
            f"({type(e).__name__}: {first_line(e)}); see {section}.args"
        ) from None
    if not isinstance(module, nn.Module):
        raise ConfigError(
            f"config key {key}={path!r}: returned a {type(module).__name__}, not an nn.Module"
        )
    return module
