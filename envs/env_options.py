"""Which constructor options of an env are booleans, and the check of the options every env
shares: a flag gets ``True`` or ``False``, ``max_steps`` an integer >= 1.

An env built with ``prev_reward="false"`` or ``prev_reward="maybe"`` would take the string
as true: a flag must be ``True`` or ``False``. The options an env declares as booleans are
read from its constructors' signatures (a ``bool`` annotation or a ``True``/``False``
default), so every registered id is covered without a list to keep up to date.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any


@functools.cache
def bool_options(env_id: str) -> frozenset[str]:
    """The constructor options ``env_id`` declares as booleans (empty for an unknown id or
    one whose module cannot be imported here: building it reports that)."""
    import gymnasium as gym
    import minigrid  # noqa: F401  (side effect: registers MiniGrid-* and BabyAI-* ids)
    from gymnasium.envs.registration import load_env_creator

    import memcores.envs  # noqa: F401  (side effect: registers the memcores/* and popgym/* ids)

    if env_id not in gym.registry:
        return frozenset()
    entry = gym.registry[env_id].entry_point
    try:
        creator = load_env_creator(entry) if isinstance(entry, str) else entry
    except (ImportError, AttributeError):
        return frozenset()
    makers: list[Callable[..., Any]] = [creator]
    if env_id.startswith("popgym/"):  # one entry point builds every class: take its class too
        from memcores.envs.popgym_env import POPGYM_IDS

        makers.append(POPGYM_IDS[env_id])
    names: set[str] = set()
    for maker in makers:
        if not isinstance(maker, type):
            fns = [maker]
        else:
            fns = [c.__init__ for c in maker.__mro__ if "__init__" in vars(c)]
        for fn in fns:
            try:
                params = inspect.signature(fn).parameters.values()
            except (TypeError, ValueError):  # a builtin's __init__
                continue
            names.update(p.name for p in params if _is_bool(p))
    return frozenset(names)


def _is_bool(param: inspect.Parameter) -> bool:
    return param.annotation in (bool, "bool") or isinstance(param.default, bool)


def check_env_options(env_id: str, env_kwargs: Mapping[str, Any], prefix: str = "") -> None:
    """:raises ValueError: an option ``env_id`` declares as a boolean holds anything else, or
    ``max_steps`` (the episode limit every MiniGrid-API env takes) is not an integer >= 1:
    one line naming it (``prefix`` + the option's name) and the valid values."""
    steps = env_kwargs.get("max_steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise ValueError(f"{prefix}max_steps of {env_id} must be an integer >= 1, got {steps!r}")
    for key in sorted(bool_options(env_id) & set(env_kwargs)):
        value = env_kwargs[key]
        if not isinstance(value, bool):
            raise ValueError(
                f"{prefix}{key} of {env_id} is a flag: it must be true or false, got {value!r}"
            )


FLAG_TEXTS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
"""The texts a boolean option accepts (any case), besides ``True``/``False`` themselves."""


def as_flag(value: Any, where: str) -> bool:
    """``value`` as a boolean: ``True``/``False``, or one of :data:`FLAG_TEXTS` (a YAML or
    command-line ``"false"`` is not truthy text).

    :raises ValueError: anything else, naming ``where``.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in FLAG_TEXTS:
        return FLAG_TEXTS[value.lower()]
    raise ValueError(f"{where!r} must be true or false, got {value!r:.80}")
