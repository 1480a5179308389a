"""One observation format for every MiniGrid-API env, and ``make_env`` that builds it.

Every env made by :func:`make_env` (any ``MiniGrid-*`` / ``BabyAI-*`` id and the
``memcores/*`` memory-match ids) returns observations of this exact space::

    Dict(
      "image":     Box(0, 255, (7, 7, 3), uint8)     # MiniGrid's symbolic egocentric view
                                                   # (object idx, colour idx, state) per cell
      "direction": Discrete(4)                       # agent heading (0 = right, 1 = down, ...)
      "mission":   Box(0, VOCAB_SIZE - 1, (MAX_MISSION_LEN,), int64)
                                                   # mission word ids, padded with PAD = 0
    )

The mission is tokenised with a FIXED vocabulary (:data:`VOCAB`): lower-cased, split on
anything that is not a letter, each word mapped to its index in ``VOCAB`` (``UNK`` = 1 for
words not in it), truncated/padded to :data:`MAX_MISSION_LEN`. ``VOCAB`` is a constant list,
not built from data, so a policy trained on ``MiniGrid-GoToObject-6x6-N2-v0`` reads the same
ids on ``MiniGrid-GoToObject-8x8-N2-v0`` (or any other env). New words may only be APPENDED
to ``VOCAB`` (never inserted or reordered) so saved policies keep their meaning.

``info["success"]`` (bool) is present on every step: True exactly on the step that ends the
episode successfully. The rule: **success = terminated with reward > 0**, since MiniGrid pays a
positive reward only when the task is solved (goal reached, right door/object). Memory-match
envs set ``info["success"]`` themselves (they pay apple rewards without terminating; only the
terminating choice of the matching colour is a success) and the wrapper keeps their value.

The action space is MiniGrid's ``Discrete(7)`` (left, right, forward, pickup, drop, toggle,
done) on every env, including the memory-match ones.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX

from memcores.envs import fast_obs

PAD = 0
"""Mission token id used for padding."""
UNK = 1
"""Mission token id of a word that is not in :data:`VOCAB`."""

# Fixed, ordered vocabulary. Index = token id. APPEND ONLY (ids must never change).
VOCAB: tuple[str, ...] = (
    "<pad>",
    "<unk>",
    # colours (minigrid.core.constants.COLOR_NAMES) and "colour" words
    "red",
    "green",
    "blue",
    "purple",
    "yellow",
    "grey",
    "color",
    "colour",
    # object types (minigrid.core.constants.OBJECT_TO_IDX) and nouns of missions
    "door",
    "key",
    "ball",
    "box",
    "goal",
    "lava",
    "wall",
    "floor",
    "object",
    "square",
    "room",
    "rooms",
    "hallway",
    "maze",
    "opening",
    "end",
    # verbs
    "go",
    "get",
    "pick",
    "up",
    "put",
    "open",
    "unlock",
    "use",
    "fetch",
    "reach",
    "find",
    "avoid",
    "traverse",
    "must",
    "remember",
    "match",
    "matching",
    "matches",
    # function words, locations (BabyAI: "in front of you", "on your left", ...)
    "the",
    "a",
    "an",
    "to",
    "and",
    "then",
    "after",
    "you",
    "your",
    "near",
    "next",
    "of",
    "at",
    "from",
    "in",
    "on",
    "front",
    "behind",
    "left",
    "right",
    "that",
    "same",
    "as",
    "one",
    "first",
    "cue",
    "shown",
    "seen",
    "start",
)
VOCAB_SIZE: int = len(VOCAB)
"""Number of token ids (including PAD and UNK)."""
CELL_VOCAB: tuple[int, int, int] = (len(OBJECT_TO_IDX), len(COLOR_TO_IDX), len(STATE_TO_IDX))
"""Sizes of the image's three channels (object kind, colour, door state): ids lie in
``[0, CELL_VOCAB[c])``."""
MAX_MISSION_LEN: int = 48
"""Mission length in tokens (MiniGrid missions use <= 17, BabyAI levels up to ~40); longer
missions are truncated."""

WORD_TO_ID: dict[str, int] = {w: i for i, w in enumerate(VOCAB)}
assert len(WORD_TO_ID) == VOCAB_SIZE, "duplicate word in VOCAB"

SUPPORTED_PREFIXES = ("MiniGrid-", "BabyAI-", "memcores/", "popgym/")
"""Gymnasium id prefixes of the envs :func:`make_env` accepts (``popgym/*``: vector
observations, see :mod:`envs.popgym_env`)."""

_WORD_RE = re.compile(r"[a-z]+")


def tokenize(mission: str) -> np.ndarray:
    """Map a mission string to ``[MAX_MISSION_LEN]`` int64 token ids (PAD = 0, UNK = 1).

    Lower-cases, splits on anything that is not a letter, truncates to ``MAX_MISSION_LEN``:
    ``detokenize(tokenize("Go to the red ball!"))`` is ``"go to the red ball"``.
    """
    ids = [WORD_TO_ID.get(w, UNK) for w in _WORD_RE.findall(mission.lower())]
    out = np.zeros(MAX_MISSION_LEN, dtype=np.int64)
    n = min(len(ids), MAX_MISSION_LEN)
    out[:n] = ids[:n]
    return out


def detokenize(tokens: np.ndarray) -> str:
    """Inverse of :func:`tokenize` up to lower-casing and punctuation (pads dropped)."""
    return " ".join(VOCAB[int(t)] for t in tokens if int(t) != PAD)


class MissionTokens(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Replace MiniGrid's mission string by ``[MAX_MISSION_LEN]`` int64 token ids.

    ``image`` and ``direction`` pass through unchanged (copied out of the env's buffers).
    """

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ObservationWrapper.__init__(self, env)
        inner = env.observation_space
        if not isinstance(inner, spaces.Dict) or set(inner.spaces) < {"image", "direction"}:
            raise ValueError(
                f"MissionTokens needs a MiniGrid Dict observation space with 'image' and "
                f"'direction', got {inner}"
            )
        self.observation_space = spaces.Dict(
            {
                "image": inner["image"],
                "direction": spaces.Discrete(4),
                "mission": spaces.Box(0, VOCAB_SIZE - 1, shape=(MAX_MISSION_LEN,), dtype=np.int64),
            }
        )
        self._last_mission: str | None = None
        self._last_tokens = np.zeros(MAX_MISSION_LEN, dtype=np.int64)

    def observation(self, observation: dict[str, Any]) -> dict[str, Any]:
        mission = observation.get("mission", "")
        # Missions only change at reset; cache so stepping does not re-tokenise.
        if mission != self._last_mission:
            self._last_mission = mission
            self._last_tokens = tokenize(mission)
        return {
            "image": np.asarray(observation["image"], dtype=np.uint8),
            "direction": int(observation["direction"]),
            "mission": self._last_tokens.copy(),
        }


class SuccessInfo(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Add ``info["success"]`` (bool) to every reset/step info.

    If the env already reports ``info["success"]`` (memory-match envs), that value is kept.
    Otherwise success = ``terminated and reward > 0`` (MiniGrid pays only on success).
    """

    def __init__(self, env: gym.Env) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        info = dict(info)
        info.setdefault("success", False)
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        if "success" not in info:
            info["success"] = bool(terminated and reward > 0)
        return obs, reward, terminated, truncated, info


class SeedFirstReset(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Use ``seed`` on the first ``reset()`` that is not given a seed of its own.

    Later resets continue the env's seeded RNG, so the whole episode sequence is reproducible
    (the gymnasium convention). The action space is seeded too.
    """

    def __init__(self, env: gym.Env, seed: int) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, seed=seed)
        gym.Wrapper.__init__(self, env)
        self._pending_seed: int | None = seed
        self.action_space.seed(seed)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is None and self._pending_seed is not None:
            seed = self._pending_seed
        self._pending_seed = None
        return self.env.reset(seed=seed, options=options)


def supported_env_ids() -> list[str]:
    """All registered gymnasium ids :func:`make_env` accepts (after ``import envs``)."""
    _ensure_registered()
    return sorted(i for i in gym.registry if i.startswith(SUPPORTED_PREFIXES))


def _ensure_registered() -> None:
    """Importing ``minigrid`` registers its ids; importing ``envs`` registers ours."""
    import minigrid  # noqa: F401  (side effect: registration)

    import memcores.envs  # noqa: F401  (side effect: registration of memcores/* ids)


def _unknown_env_message(env_id: str) -> str:
    ids = supported_env_ids()
    close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    listed = [i for i in ids if not i.startswith(("BabyAI-", "popgym/"))]
    n_babyai = sum(i.startswith("BabyAI-") for i in ids)
    n_popgym = sum(i.startswith("popgym/") for i in ids)
    return (
        f"unknown env id {env_id!r}.{hint} Registered MiniGrid/memcores ids: "
        f"{', '.join(listed)} (and {n_babyai} BabyAI-* and {n_popgym} popgym/* ids; "
        "see `memcores list envs`)."
    )


def _wfc_available() -> bool:
    import minigrid

    return (Path(minigrid.__file__).parent / "envs" / "wfc" / "patterns").is_dir()


def unavailable_reason(env_id: str) -> str | None:
    """Why a registered env cannot be built on this install (``memcores list envs`` marks
    it), or ``None``. Unknown ids are :func:`envs.make_env`'s to report."""
    if env_id.startswith("MiniGrid-") and "WFC" in env_id and not _wfc_available():
        return "minigrid's WFC pattern files are not installed"
    return None


def make_env(
    env_id: str,
    seed: int | None = None,
    render_mode: str | None = None,
    **env_kwargs: Any,
) -> gym.Env:
    """Build a MiniGrid-API env with the memcores observation format.

    :param env_id: a ``MiniGrid-*``, ``BabyAI-*`` or ``memcores/*`` gymnasium id, e.g.
        ``"MiniGrid-DoorKey-5x5-v0"`` or ``"memcores/PassiveVisualMatch-v0"``.
    :param seed: if given, the first ``reset()`` without an explicit seed uses it (and the
        action space is seeded), so the episode sequence is reproducible.
    :param render_mode: ``None``, ``"rgb_array"`` (``render()`` -> ``[H, W, 3]`` uint8) or
        ``"human"``.
    :param env_kwargs: passed to the env constructor (``max_steps``, ``room_size``, ...).
    :return: env whose observation space is ``Dict(image [7,7,3] uint8, direction
        Discrete(4), mission [MAX_MISSION_LEN] int64)``, action space ``Discrete(7)``, and
        ``info["success"]`` on every step.
    :raises ValueError: unknown / unsupported id (the message lists the valid ids and close
        matches), an id this install cannot build (:func:`unavailable_reason`),
        or constructor options the env does not take.

    ``popgym/*`` ids return ``Dict(vector=Box(n,))`` observations and their own action space
    instead (:func:`envs.popgym_env.make_popgym`).
    """
    _ensure_registered()
    if env_id not in gym.registry:
        raise ValueError(_unknown_env_message(env_id))
    why = unavailable_reason(env_id)  # e.g. missing data files: say so, not what is missing
    if why:
        raise ValueError(f"env {env_id!r} is unavailable: {why} (see `memcores list envs`)")
    from memcores.envs.env_options import check_env_options

    check_env_options(env_id, env_kwargs)
    if env_id.startswith("popgym/"):
        from memcores.envs.popgym_env import make_popgym

        env = make_popgym(env_id, **env_kwargs)
        return SeedFirstReset(env, seed) if seed is not None else env
    if not env_id.startswith(SUPPORTED_PREFIXES):
        raise ValueError(
            f"env id {env_id!r} is not a MiniGrid-API env; make_env supports ids starting "
            f"with {', '.join(SUPPORTED_PREFIXES)} (see `memcores list envs`)."
        )
    try:
        env = gym.make(env_id, render_mode=render_mode, **env_kwargs)
    except TypeError as exc:
        raise ValueError(f"bad options for {env_id!r} {sorted(env_kwargs)}: {exc}") from exc
    fast_obs.install(env)  # same observations as MiniGrid's gen_obs, computed faster
    env = MissionTokens(env)
    env = SuccessInfo(env)
    if seed is not None:
        env = SeedFirstReset(env, seed)
    return env
