"""Which runs are seeds of one experiment: their configs compared key by key.

Reports and plots average the runs of a group over seeds. Two runs belong together only when
their configs agree on every key that can change a result; keys that only say where or how
fast a run went (its folder, the progress bar, worker processes, checkpoint interval) and the
seed itself are left out of the comparison. A key a config lacks (a record written before
the key existed) takes the schema's default. Runs that differ in anything else form separate
groups, named by the keys in which they differ from the most common setting
(``agent.n_epochs=4, train.total_steps=2000000``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import cache
from typing import Any, TypeVar

T = TypeVar("T")

BOOKKEEPING_PREFIXES = ("run.",)
"""Sections that never change a result (the run folder, TensorBoard, overwrite)."""
BOOKKEEPING_KEYS = frozenset(
    {
        "train.progress",
        "train.checkpoint_every",
        "train.device",
        "train.threads",
        "train.update_threads",
        "train.max_skipped_updates",
        "train.log_every",
        "train.histogram_every",
        "env.vector",
        "env.workers",
        "agent.bptt_check",
    }
)
"""Keys that say how a run executed, not what it computed."""
PATH_KEYS = frozenset({"train.init_from"})
"""Keys holding a path that differs per run (the seed's own pretrained run): compared only as
set / unset."""


def is_seed_key(key: str) -> bool:
    """``train.seed`` and any other ``*.seed`` key."""
    return key.rsplit(".", 1)[-1] == "seed"


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; empty sections and None values are left out
    (a key that is not set)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        elif value is not None:
            out[dotted] = value
    return out


@cache
def _defaults(kind: str) -> dict[str, Any]:
    """The flattened default config of the RL or supervised schema."""
    from dataclasses import asdict

    if kind == "supervised":
        from memcores.agents.supervised_config import SupervisedConfig as Schema
    else:
        from memcores.agents.rl_config import RLConfig as Schema
    return flatten(asdict(Schema()))


def with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` flattened, the schema's default for every key it lacks (free-form sections
    such as ``env.kwargs`` and ``core.options`` have no defaults to fill)."""
    flat = flatten(config)
    if not flat:
        return flat
    return {**_defaults("supervised" if "task" in config else "rl"), **flat}


def settings(config: Mapping[str, Any], ignore: Sequence[str] = ()) -> dict[str, str]:
    """The result-changing keys of ``config`` with defaults filled (:func:`with_defaults`),
    values as text (seed left out).

    :param ignore: more keys to leave out (e.g. ``train.total_steps`` when a longer budget is
        still the same run).
    """
    out = {}
    for key, value in with_defaults(config).items():
        if (
            is_seed_key(key)
            or key in BOOKKEEPING_KEYS
            or key in ignore
            or key.startswith(BOOKKEEPING_PREFIXES)
        ):
            continue
        out[key] = ("set" if value else "unset") if key in PATH_KEYS else repr(value)
    return out


def differing_keys(configs: Sequence[Mapping[str, Any]], ignore: Sequence[str] = ()) -> list[str]:
    """Sorted result-changing keys whose value is not the same in every config."""
    flat = [settings(c, ignore) for c in configs]
    keys = set().union(*flat) if flat else set()
    return sorted(k for k in keys if len({f.get(k, "unset") for f in flat}) > 1)


def variant_names(
    items: Sequence[T],
    config_of: Callable[[T], Mapping[str, Any]],
    group_of: Callable[[T], Hashable],
    ignore: Sequence[str] = (),
) -> list[str]:
    """For each item, what sets its config apart within its group (``group_of``: e.g. env and
    core): ``"key=value, ..."`` for each key whose value differs from the group's most common
    one; ``"-"`` for an item with the most common value everywhere, ``""`` where the
    group's configs agree. Items with the same name are seeds of one experiment (two
    different configs never get the same name: they differ in a key where at least one of
    them is not the most common). ``ignore``: keys a caller varies on purpose (a plot's x axis)."""
    groups: dict[Hashable, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(group_of(item), []).append(i)
    names = [""] * len(items)
    for members in groups.values():
        flat = [settings(config_of(items[i]), ignore) for i in members]
        keys = differing_keys([config_of(items[i]) for i in members], ignore)
        common = {k: Counter(f.get(k, "unset") for f in flat).most_common(1)[0][0] for k in keys}
        for i, values in zip(members, flat, strict=True):
            own = [k for k in keys if values.get(k, "unset") != common[k]]
            names[i] = ", ".join(f"{k}={_text(k, values.get(k))}" for k in own) if keys else ""
            names[i] = names[i] or ("-" if keys else "")
    return names


def label_with_variant(label: str, variant: str) -> str:
    """``"lstm"`` and ``"agent.n_epochs=4"`` -> ``"lstm [agent.n_epochs=4]"``."""
    return f"{label} [{variant}]" if variant not in ("", "-") else label


def seed_count(seeds: Sequence[Any]) -> str:
    """``"3"`` for three distinct seeds; ``"2 (3 runs)"`` when a seed ran twice."""
    distinct = len({str(s) for s in seeds})
    return str(distinct) if distinct == len(seeds) else f"{distinct} ({len(seeds)} runs)"


def _text(key: str, value: str | None) -> str:
    """A settings value (``repr`` text) as a reader writes it: ``0.001``, ``adjacent``."""
    if value is None:
        return "unset"
    return value[1:-1] if len(value) > 1 and value[0] == value[-1] == "'" else value
