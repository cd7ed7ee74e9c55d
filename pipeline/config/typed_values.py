"""Typed values from YAML: a value checked against a dataclass field's annotation, errors naming where it was.

Used to build the config (``pipeline.config``) and to check a search space's values (``make tune``). Pure.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

from pipeline.core.errors import ConfigError


def check_type(value: Any, annotation: Any, where: str) -> Any:
    """Return ``value`` coerced to ``annotation`` or raise ValueError naming ``where``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return check_type(value, option, where)
            except ValueError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0])
    if origin is tuple:
        (item_type, _ellipsis) = typing.get_args(annotation)
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(f"{where} must be a non-empty list, got {value!r}")
        return tuple(check_type(item, item_type, where) for item in value)
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # YAML reads an all-digit checksum or name as a number
    if annotation is bool and not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if annotation is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if not isinstance(value, annotation):
        raise ConfigError(f"{where} must be of type {annotation.__name__}, got {value!r}")
    return value


def build_sections(config_type: type, raw: Mapping[str, Any], source: str):
    """``config_type`` (a dataclass of section dataclasses) from ``raw``'s sections, every key checked: unknown
    sections or keys and wrong types are a ``ConfigError`` naming ``source`` and ``section.key``."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping of sections")
    sections = {f.name: f for f in dataclasses.fields(config_type)}
    built: dict[str, Any] = {}
    for name, values in raw.items():
        if name not in sections:
            raise ConfigError(f"{source}: unknown section {name!r} (known: {', '.join(sections)})")
        section_type = sections[name].default_factory
        if section_type is dataclasses.MISSING:
            raise ConfigError(f"{source}: section {name!r} of {config_type.__name__} has no default to build from")
        values = values or {}
        if not isinstance(values, Mapping):
            raise ConfigError(f"{source}: section {name!r} must be a mapping")
        hints = typing.get_type_hints(section_type)
        kwargs = {}
        for key, value in values.items():
            if key not in hints:
                raise ConfigError(f"{source}: unknown key {name}.{key} (known: {', '.join(sorted(hints))})")
            kwargs[key] = check_type(value, hints[key], f"{source}: {name}.{key}")
        try:
            built[name] = section_type(**kwargs)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return config_type(**built)
