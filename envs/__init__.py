"""Gymnasium environments and supervised sequence tasks.

Importing ``envs`` registers MiniGrid's ids (``MiniGrid-*``, ``BabyAI-*``) and ours:

- ``memcores/PassiveVisualMatch-v0``, ``memcores/ActiveVisualMatch-v0`` (+ ``-Large`` and
  ``-LongDelay`` variants): three-phase memory-matching gridworlds, see
  :mod:`envs.memory_match`.
- ``popgym/<Name>-v0``: every POPGym environment (Morad et al., ICLR 2023) with a flat vector
  observation, see :mod:`envs.popgym_env`.

Use :func:`make_env` to build any of them with the memcores observation format
(:mod:`envs.observation`).
"""

from __future__ import annotations

import minigrid  # noqa: F401  (side effect: registers MiniGrid-* and BabyAI-* ids)
from gymnasium.envs.registration import register, registry

from memcores.envs.observation import MAX_MISSION_LEN, VOCAB, VOCAB_SIZE, make_env, tokenize

# Memory-match ids: id -> (entry point, constructor kwargs). Entry points are strings, so the
# module is only imported when an env is made.
MEMORY_MATCH_IDS: dict[str, tuple[str, dict]] = {
    "memcores/PassiveVisualMatch-v0": ("memcores.envs.memory_match:PassiveVisualMatchEnv", {}),
    "memcores/ActiveVisualMatch-v0": ("memcores.envs.memory_match:ActiveVisualMatchEnv", {}),
    "memcores/PassiveVisualMatch-Large-v0": (
        "memcores.envs.memory_match:PassiveVisualMatchEnv",
        {"room_size": 11},
    ),
    "memcores/ActiveVisualMatch-Large-v0": (
        "memcores.envs.memory_match:ActiveVisualMatchEnv",
        {"room_size": 11},
    ),
    "memcores/PassiveVisualMatch-LongDelay-v0": (
        "memcores.envs.memory_match:PassiveVisualMatchEnv",
        {"distractor_steps": 120},
    ),
    "memcores/ActiveVisualMatch-LongDelay-v0": (
        "memcores.envs.memory_match:ActiveVisualMatchEnv",
        {"distractor_steps": 120},
    ),
}

for _id, (_entry, _kwargs) in MEMORY_MATCH_IDS.items():
    if _id not in registry:
        register(id=_id, entry_point=_entry, kwargs=dict(_kwargs))

from memcores.envs import popgym_env  # noqa: E402, F401  (side effect: registers the popgym/* ids)

__all__ = ["MAX_MISSION_LEN", "MEMORY_MATCH_IDS", "VOCAB", "VOCAB_SIZE", "make_env", "tokenize"]
