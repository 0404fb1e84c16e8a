"""A config from a YAML file and ``key=value`` overrides, onto the schema (config.schema): old
key names read with a notice, ``key=`` as the empty string, local paths made absolute, and the
resolved config written back as YAML or JSON data that reads the same."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from distseq.config.schema import Config, ParamGroup, init_source
from distseq.errors import ConfigError, first_line

# Keys renamed since they were introduced: still read, with a notice, so old configs keep working.
RENAMED = {
    "data.frames": "data.window",
    "memory.backend": "memory.recompute",
    # One meaning a word: data.window is T; the attention's reach is a span.
    "model.head.window": "model.head.span",
}


def _absolute(urls: str) -> str:
    """Shard URLs (a ``::`` list, brace patterns allowed) with each local path made absolute
    against the current directory; remote ones (``pipe:``, ``http:``, ``file:``) as they are."""
    return "::".join(
        os.path.abspath(url) if url and not urlparse(url).scheme else url
        for url in urls.split("::")
    )


def _absolute_source(entry: str) -> str:
    source, prefixes = init_source(entry)
    return os.path.abspath(source) + (":" + ",".join(prefixes) if prefixes else "")


def with_absolute_paths(cfg: Config) -> Config:
    """``cfg`` with the local paths a run reads and writes made absolute (data.train, data.val,
    data.manifest, train.out_dir, train.init_from, and model.backbone.weights where it is a
    file), so that the
    run's recorded config, in its config.yaml and its checkpoints, means the same files from any
    directory: ``eval``, ``report``, ``predict`` and a resume started anywhere else."""
    data = replace(
        cfg.data,
        train=_absolute(cfg.data.train),
        val=_absolute(cfg.data.val),
        manifest=cfg.data.manifest and os.path.abspath(cfg.data.manifest),
    )
    weights = cfg.model.backbone.weights
    if weights and Path(weights).is_file():
        backbone = replace(cfg.model.backbone, weights=os.path.abspath(weights))
        cfg = replace(cfg, model=replace(cfg.model, backbone=backbone))
    train = replace(
        cfg.train,
        out_dir=os.path.abspath(cfg.train.out_dir),
        init_from=[_absolute_source(entry) for entry in cfg.train.init_from],
    )
    return replace(cfg, data=data, train=train)


def _rename_old_keys(conf: DictConfig, where: str, quiet: bool) -> None:
    """Move keys of :data:`RENAMED` to their new names in place, with a notice on stderr."""
    for old, new in RENAMED.items():
        section, _, leaf = old.rpartition(".")
        parent = OmegaConf.select(conf, section)
        if not isinstance(parent, DictConfig) or leaf not in parent:
            continue
        if OmegaConf.select(conf, new) is not None:
            raise ConfigError(f"{where}: config keys {old} and {new} are one key: give only {new}")
        value = parent.pop(leaf)
        OmegaConf.update(conf, new, value, force_add=True)
        if not quiet:
            print(f"distseq: {where}: config key {old} is now {new}", file=sys.stderr, flush=True)


# List keys that also take one value, read as a list of one (train.init_from=runs/a).
_ONE_OR_MORE = ("train.init_from",)


def _one_as_list(conf: DictConfig) -> None:
    for key in _ONE_OR_MORE:
        value = OmegaConf.select(conf, key)
        if value is not None and not isinstance(value, ListConfig):
            OmegaConf.update(conf, key, [value] if value != "" else [], merge=False)


def _check_groups(conf: DictConfig, where: str) -> None:
    """``optim.groups`` as given in ``where``, each group checked on its own so that an error
    names it by its place (``optim.groups[1].lr_scale``): the config library said "AnyNode is
    not a ListConfig" of a number, raised a TypeError of a mapping, and named a misspelt field
    without its path."""
    groups = OmegaConf.select(conf, "optim.groups")
    if groups is None:
        return
    if not isinstance(groups, ListConfig):
        raise ConfigError(
            f"{where}: config key optim.groups={groups!r}: must be a list of groups, e.g. "
            "[{prefix: backbone, lr_scale: 0.1}]"
        )
    for i, group in enumerate(groups):
        key = f"optim.groups[{i}]"
        if not isinstance(group, DictConfig):
            raise ConfigError(
                f"{where}: config key {key}={group!r}: must be a group, e.g. "
                "{prefix: backbone, lr_scale: 0.1}"
            )
        fields = list(ParamGroup.__dataclass_fields__)
        unknown = [str(name) for name in group if name not in fields]
        if unknown:
            raise ConfigError(
                f"{where}: config key {key}.{unknown[0]}: not a field of a group; its fields: "
                f"{', '.join(fields)}"
            )
        try:
            OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ParamGroup), group))
        except OmegaConfBaseException as e:
            field = getattr(e, "full_key", None) or "?"
            raise ConfigError(
                f"{where}: config key {key}.{field}: {first_line(getattr(e, 'msg', e))}"
            ) from None
        except ConfigError as e:
            raise ConfigError(f"{where}: {str(e).replace('optim.groups.', key + '.', 1)}") from None


def _dotlist(overrides: list[str]) -> list[str]:
    """Overrides as OmegaConf reads them; ``key=`` means the empty string, not null."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value")
    return [item + "''" if item.endswith("=") else item for item in overrides]


def _structured(conf: DictConfig) -> Config:
    """Merge onto the schema and build the dataclasses, which run every check."""
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), conf))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(f"config key {key}: {first_line(getattr(e, 'msg', e))}") from None
    assert isinstance(cfg, Config)
    return cfg


def load_config(
    path: str | Path | None,
    overrides: list[str] = (),  # type: ignore[assignment]
    quiet: bool = False,
) -> Config:
    """Merge the schema defaults, a YAML file and ``key=value`` overrides, then validate.

    ``quiet``: no notices (renamed keys), as on every rank but the first; errors still raise.
    """
    conf = OmegaConf.create()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            loaded = OmegaConf.load(path)
        except Exception as e:  # YAML syntax errors come from yaml, not OmegaConf
            raise ConfigError(f"config file {path}: {first_line(e)}") from None
        if not isinstance(loaded, DictConfig):
            raise ConfigError(f"config file {path}: expected a mapping of keys")
        _rename_old_keys(loaded, str(path), quiet)
        _one_as_list(loaded)
        _check_groups(loaded, str(path))
        conf = loaded
    try:
        given = OmegaConf.from_dotlist(_dotlist(list(overrides)))
    except OmegaConfBaseException as e:
        raise ConfigError(f"overrides: {first_line(getattr(e, 'msg', e))}") from None
    _rename_old_keys(given, "overrides", quiet)
    _one_as_list(given)
    _check_groups(given, "overrides")
    return _structured(OmegaConf.merge(conf, given))  # type: ignore[arg-type]


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain JSON data, enums as their values."""
    container = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    assert isinstance(container, dict)
    return container  # type: ignore[return-value]


def from_dict(data: dict[str, Any], where: str) -> Config:
    """A config written by :func:`to_dict` (a checkpoint's, an exported model's), validated."""
    try:
        return _structured(OmegaConf.create(data))
    except ConfigError as e:
        raise ConfigError(f"{where}: its config does not fit this distseq: {e}") from None


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML that ``load_config`` reads back as the same config."""
    return OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg)))
