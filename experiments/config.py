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
import reprlib
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from memcores.envs.env_options import as_flag

T = TypeVar("T")


class ConfigError(ValueError):
    """A config key or value is wrong; the message names it and the valid choices."""


MAX_YAML_VALUES = 10_000
"""Most values (scalars, lists and mappings, each alias counted as the values it stands for)
that one YAML document may expand to; a config holds a few hundred. A few hundred bytes of
nested aliases (a "billion laughs" document) would otherwise expand to gigabytes."""

ECHO_LIMIT = 200
"""Most characters of a value that an error message shows."""

_ECHO = reprlib.Repr()
_ECHO.maxlevel, _ECHO.maxdict, _ECHO.maxlist, _ECHO.maxtuple = 3, 8, 8, 8
_ECHO.maxstring, _ECHO.maxother, _ECHO.maxlong = 80, 80, 80


def shorten(value: Any) -> str:
    """``repr(value)`` for an error message, cut to :data:`ECHO_LIMIT` characters (``...``
    marks a cut): a message must stay one readable line whatever the user wrote."""
    text = _ECHO.repr(value)
    return text if len(text) <= ECHO_LIMIT else text[: ECHO_LIMIT - 3] + "..."


class _Refused(yaml.YAMLError):
    """A YAML document that parses but that a config must not be: duplicate keys, aliases
    that expand beyond :data:`MAX_YAML_VALUES`."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader, stricter: a key given twice in one mapping is an error (the
    last one would silently win), and so is a document whose aliases expand to more than
    :data:`MAX_YAML_VALUES` values."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_expanded_size(node)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        first: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue  # `<<: *base` merges may repeat keys on purpose
            key = self.construct_object(key_node)
            if key in first:
                raise _Refused(
                    f"duplicate key {shorten(key)} (first given on line "
                    f"{first[key].line + 1}); give each key once",
                    key_node.start_mark,
                )
            first[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _check_expanded_size(root: yaml.Node) -> None:
    """Raise :class:`_Refused` when ``root``'s aliases make it expand to more than
    :data:`MAX_YAML_VALUES` values. An alias is the same node object as its anchor, so sizes
    are memoised by node: the check costs one visit per node of the text, not of the expansion.
    """
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise _Refused("a YAML alias refers to a value that contains it", node.start_mark)
        open_.add(key)
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        open_.discard(key)
        sizes[key] = total
        return total

    # Without aliases the size is bounded by the text itself; with them it can be 10**9.
    if size(root) > MAX_YAML_VALUES and size(root) > len(sizes):
        raise _Refused(
            f"its aliases expand to more than {MAX_YAML_VALUES:,} values; write the values "
            "out instead",
            root.start_mark,
        )


def parse_yaml(text: str) -> Any:
    """``text`` parsed by :class:`ConfigLoader` (safe types only, no duplicate keys, no
    alias bombs). :raises yaml.YAMLError: malformed or refused."""
    return yaml.load(text, Loader=ConfigLoader)  # noqa: S506  (ConfigLoader is a SafeLoader)


def load_config(
    schema: type[T], path: str | Path | None = None, overrides: Iterable[str] = ()
) -> T:
    """Build a ``schema`` instance from a YAML file plus ``key.sub=value`` overrides.

    :param schema: a dataclass type whose fields may themselves be dataclasses.
    :param path: YAML file; ``None`` starts from the schema's defaults.
    :param overrides: strings ``dotted.key=value``; values are parsed as YAML scalars/lists.
        A schema with a ``migrate(raw) -> (raw, notes)`` attribute has the keys of earlier
        releases renamed, each note printed on stderr as one line.
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
    migrate = getattr(schema, "migrate", None)  # keys of earlier releases, renamed
    if callable(migrate):
        raw, notes = migrate(raw)
        for note in notes:
            print(f"memcores: {note}", file=sys.stderr)
    return build(schema, raw, prefix="")


CONFIGS_DIR = Path(__file__).resolve().parent / "configs"
"""The shipped configs: ``experiments/configs`` in a checkout, ``memcores/experiments/configs``
in an installed wheel."""

CONFIG_SUFFIXES = (".yaml", ".yml")


def shipped_configs() -> dict[str, Path]:
    """Name -> file of every shipped config (``memory_s7``, ``references/thesis_table7``)."""
    return {
        p.relative_to(CONFIGS_DIR).with_suffix("").as_posix(): p
        for p in sorted(CONFIGS_DIR.rglob("*.yaml"))
    }


def shipped_name(path: str | Path) -> str | None:
    """The shipped config that ``path`` names, or None: its name (``memory_s7``), its file name
    (``memory_s7.yaml``) or its documented path (``experiments/configs/memory_s7.yaml``)."""
    path = Path(path)
    if path.is_absolute():
        return None
    if path.parts[:2] == ("experiments", "configs"):
        path = Path(*path.parts[2:]) if len(path.parts) > 2 else Path()
    text = path.as_posix()
    for suffix in CONFIG_SUFFIXES:
        text = text.removesuffix(suffix)
    return text if text in shipped_configs() else None


_NOTED: set[str] = set()


def config_path(path: str | Path) -> Path:
    """The file a command reads for ``path``: a file that exists where it is given (the user's
    own), else the shipped config it names (:func:`shipped_name`), else ``path`` itself (for the
    caller to report as missing). Where a user's file and a shipped config share the name and
    are different files, says once on stderr which one is read."""
    path = Path(path)
    name = shipped_name(path)
    if name is None:
        return path
    shipped = shipped_configs()[name]
    if not path.is_file():
        return shipped
    if not path.samefile(shipped) and str(path) not in _NOTED:
        _NOTED.add(str(path))
        print(
            f"memcores: reading {path} (a file here), not the shipped config {name!r} ({shipped})",
            file=sys.stderr,
        )
    return path


def read_yaml(path: str | Path, what: str = "config file") -> Any:
    """Read a YAML file through :func:`parse_yaml` (no duplicate keys, no alias bombs): the
    one way memcores reads a YAML file a person wrote.

    :param what: how messages name the file (``"config file"``, ``"reference file"``).
    :raises ConfigError: the path is missing, a folder or not a regular file, the file is not
        UTF-8 YAML or is refused; the message names the file.
    """
    path = config_path(path)
    if path.is_dir():
        raise ConfigError(f"{what.split()[0]} path {path} is a folder, not a YAML file")
    if not path.exists():
        shipped = what == "config file"
        hint = " (shipped configs by name: `memcores list configs`)" if shipped else ""
        raise ConfigError(f"{what} not found: {path}{hint}")
    if not path.is_file():  # /dev/null, a pipe, a socket: nothing a config is kept in
        raise ConfigError(f"{what} {path} is not a regular file; give a YAML file")
    try:
        return parse_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not a text (UTF-8 YAML) file") from None
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path}: {err.strerror}") from err
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(err, "problem", None) or "malformed"
        verdict = "is refused" if isinstance(err, _Refused) else "is not valid YAML"
        raise ConfigError(f"{what} {path} {verdict}{at}: {problem}") from None


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML file that must hold a non-empty mapping (:func:`read_yaml`).

    :raises ConfigError: as :func:`read_yaml`; and the file is empty (an empty file is a
        mistake more often than a wish for every default), or holds no mapping.
    """
    path = Path(path)
    data = read_yaml(path)
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
        raise ConfigError(f"override {shorten(item)} must look like key.subkey=value")
    try:
        value = parse_yaml(text) if text.strip() else ""
    except _Refused as err:
        raise ConfigError(f"override {key.strip()!r}: {err.problem}") from None
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
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {shorten(raw)}")
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
                f"unknown config key {shorten(where)}; valid keys{section}: "
                f"{', '.join(sorted(fields))}"
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
                f"invalid value {shorten(value)} for {where!r}; allowed: "
                f"{', '.join(map(repr, args))}"
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
            errors[0] if len(errors) == 1 else f"invalid value {shorten(value)} for {where!r}"
        )
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where!r} must be a list, got {shorten(value)}")
        item = args[0] if args else Any
        return [coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where!r} must be a mapping, got {shorten(value)}")
        return dict(value)
    if hint is bool:
        try:
            return as_flag(value, where)
        except ValueError:
            raise ConfigError(f"{where!r} must be true or false, got {shorten(value)}") from None
    if hint is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where!r} must be an integer, got {shorten(value)}")
        if isinstance(value, int):
            return value
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            as_float = None
        if as_float is not None and as_float.is_integer():
            return int(as_float)
        raise ConfigError(f"{where!r} must be an integer, got {shorten(value)}")
    if hint is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where!r} must be a number, got {shorten(value)}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where!r} must be a number, got {shorten(value)}") from None
    if hint is str:
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigError(f"{where!r} must be a string, got {shorten(value)}")
        return str(value)
    return value


def to_dict(config: Any) -> dict[str, Any]:
    """A dataclass tree as plain dicts/lists (for ``config.yaml`` and checkpoints)."""
    return dataclasses.asdict(config)


def dump_yaml(config: Any) -> str:
    """The config tree as YAML text."""
    return yaml.safe_dump(to_dict(config), sort_keys=False)
