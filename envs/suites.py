"""Named transfer suites (train env -> test env) and the env listing of ``memcores list envs``.

A suite is a list of ``(train_env_id, test_env_id)`` pairs: train on the first, evaluate the
same policy on the second (larger grid, longer delay). Every id is a registered gymnasium id
accepted by :func:`envs.make_env`; variants of the memory-match envs are registered ids of
their own (``memcores/*-Large-v0``, ``memcores/*-LongDelay-v0``, see :mod:`envs`), so a pair
needs no extra keyword arguments.

``thesis-table7`` is Table 7 of B. Kanuparthi, "Towards Better Understanding and Improving
Optimization in Recurrent Neural Networks" (M.Sc. thesis, Université de Montréal, 2020) with
today's MiniGrid ids: the thesis names "Fetch-8x8", which MiniGrid registers only as
``MiniGrid-Fetch-8x8-N3-v0`` (3 objects; 5x5 has 2), and GoToObject's ids carry ``-N2``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym

from memcores import envs
from memcores.envs.observation import supported_env_ids, unavailable_reason
from memcores.envs.popgym_env import POPGYM_IDS
from memcores.envs.popgym_env import describe as describe_popgym


@dataclass(frozen=True)
class Suite:
    """A named set of transfer pairs.

    :param description: one line for ``memcores list suites``.
    :param pairs: ``(train_env_id, test_env_id)`` tuples.
    """

    description: str
    pairs: tuple[tuple[str, str], ...] = field(default_factory=tuple)


_TABLE7: dict[str, tuple[str, str]] = {
    "redbluedoors": ("MiniGrid-RedBlueDoors-6x6-v0", "MiniGrid-RedBlueDoors-8x8-v0"),
    "gotoobject": ("MiniGrid-GoToObject-6x6-N2-v0", "MiniGrid-GoToObject-8x8-N2-v0"),
    "memory": ("MiniGrid-MemoryS7-v0", "MiniGrid-MemoryS13-v0"),
    "gotodoor": ("MiniGrid-GoToDoor-5x5-v0", "MiniGrid-GoToDoor-8x8-v0"),
    "fetch": ("MiniGrid-Fetch-5x5-N2-v0", "MiniGrid-Fetch-8x8-N3-v0"),
    "doorkey": ("MiniGrid-DoorKey-5x5-v0", "MiniGrid-DoorKey-16x16-v0"),
}

_ROOM = (
    ("memcores/PassiveVisualMatch-v0", "memcores/PassiveVisualMatch-Large-v0"),
    ("memcores/ActiveVisualMatch-v0", "memcores/ActiveVisualMatch-Large-v0"),
)
_DELAY = (
    ("memcores/PassiveVisualMatch-v0", "memcores/PassiveVisualMatch-LongDelay-v0"),
    ("memcores/ActiveVisualMatch-v0", "memcores/ActiveVisualMatch-LongDelay-v0"),
)

# POPGym's families at Easy difficulty, trained and evaluated on the same env (POPGym scores
# max mean episodic reward on the training env; its table has no transfer).
POPGYM_EASY = (
    "popgym/RepeatPreviousEasy-v0",
    "popgym/RepeatFirstEasy-v0",
    "popgym/AutoencodeEasy-v0",
    "popgym/CountRecallEasy-v0",
    "popgym/PositionOnlyCartPoleEasy-v0",
    "popgym/NoisyPositionOnlyCartPoleEasy-v0",
    "popgym/VelocityOnlyCartPoleEasy-v0",
    "popgym/MultiarmedBanditEasy-v0",
    "popgym/HigherLowerEasy-v0",
    "popgym/BattleshipEasy-v0",
    "popgym/ConcentrationEasy-v0",
    "popgym/MineSweeperEasy-v0",
)

SUITES: dict[str, Suite] = {
    "thesis-table7": Suite(
        "Kanuparthi (2020) Table 7: train small MiniGrid, test large", tuple(_TABLE7.values())
    ),
    **{
        name: Suite(f"Table 7 row {name}: train small, test large", (pair,))
        for name, pair in _TABLE7.items()
    },
    "memory-match-room": Suite("visual match, room 7x7 -> 11x11", _ROOM),
    "memory-match-delay": Suite("visual match, distractor phase 30 -> 120 steps", _DELAY),
    "memory-match": Suite("visual match, larger room and longer delay", _ROOM + _DELAY),
    # the Passive rows of memory-match alone: one training run per trial instead of two
    "memory-match-passive": Suite(
        "passive visual match, larger room and longer delay", (_ROOM[0], _DELAY[0])
    ),
    "popgym": Suite(
        "POPGym Easy envs with discrete actions, evaluated where trained (Morad et al. 2023)",
        tuple((env_id, env_id) for env_id in POPGYM_EASY),
    ),
}
"""Suite name -> :class:`Suite`."""


def get_suite(name: str) -> Suite:
    """The suite called ``name``; ValueError listing the valid names otherwise."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; valid suites: {', '.join(SUITES)}")
    return SUITES[name]


def _memory_match_description(env_id: str) -> str:
    """One line built from the env's actual defaults (so it cannot go stale)."""
    env = gym.make(env_id).unwrapped
    kind = "shown" if not env.active else "must find"
    text = (
        f"{'Active' if env.active else 'Passive'} visual match: {kind} a coloured ball "
        f"({env.cue_steps} steps), apples ({env.distractor_steps} steps), then touch the ball "
        f"of the same colour among {env.n_colors}; {env.room_size}x{env.room_size} rooms, "
        f"max_steps {env.max_steps}"
    )
    env.close()
    return text


def list_envs() -> list[tuple[str, str]]:
    """``(env_id, one-line description)`` of every env :func:`envs.make_env` accepts.

    memcores ids first, then MiniGrid-* ids (class and options), then one summary row for the
    BabyAI-* levels. Ids used by a suite are marked with the suite names.
    """
    in_suite: dict[str, list[str]] = {}
    for name, suite in SUITES.items():
        if name in _TABLE7 or name in ("memory-match", "memory-match-passive"):
            continue  # the aggregate suites say it once
        for a, b in suite.pairs:
            for env_id in dict.fromkeys((a, b)):
                in_suite.setdefault(env_id, []).append(name)

    def mark(env_id: str) -> str:
        return f" [suite: {', '.join(in_suite[env_id])}]" if env_id in in_suite else ""

    rows = [(i, _memory_match_description(i) + mark(i)) for i in envs.MEMORY_MATCH_IDS]
    n_babyai = 0
    for env_id in supported_env_ids():
        if env_id.startswith("BabyAI-"):
            n_babyai += 1
            continue
        if not env_id.startswith("MiniGrid-"):
            continue
        spec = gym.registry[env_id]
        cls = str(spec.entry_point).rsplit(":", 1)[-1]
        opts = ", ".join(f"{k}={v}" for k, v in spec.kwargs.items())
        text = f"MiniGrid {cls}" + (f" ({opts})" if opts else "")
        why = unavailable_reason(env_id)
        if why:
            text += f" - unavailable: {why}"
        rows.append((env_id, text + mark(env_id)))
    rows.append(("BabyAI-*", f"{n_babyai} BabyAI levels (MiniGrid API; make_env accepts them)"))
    rows += [(i, describe_popgym(i) + mark(i)) for i in POPGYM_IDS]
    return rows
