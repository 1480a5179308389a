"""Which runs are seeds of one experiment: their configs compared key by key.

Reports and plots average the runs of a group over seeds. Two runs belong together only when
their configs agree on every key that can change a result; keys that only say where or how
fast a run went (its folder, the progress bar, worker processes, checkpoint interval) and the
seed itself are left out of the comparison. Runs that differ in anything else form separate
groups, named by the keys on which they differ (``agent.n_epochs=4, train.total_steps=2000000``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
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
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; empty sections stay as ``{}`` values."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def settings(config: Mapping[str, Any], ignore: Sequence[str] = ()) -> dict[str, str]:
    """The result-changing keys of ``config``, flattened, values as text (seed left out).

    :param ignore: more keys to leave out (e.g. ``train.total_steps`` when a longer budget is
        still the same run).
    """
    out = {}
    for key, value in flatten(config).items():
        if (
            is_seed_key(key)
            or key in BOOKKEEPING_KEYS
            or key in ignore
            or key.startswith(BOOKKEEPING_PREFIXES)
        ):
            continue
        out[key] = ("set" if value else "unset") if key in PATH_KEYS else repr(value)
    return out


def differing_keys(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Sorted result-changing keys whose value is not the same in every config."""
    flat = [settings(c) for c in configs]
    keys = set().union(*flat) if flat else set()
    return sorted(k for k in keys if len({f.get(k, "<unset>") for f in flat}) > 1)


def variant_names(
    items: Sequence[T],
    config_of: Callable[[T], Mapping[str, Any]],
    group_of: Callable[[T], Hashable],
) -> list[str]:
    """For each item, the keys on which it differs from the other items of its group
    (``group_of``: e.g. env and core), as ``"key=value, ..."``; ``""`` where a group's configs
    agree. Items with the same name are seeds of one experiment."""
    groups: dict[Hashable, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(group_of(item), []).append(i)
    names = [""] * len(items)
    for members in groups.values():
        configs = [config_of(items[i]) for i in members]
        keys = differing_keys(configs)
        for i, config in zip(members, configs, strict=True):
            flat = flatten(config)
            names[i] = ", ".join(f"{k}={_text(k, flat.get(k))}" for k in keys)
    return names


def seed_count(seeds: Sequence[Any]) -> str:
    """``"3"`` for three distinct seeds; ``"2 (3 runs)"`` when a seed ran twice."""
    distinct = len({str(s) for s in seeds})
    return str(distinct) if distinct == len(seeds) else f"{distinct} ({len(seeds)} runs)"


def _text(key: str, value: Any) -> str:
    if key in PATH_KEYS:
        return "set" if value else "unset"
    if value is None:
        return "unset"
    return str(value)
