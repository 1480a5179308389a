"""Typed YAML configs with dotted command-line overrides.

A config schema is a tree of dataclasses (each field documented by a docstring or comment in
the schema's module). :func:`load_config` reads a YAML file, applies overrides such as
``core.name=ur_lstm agent.seq_len=64``, and returns the dataclass tree. Every key and value is
checked before anything runs; a wrong one raises :class:`ConfigError` naming the key and the
valid choices.

A section may accept free-form keys by naming a ``dict`` field in its ``__extras__`` class
attribute: unknown keys of that section land there (``core.p=0.25`` -> ``core.options["p"]``);
the component that consumes them validates them (e.g. :func:`cores.make_core`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config key or value is wrong; the message names it and the valid choices."""


def load_config(
    schema: type[T], path: str | Path | None = None, overrides: Iterable[str] = ()
) -> T:
    """Build a ``schema`` instance from a YAML file plus ``key.sub=value`` overrides.

    :param schema: a dataclass type whose fields may themselves be dataclasses.
    :param path: YAML file; ``None`` starts from the schema's defaults.
    :param overrides: strings ``dotted.key=value``; values are parsed as YAML scalars/lists.
    :raises ConfigError: unknown key, wrong type, value outside the allowed choices, missing
        or malformed file.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_yaml_mapping(path)
        raw.pop("search", None)  # a sweep's search space (experiments/search.py), not a key
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(raw, key, value)
    return build(schema, raw, prefix="")


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML file that must hold a non-empty mapping.

    :raises ConfigError: the path is missing or a folder, the file is not UTF-8 YAML, is empty
        (an empty file is a mistake more often than a wish for every default), or holds no
        mapping; the message names the file.
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config path {path} is a folder, not a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not a text (UTF-8 YAML) file") from None
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from err
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(err, "problem", None) or "malformed"
        raise ConfigError(f"config file {path} is not valid YAML{at}: {problem}") from err
    if data is None:
        raise ConfigError(
            f"config file {path} is empty; write the keys to change (e.g. `core: {{name: lstm}}`)"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping, got {type(data).__name__}")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    """``"agent.seq_len=64"`` -> ``("agent.seq_len", 64)``."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like key.subkey=value")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    return key.strip(), value


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``tree[a][b][c] = value`` for ``key = "a.b.c"``, creating mappings on the way."""
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def build(schema: type[T], raw: Mapping[str, Any], prefix: str) -> T:
    """Recursively build dataclass ``schema`` from a mapping, validating every key and value."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema) if f.init}
    extras_field = getattr(schema, "__extras__", None)
    kwargs: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{prefix}{key}"
        if key not in fields:
            if extras_field:
                extras[key] = value
                continue
            section = f" in {prefix.rstrip('.')!r}" if prefix else ""
            raise ConfigError(
                f"unknown config key {where!r}; valid keys{section}: {', '.join(sorted(fields))}"
            )
        kwargs[key] = coerce(value, hints[key], where)
    if extras_field:
        merged = dict(kwargs.get(extras_field) or {})
        merged.update(extras)
        kwargs[extras_field] = merged
    for name, f in fields.items():
        if name in kwargs:
            continue
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if no_default:
            if dataclasses.is_dataclass(hints[name]):
                kwargs[name] = build(hints[name], {}, prefix=f"{prefix}{name}.")
            else:
                raise ConfigError(f"missing required config key {prefix}{name!r}")
    try:
        obj = schema(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: {err}") from err
    validate = getattr(obj, "validate", None)
    if callable(validate):
        try:
            validate()
        except ConfigError:
            raise
        except ValueError as err:
            message = str(err)
            if not (prefix and message.startswith(prefix)):  # already names its key
                message = f"{prefix.rstrip('.') or 'config'}: {message}"
            raise ConfigError(message) from err
    return obj


def coerce(value: Any, hint: Any, where: str) -> Any:
    """Check and convert ``value`` to the annotated type ``hint``."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return build(hint, value if value is not None else {}, prefix=f"{where}.")
    if hint is Any:
        return value
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(
                f"invalid value {value!r} for {where!r}; allowed: {', '.join(map(repr, args))}"
            )
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(
            errors[0] if len(errors) == 1 else f"invalid value {value!r} for {where!r}"
        )
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where!r} must be a list, got {value!r}")
        item = args[0] if args else Any
        return [coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where!r} must be a mapping, got {value!r}")
        return dict(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{where!r} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where!r} must be an integer, got {value!r}")
        if isinstance(value, int):
            return value
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            as_float = None
        if as_float is not None and as_float.is_integer():
            return int(as_float)
        raise ConfigError(f"{where!r} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where!r} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where!r} must be a number, got {value!r}") from None
    if hint is str:
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigError(f"{where!r} must be a string, got {value!r}")
        return str(value)
    return value


def to_dict(config: Any) -> dict[str, Any]:
    """A dataclass tree as plain dicts/lists (for ``config.yaml`` and checkpoints)."""
    return dataclasses.asdict(config)


def dump_yaml(config: Any) -> str:
    """The config tree as YAML text."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)
