"""POPGym's card games as batched torch envs (:mod:`envs.batched`): RepeatPrevious, Autoencode
and CountRecall at every difficulty.

Each is POPGym 1.0.7's game (Morad et al., "POPGym: Benchmarking Partially Observable
Reinforcement Learning", ICLR 2023, arXiv:2303.01859) for ``N`` envs, with the observation
memcores' wrapper gives it (:mod:`envs.popgym_env`: the observation one-hot, the previous
action one-hot, a first-step flag, optionally the previous reward, as one float vector).

A POPGym deck of ``C = 52 * num_decks`` cards is a shuffled order of card indices, dealt from
the end; card ``c`` has suit ``c % 4``, colour ``c % 2`` and rank ``(c // 4) % 13``. Here the
state holds the cards in the order they are dealt, ``deal [N, C]`` (a uniform permutation per
episode), and the number dealt so far, ``h [N]``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from envs.batched import BatchedEnv, random_words

DECK = 52


def _deal_order(u: Tensor) -> Tensor:
    """``[M, C]`` uniform permutations of card indices from uniforms ``u [M, C]``."""
    return torch.argsort(u, dim=1)


class BatchedCardGame(BatchedEnv):
    """The shared part: deck orders, the previous action/reward and the observation vector.

    Subclasses set :attr:`obs_sizes` (the one-hot sizes of the game's observation parts),
    :attr:`n_actions`, :attr:`n_cards`, and define :meth:`_game_fresh`, :meth:`_play` and
    :meth:`_game_obs`.
    """

    obs_sizes: tuple[int, ...]
    n_actions: int
    n_cards: int
    n_decks_drawn = 1  # shuffled decks per episode

    def __init__(self, n_envs: int, device: torch.device | str, prev_reward: bool) -> None:
        super().__init__(n_envs, device)
        self.prev_reward = bool(prev_reward)
        size = sum(self.obs_sizes) + self.n_actions + 1 + self.prev_reward
        self.single_observation_space = gym.spaces.Dict(
            {"vector": gym.spaces.Box(-np.inf, np.inf, shape=(size,), dtype=np.float32)}
        )
        self.single_action_space = gym.spaces.Discrete(self.n_actions)

    # ------------------------------------------------------------------ game hooks
    def _game_fresh(self, decks: list[Tensor]) -> dict[str, Tensor]:
        """The game's state after its reset, from ``decks`` (each ``[M, C]`` deal orders)."""
        raise NotImplementedError

    def _play(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Step the game's state in place: ``(reward [N] float32, terminated [N])``."""
        raise NotImplementedError

    def _game_obs(self) -> list[Tensor]:
        """The game's observation parts as indices, ``[N]`` each (one per :attr:`obs_sizes`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ BatchedEnv
    def _fresh(self, keys: Tensor, episodes: Tensor) -> dict[str, Tensor]:
        c, m = self.n_cards, keys.shape[0]
        u = random_words(keys, episodes, c * self.n_decks_drawn)
        decks = [_deal_order(u[:, i * c : (i + 1) * c]) for i in range(self.n_decks_drawn)]
        state = self._game_fresh(decks)
        state["first"] = torch.ones(m, dtype=torch.bool, device=keys.device)
        state["last_action"] = torch.zeros(m, dtype=torch.int64, device=keys.device)
        state["last_reward"] = torch.zeros(m, dtype=torch.float32, device=keys.device)
        return state

    def _advance(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        reward, terminated = self._play(actions)
        s = self.state
        s["first"] = torch.zeros_like(s["first"])
        s["last_action"] = actions.clone()  # the caller may reuse its tensor
        s["last_reward"] = reward.clone()  # resets write into the state in place
        no = torch.zeros_like(terminated)
        return reward, terminated, no, no

    def _observe(self) -> dict[str, Tensor]:
        s = self.state
        first = s["first"]
        parts = [
            torch.nn.functional.one_hot(index, size)
            for index, size in zip(self._game_obs(), self.obs_sizes, strict=True)
        ]
        action = torch.nn.functional.one_hot(s["last_action"], self.n_actions)
        parts.append(action * ~first.unsqueeze(1))
        parts.append(first.unsqueeze(1))
        vector = torch.cat([p.to(torch.float32) for p in parts], 1)
        if self.prev_reward:
            vector = torch.cat([vector, s["last_reward"].unsqueeze(1)], 1)
        return {"vector": vector}


class BatchedRepeatPrevious(BatchedCardGame):
    """RepeatPrevious: say the suit of the card dealt ``k`` steps ago (POPGym's rules)."""

    obs_sizes = (4,)
    n_actions = 4

    def __init__(
        self, n_envs: int, device: torch.device | str = "cpu", prev_reward: bool = False,
        num_decks: int = 1, k: int = 4,
    ) -> None:  # fmt: skip
        self.n_cards, self.k = DECK * num_decks, int(k)
        super().__init__(n_envs, device, prev_reward)
        self.min_episode_length = self.n_cards - 1  # every episode deals the whole deck

    def _game_fresh(self, decks: list[Tensor]) -> dict[str, Tensor]:
        m = decks[0].shape[0]
        return {"deal": decks[0], "h": torch.ones(m, dtype=torch.int64, device=decks[0].device)}

    def _suit(self, j: Tensor) -> Tensor:
        return self.state["deal"].gather(1, j.unsqueeze(1)).squeeze(1) % 4

    def _play(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        h = self.state["h"]
        scale = 1.0 / (self.n_cards - self.k)
        terminated = h == self.n_cards - 1
        right = actions == self._suit((h - self.k).clamp(min=0))
        reward = torch.where(right, scale, -scale) * (h >= self.k)
        self.state["h"] = h + 1
        return reward.to(torch.float32), terminated

    def _game_obs(self) -> list[Tensor]:
        return [self._suit(self.state["h"] - 1)]


class BatchedAutoencode(BatchedCardGame):
    """Autoencode: watch the deck dealt, then say its suits in reverse order (POPGym's rules)."""

    obs_sizes = (2, 4)  # mode (0 play, 1 watch), suit
    n_actions = 4

    def __init__(
        self, n_envs: int, device: torch.device | str = "cpu", prev_reward: bool = False,
        num_decks: int = 1,
    ) -> None:  # fmt: skip
        self.n_cards = DECK * num_decks
        super().__init__(n_envs, device, prev_reward)
        self.min_episode_length = 2 * self.n_cards - 1

    def _game_fresh(self, decks: list[Tensor]) -> dict[str, Tensor]:
        m, dev = decks[0].shape[0], decks[0].device
        return {
            "deal": decks[0],
            "h": torch.ones(m, dtype=torch.int64, device=dev),
            "watch": torch.ones(m, dtype=torch.bool, device=dev),
            "shown": torch.ones(m, dtype=torch.bool, device=dev),  # a dealt card is shown
        }

    def _suit(self, j: Tensor) -> Tensor:
        return self.state["deal"].gather(1, j.clamp(min=0).unsqueeze(1)).squeeze(1) % 4

    def _play(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        s = self.state
        h, watch = s["h"], s["watch"]
        # Watching: deal one card. Playing: name the last card in hand, which is given back.
        right = actions == self._suit(h - 1)
        scale = 1.0 / self.n_cards
        reward = torch.where(right, scale, -scale) * ~watch
        terminated = ~watch & (h == 1)
        s["h"] = torch.where(watch, h + 1, h - 1)
        s["watch"] = watch & (s["h"] < self.n_cards)
        s["shown"] = watch  # a watching step shows the card it deals
        return reward.to(torch.float32), terminated

    def _game_obs(self) -> list[Tensor]:
        s = self.state
        # After a reset or a watching step: the newest card's suit. After a playing step:
        # POPGym shows card 0 of the unshuffled deck, whose suit is 0.
        suit = torch.where(s["shown"], self._suit(s["h"] - 1), 0)
        return [s["watch"].to(torch.int64), suit]


class BatchedCountRecall(BatchedCardGame):
    """CountRecall: say how often the queried card value was dealt before (POPGym's rules)."""

    n_decks_drawn = 2  # the value deck, then the query deck

    def __init__(
        self, n_envs: int, device: torch.device | str = "cpu", prev_reward: bool = False,
        num_decks: int = 1, deck_type: str = "colors", error_clamp: float = 0.5,
    ) -> None:  # fmt: skip
        kinds = {"colors": 2, "suits": 4, "ranks": 13}
        if deck_type not in kinds:
            raise ValueError(f"deck_type must be one of {', '.join(kinds)}, got {deck_type!r}")
        self.n_cards, self.deck_type = DECK * num_decks, deck_type
        self.distinct = kinds[deck_type]
        self.obs_sizes = (self.distinct, self.distinct)
        self.n_actions = self.n_cards // self.distinct + 1
        super().__init__(n_envs, device, prev_reward)
        self.min_episode_length = self.n_cards - 1

    def _value_of(self, cards: Tensor) -> Tensor:
        if self.deck_type == "colors":
            return cards % 2
        if self.deck_type == "suits":
            return cards % 4
        return (cards // 4) % 13

    def _game_fresh(self, decks: list[Tensor]) -> dict[str, Tensor]:
        m, dev = decks[0].shape[0], decks[0].device
        values, queries = self._value_of(decks[0]), self._value_of(decks[1])
        counts = torch.zeros(m, self.distinct, dtype=torch.int64, device=dev)
        counts.scatter_add_(1, values[:, :1], torch.ones_like(values[:, :1]))
        return {
            "values": values,
            "queries": queries,
            "counts": counts,
            "h": torch.ones(m, dtype=torch.int64, device=dev),
        }

    def _card(self, key: str, j: Tensor) -> Tensor:
        return self.state[key].gather(1, j.unsqueeze(1)).squeeze(1)

    def _play(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        s = self.state
        h = s["h"]
        asked = self._card("queries", h - 1)
        prev_count = s["counts"].gather(1, asked.unsqueeze(1)).squeeze(1)
        h = (h + 1).clamp(max=self.n_cards)
        dealt = self._card("values", h - 1)
        s["counts"] = s["counts"].scatter_add(
            1, dealt.unsqueeze(1), torch.ones_like(h).unsqueeze(1)
        )
        s["h"] = h
        scale = 1.0 / (self.n_cards - 1)
        reward = torch.where(actions == prev_count, scale, -scale)
        return reward.to(torch.float32), h == self.n_cards

    def _game_obs(self) -> list[Tensor]:
        h = self.state["h"]
        return [self._card("values", h - 1), self._card("queries", h - 1)]


# id -> (class, options) of every batched POPGym env, POPGym's difficulties.
BATCHED_POPGYM: dict[str, tuple[type[BatchedCardGame], dict[str, Any]]] = {
    "popgym/RepeatPreviousEasy-v0": (BatchedRepeatPrevious, {}),
    "popgym/RepeatPreviousMedium-v0": (BatchedRepeatPrevious, {"num_decks": 2, "k": 32}),
    "popgym/RepeatPreviousHard-v0": (BatchedRepeatPrevious, {"num_decks": 3, "k": 64}),
    "popgym/AutoencodeEasy-v0": (BatchedAutoencode, {}),
    "popgym/AutoencodeMedium-v0": (BatchedAutoencode, {"num_decks": 2}),
    "popgym/AutoencodeHard-v0": (BatchedAutoencode, {"num_decks": 3}),
    "popgym/CountRecallEasy-v0": (BatchedCountRecall, {}),
    "popgym/CountRecallMedium-v0": (BatchedCountRecall, {"num_decks": 2, "deck_type": "suits"}),
    "popgym/CountRecallHard-v0": (BatchedCountRecall, {"num_decks": 4, "deck_type": "ranks"}),
}


def make_batched_popgym(
    env_id: str, n_envs: int, device: torch.device | str, env_kwargs: dict[str, Any]
) -> BatchedCardGame:
    """The batched ``env_id`` with ``env_kwargs`` (``prev_reward``; the Easy classes' own
    options too, as POPGym's constructors take them).

    :raises ValueError: options the env does not take.
    """
    cls, options = BATCHED_POPGYM[env_id]
    game_options = {k: v for k, v in env_kwargs.items() if k != "prev_reward"}
    if game_options and options:
        raise ValueError(f"{env_id!r} takes no options but prev_reward, got {sorted(game_options)}")
    try:
        return cls(
            n_envs, device, bool(env_kwargs.get("prev_reward", False)), **options, **game_options
        )
    except TypeError as exc:
        raise ValueError(f"bad options for {env_id!r} {sorted(env_kwargs)}: {exc}") from exc
