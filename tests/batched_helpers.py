"""Load a gymnasium env's exact state into one row of a batched env (parity tests)."""

from __future__ import annotations

import numpy as np
import torch

from memcores.envs.batched_memory_match import BatchedVisualMatch


def visual_match_state(env) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """The state of the unwrapped :class:`envs.memory_match.VisualMatchEnv` ``env`` as one
    row (``[1, ...]``) of :class:`BatchedVisualMatch`'s state."""
    n = env.room_size
    phase = env.phase - 1
    rooms = np.zeros((3, n * n + 1), np.int32)
    starts = np.zeros((3, 2), np.int64)

    def packed(grid) -> np.ndarray:  # noqa: ANN001
        enc = grid.encode().astype(np.int32)  # [x, y, (object, colour, state)]
        return (enc[..., 0] | enc[..., 1] << 8 | enc[..., 2] << 16).reshape(-1)

    rooms[phase, : n * n] = packed(env.grid)
    starts[phase] = (env.agent_pos[0] * n + env.agent_pos[1], env.agent_dir)
    for p, (grid, pos, d) in env._rooms.items():
        rooms[p - 1, : n * n] = packed(grid)
        starts[p - 1] = (pos[0] * n + pos[1], d)
    one = {
        "rooms": rooms.reshape(-1),
        "starts": starts,
        "pos": np.int64(env.agent_pos[0] * n + env.agent_pos[1]),
        "dir": np.int64(env.agent_dir),
        "phase": np.int64(phase),
        "t": np.int64(env.step_count),
        "cue": np.int64(env.colors.index(env.cue_color)),
    }
    return {k: torch.as_tensor(np.asarray(v)).unsqueeze(0) for k, v in one.items()}


def load_row(batched: BatchedVisualMatch, row: int, env) -> None:  # noqa: ANN001
    """Put ``env``'s state into row ``row`` of ``batched`` and refresh its observation."""
    batched.load_rows(torch.tensor([row]), visual_match_state(env))
    batched.obs = batched._observe()


def card_game_state(env) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """The state of an unwrapped POPGym card game just after its reset, as one row of its
    batched version (decks dealt from the end: the deal order is the reversed ``idx``)."""
    one: dict[str, np.ndarray] = {
        "first": np.bool_(True),
        "last_action": np.int64(0),
        "last_reward": np.float32(0.0),
    }
    if hasattr(env, "value_deck"):  # CountRecall
        one["values"] = env.deck_idx_type[env.value_deck.idx[::-1]]
        one["queries"] = env.deck_idx_type[env.query_deck.idx[::-1]]
        one["counts"] = env.counts.copy()
        one["h"] = np.int64(env.value_deck.hand_size("in_play"))
    else:
        player = next(iter(env.deck.hands))
        one["deal"] = env.deck.idx[::-1].copy()
        one["h"] = np.int64(env.deck.hand_size(player))
        if hasattr(env, "mode"):  # Autoencode
            one["watch"] = np.bool_(int(env.mode) == 1)
            one["shown"] = np.bool_(True)
    return {k: torch.as_tensor(np.array(v)).unsqueeze(0) for k, v in one.items()}


def cart_pole_state(env, seen: np.ndarray) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """The state of an unwrapped POPGym NoisyPositionOnlyCartPole just after its reset, whose
    (noisy) observation was ``seen [2]``, as one row of its batched version."""
    one = {
        "phys": np.asarray(env.state, np.float64),
        "t": np.int64(env.num_steps),
        "seen": np.asarray(seen, np.float32),
        "first": np.bool_(True),
        "last_action": np.int64(0),
        "last_reward": np.float32(0.0),
    }
    return {k: torch.as_tensor(np.array(v)).unsqueeze(0) for k, v in one.items()}


def mine_sweeper_state(env) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """The state of an unwrapped POPGym MineSweeper just after its reset, as one row of its
    batched version."""
    one = {
        "hidden": env.hidden_grid.reshape(-1).astype(np.int64),
        "neighbours": env.neighbor_grid.reshape(-1).astype(np.int64),
        "t": np.int64(env.timestep),
        "seen": np.int64(0),
        "first": np.bool_(True),
        "last_action": np.int64(0),
        "last_reward": np.float32(0.0),
    }
    return {k: torch.as_tensor(np.array(v)).unsqueeze(0) for k, v in one.items()}
