"""Configs from files: the shipped recipes by name, TOML files layered over the defaults, and
dotted overrides on top."""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any

from seqrec.config.classes import (
    _ADAPTED_BY,
    _RUN_KEYS,
    RunConfig,
    T,
    default_config,
    dotted_key,
    from_dict,
    parse_override,
)
from seqrec.errors import ConfigError
from seqrec.files import bound, read_checked

__all__ = ["CONFIG_DIR", "config_names", "layered_config", "load_config", "resolve_config"]

CONFIG_DIR = (
    Path(__file__).parent.parent / "configs"
)  # the shipped configs, e.g. ml-1m-bert4rec.toml


def config_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def resolve_config(name_or_path: str | Path) -> Path:
    """A TOML file path, or the name of a shipped config (`ml-1m-bert4rec`)."""
    p = Path(name_or_path)
    if p.exists():
        return p
    shipped = CONFIG_DIR / f"{p.name.removesuffix('.toml')}.toml"
    if p.parent == Path(".") and shipped.exists():
        return shipped
    raise ConfigError(
        f"{name_or_path}: no such config file, and not a shipped config "
        f"({', '.join(config_names())})"
    )


def _merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            _merge(dst[k], v)
        else:
            dst[k] = v


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: typing.Sequence[str] = (),
    *,
    base: T | None = None,
) -> T:
    """Defaults (or `base`), then the TOML file (a path or a shipped config's name), then each
    `section.key=value` override. For a RunConfig without `base` the defaults are those of the
    model the file or the overrides name (`default_config`). A RunConfig's short-budget tiers
    lose the settings of the keys given in `overrides` (explicit keys win)."""
    cfg = layered_config(cls, path, overrides, base)
    if isinstance(cfg, RunConfig) and cfg.adapt and overrides:  # an explicit size wins
        explicit = {_ADAPTED_BY.get(dotted_key(t).rsplit(".", 1)[-1]) for t in overrides}
        kept = tuple(a for a in cfg.adapt if a not in explicit)
        cfg = dataclasses.replace(cfg, adapt=kept)
    if isinstance(cfg, RunConfig) and cfg.short_budget:
        return _short_budget_checked(cfg, overrides, path)  # type: ignore[return-value]
    return cfg


def layered_config(
    cls: type[T], path: str | Path | None, overrides: typing.Sequence[str], base: T | None
) -> T:
    """`load_config`'s layers: defaults or `base`, the file, the overrides."""
    layer: dict[str, Any] = {}
    if path is not None:
        p = resolve_config(path)
        if not p.exists() and not p.is_symlink():
            raise ConfigError(f"{p}: config file not found")
        try:
            layer = tomllib.loads(read_checked(p, bound("config")).decode())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{p}: not valid TOML ({e})") from None
    for text in overrides:
        keys, value = parse_override(text)
        node = layer
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {k} is not a section")
        node[keys[-1]] = value
    if base is None and cls is RunConfig:
        try:
            base = default_config(str(layer.get("model", "bert4rec")))  # type: ignore[assignment]
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}" if path is not None else str(err)) from None
    data: dict[str, Any] = {}
    if isinstance(base, RunConfig):
        data = base.to_dict()
        if layer.get("model", base.model) != base.model:  # another model: not its sections
            data = {k: v for k, v in data.items() if k in _RUN_KEYS}
    elif base is not None:
        data = dataclasses.asdict(base)  # type: ignore[call-overload]
    _merge(data, layer)
    return from_dict(cls, data, str(path) if path else "config")


def _short_budget_checked(
    cfg: RunConfig, overrides: typing.Sequence[str], path: str | Path | None
) -> RunConfig:
    """`cfg` less the short-budget settings of the keys given explicitly (they win), the tiers'
    settings checked now rather than when a short run first applies them."""
    if overrides:
        explicit = {dotted_key(text) for text in overrides}
        tiers = tuple(tier.without(explicit) for tier in cfg.short_budget)
        cfg = dataclasses.replace(cfg, short_budget=tiers)
    for tier in cfg.short_budget:
        try:
            layered_config(RunConfig, None, tier.set, cfg)
        except ConfigError as err:
            raise ConfigError(f"{path or 'config'}: short_budget.set: {err}") from None
    return cfg
