"""POPGym envs as batched torch envs (:mod:`envs.batched`): RepeatPrevious, Autoencode,
CountRecall, NoisyPositionOnlyCartPole and MineSweeper, at every difficulty.

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

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from memcores.envs.batched import BatchedEnv, random_words

DECK = 52


def _deal_order(u: Tensor) -> Tensor:
    """``[M, C]`` uniform permutations of card indices from uniforms ``u [M, C]``."""
    return torch.argsort(u, dim=1)


class BatchedPopGym(BatchedEnv):
    """The shared part: the previous action/reward, the first-step flag and the observation
    vector of :mod:`envs.popgym_env`.

    Subclasses set :attr:`obs_size` (the game's flattened observation) and :attr:`n_actions`
    and define :meth:`_fresh_game` (the game's state at its reset), :meth:`_play` and
    :meth:`_game_obs`.
    """

    obs_size: int
    n_actions: int

    def __init__(self, n_envs: int, device: torch.device | str, prev_reward: bool) -> None:
        super().__init__(n_envs, device)
        self.prev_reward = bool(prev_reward)
        size = self.obs_size + self.action_obs_size + 1 + self.prev_reward
        self.single_observation_space = gym.spaces.Dict(
            {"vector": gym.spaces.Box(-np.inf, np.inf, shape=(size,), dtype=np.float32)}
        )
        self.single_action_space = gym.spaces.Discrete(self.n_actions)

    # ------------------------------------------------------------------ game hooks
    def _fresh_game(self, keys: Tensor, episodes: Tensor) -> dict[str, Tensor]:
        """The game's state after its reset, for envs ``keys [M]`` at ``episodes [M]``."""
        raise NotImplementedError

    def _play(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Step the game's state in place: ``(reward [N] float32, terminated, truncated)``."""
        raise NotImplementedError

    def _game_obs(self) -> Tensor:
        """The game's flattened observation, ``[N, obs_size]`` float32."""
        raise NotImplementedError

    def _action_obs(self, actions: Tensor) -> Tensor:
        """The previous action as the observation shows it: one-hot, ``[N, action_obs_size]``."""
        return torch.nn.functional.one_hot(actions, self.n_actions)

    @property
    def action_obs_size(self) -> int:
        return self.n_actions

    # ------------------------------------------------------------------ BatchedEnv
    def _fresh(self, keys: Tensor, episodes: Tensor) -> dict[str, Tensor]:
        m = keys.shape[0]
        state = self._fresh_game(keys, episodes)
        state["first"] = torch.ones(m, dtype=torch.bool, device=keys.device)
        state["last_action"] = torch.zeros(m, dtype=torch.int64, device=keys.device)
        state["last_reward"] = torch.zeros(m, dtype=torch.float32, device=keys.device)
        return state

    def _advance(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        reward, terminated, truncated = self._play(actions)
        s = self.state  # written in place here and in _play (a recorded step replays on it)
        s["first"].zero_()
        s["last_action"].copy_(actions)
        s["last_reward"].copy_(reward)
        return reward, terminated, truncated, torch.zeros_like(terminated)

    def _observe(self) -> dict[str, Tensor]:
        s = self.state
        first = s["first"]
        action = self._action_obs(s["last_action"])
        parts = [self._game_obs(), action * ~first.unsqueeze(1), first.unsqueeze(1)]
        vector = torch.cat([p.to(torch.float32) for p in parts], 1)
        if self.prev_reward:
            vector = torch.cat([vector, s["last_reward"].unsqueeze(1)], 1)
        return {"vector": vector}


class BatchedCardGame(BatchedPopGym):
    """A card game: ``n_decks_drawn`` shuffled decks of :attr:`n_cards` per episode, and an
    observation of one-hot parts of sizes :attr:`obs_sizes`."""

    obs_sizes: tuple[int, ...]
    n_cards: int
    n_decks_drawn = 1

    def __init__(self, n_envs: int, device: torch.device | str, prev_reward: bool) -> None:
        self.obs_size = sum(self.obs_sizes)
        super().__init__(n_envs, device, prev_reward)

    def _game_fresh(self, decks: list[Tensor]) -> dict[str, Tensor]:
        """The game's state after its reset, from ``decks`` (each ``[M, C]`` deal orders)."""
        raise NotImplementedError

    def _fresh_game(self, keys: Tensor, episodes: Tensor) -> dict[str, Tensor]:
        c = self.n_cards
        u = random_words(keys, episodes, c * self.n_decks_drawn)
        return self._game_fresh(
            [_deal_order(u[:, i * c : (i + 1) * c]) for i in range(self.n_decks_drawn)]
        )

    def _play(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        reward, terminated = self._play_cards(actions)
        return reward, terminated, torch.zeros_like(terminated)

    def _play_cards(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        """Step the game in place: ``(reward [N] float32, terminated [N])``."""
        raise NotImplementedError

    def _game_obs(self) -> Tensor:
        return torch.cat(
            [
                torch.nn.functional.one_hot(index, size)
                for index, size in zip(self._card_obs(), self.obs_sizes, strict=True)
            ],
            1,
        )

    def _card_obs(self) -> list[Tensor]:
        """The observation parts as indices, ``[N]`` each (one per :attr:`obs_sizes`)."""
        raise NotImplementedError


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

    def _play_cards(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        h = self.state["h"]
        scale = 1.0 / (self.n_cards - self.k)
        terminated = h == self.n_cards - 1
        right = actions == self._suit((h - self.k).clamp(min=0))
        reward = torch.where(right, scale, -scale) * (h >= self.k)
        h.add_(1)
        return reward.to(torch.float32), terminated

    def _card_obs(self) -> list[Tensor]:
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

    def _play_cards(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        s = self.state
        h, watch = s["h"], s["watch"]
        # Watching: deal one card. Playing: name the last card in hand, which is given back.
        right = actions == self._suit(h - 1)
        scale = 1.0 / self.n_cards
        reward = torch.where(right, scale, -scale) * ~watch
        terminated = ~watch & (h == 1)
        s["shown"].copy_(watch)  # a watching step shows the card it deals
        h.copy_(torch.where(watch, h + 1, h - 1))
        watch &= h < self.n_cards
        return reward.to(torch.float32), terminated

    def _card_obs(self) -> list[Tensor]:
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

    def _play_cards(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        s = self.state
        h = s["h"]
        asked = self._card("queries", h - 1)
        prev_count = s["counts"].gather(1, asked.unsqueeze(1)).squeeze(1)
        h = (h + 1).clamp(max=self.n_cards)
        dealt = self._card("values", h - 1)
        s["counts"].scatter_add_(1, dealt.unsqueeze(1), torch.ones_like(h).unsqueeze(1))
        s["h"].copy_(h)
        scale = 1.0 / (self.n_cards - 1)
        reward = torch.where(actions == prev_count, scale, -scale)
        return reward.to(torch.float32), h == self.n_cards

    def _card_obs(self) -> list[Tensor]:
        h = self.state["h"]
        return [self._card("values", h - 1), self._card("queries", h - 1)]


class BatchedNoisyPositionOnlyCartPole(BatchedPopGym):
    """NoisyPositionOnlyCartPole: gymnasium's cart-pole (Euler steps in float64), observed as
    cart position and pole angle plus Gaussian noise, clipped to the observation box; every
    step pays ``1 / max_episode_length``; time-out after ``max_episode_length`` steps."""

    obs_size = 2
    n_actions = 2
    # gymnasium's CartPoleEnv constants.
    GRAVITY, MASSPOLE, TOTAL_MASS, LENGTH = 9.8, 0.1, 0.1 + 1.0, 0.5
    POLEMASS_LENGTH, FORCE_MAG, TAU = 0.1 * 0.5, 10.0, 0.02
    THETA_THRESHOLD, X_THRESHOLD = 12 * 2 * math.pi / 360, 2.4
    NOISE_SLOT = 8  # random-word slots of step t's noise: NOISE_SLOT + 4 * t ..

    def __init__(
        self, n_envs: int, device: torch.device | str = "cpu", prev_reward: bool = False,
        noise_sigma: float = 0.1, max_episode_length: int = 200,
    ) -> None:  # fmt: skip
        self.noise_sigma, self.max_episode_length = float(noise_sigma), int(max_episode_length)
        super().__init__(n_envs, device, prev_reward)
        high = np.array([self.X_THRESHOLD * 2, self.THETA_THRESHOLD * 2], dtype=np.float32)
        self._high = torch.from_numpy(high).to(self.device)

    def _noise(self, keys: Tensor, episodes: Tensor, t: Tensor) -> Tensor:
        """``[M, 2]`` float32 N(0, sigma) noise of step ``t [M]`` (0: the reset), Box-Muller."""
        u = random_words(keys, episodes, 4, self.NOISE_SLOT + 4 * t).double()
        radius = torch.sqrt(-2.0 * torch.log1p(-u[:, :2]))
        normal = radius * torch.cos(2 * math.pi * u[:, 2:])
        return (normal * self.noise_sigma).to(torch.float32)

    def _noisy(self, phys: Tensor, noise: Tensor) -> Tensor:
        seen = phys[:, 0::2].to(torch.float32) + noise  # cart position, pole angle
        return torch.maximum(torch.minimum(seen, self._high), -self._high)

    def _fresh_game(self, keys: Tensor, episodes: Tensor) -> dict[str, Tensor]:
        u = random_words(keys, episodes, 4).double()
        phys = u * 0.1 - 0.05  # uniform in [-0.05, 0.05), as gymnasium's reset
        t = torch.zeros(keys.shape[0], dtype=torch.int64, device=keys.device)
        return {"phys": phys, "t": t, "seen": self._noisy(phys, self._noise(keys, episodes, t))}

    def _play(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        s = self.state
        x, x_dot, theta, theta_dot = s["phys"].unbind(1)
        force = torch.where(actions == 1, self.FORCE_MAG, -self.FORCE_MAG).double()
        costheta, sintheta = torch.cos(theta), torch.sin(theta)
        # gymnasium's expressions in its evaluation order, so float64 results agree bitwise.
        temp = (force + self.POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / self.TOTAL_MASS
        thetaacc = (self.GRAVITY * sintheta - costheta * temp) / (
            self.LENGTH * (4.0 / 3.0 - self.MASSPOLE * (costheta * costheta) / self.TOTAL_MASS)
        )
        xacc = temp - self.POLEMASS_LENGTH * thetaacc * costheta / self.TOTAL_MASS
        x = x + self.TAU * x_dot
        x_dot = x_dot + self.TAU * xacc
        theta = theta + self.TAU * theta_dot
        theta_dot = theta_dot + self.TAU * thetaacc
        phys = s["phys"].copy_(torch.stack([x, x_dot, theta, theta_dot], 1))
        terminated = (x.abs() > self.X_THRESHOLD) | (theta.abs() > self.THETA_THRESHOLD)
        t = s["t"].add_(1)
        s["seen"].copy_(self._noisy(phys, self._noise(self.keys, self.episodes, t)))
        truncated = t >= self.max_episode_length
        reward = torch.full_like(x, 1.0 / self.max_episode_length, dtype=torch.float32)
        return reward, terminated, truncated

    def _game_obs(self) -> Tensor:
        return self.state["seen"]


class BatchedMineSweeper(BatchedPopGym):
    """MineSweeper with the board hidden: each click shows the number of mines in the 3x3
    block around the clicked tile (itself included); a mine ends the episode, clicking every
    free tile wins it (POPGym's rules and rewards). The action is the tile ``row * W + col``
    (POPGym's ``MultiDiscrete([H, W])`` raveled), observed as a row and a column one-hot."""

    CLEAR, MINE, VIEWED = 0, 1, 2

    def __init__(
        self, n_envs: int, device: torch.device | str = "cpu", prev_reward: bool = False,
        difficulty: str = "easy",
    ) -> None:  # fmt: skip
        boards = {"easy": ((4, 4), 2), "medium": ((6, 6), 6), "hard": ((8, 8), 10)}
        if difficulty not in boards:
            raise ValueError(f"difficulty must be one of {', '.join(boards)}, got {difficulty!r}")
        (self.rows, self.cols), self.n_mines = boards[difficulty]
        self.n_actions = self.rows * self.cols
        self.obs_size = min(self.n_mines + 1, 10)
        self.max_episode_length = self.n_actions - self.n_mines
        self.success_reward = 1 / self.max_episode_length
        self.fail_reward = -0.5 - self.success_reward
        self.bad_action_reward = -0.5 / (self.max_episode_length - 2)
        super().__init__(n_envs, device, prev_reward)

    @property
    def action_obs_size(self) -> int:
        return self.rows + self.cols

    def _action_obs(self, actions: Tensor) -> Tensor:
        one_hot = torch.nn.functional.one_hot
        return torch.cat(
            [one_hot(actions // self.cols, self.rows), one_hot(actions % self.cols, self.cols)], 1
        )

    def _fresh_game(self, keys: Tensor, episodes: Tensor) -> dict[str, Tensor]:
        m, dev = keys.shape[0], keys.device
        order = torch.argsort(random_words(keys, episodes, self.n_actions), dim=1)
        hidden = torch.zeros(m, self.n_actions, dtype=torch.int64, device=dev)
        hidden.scatter_(1, order[:, : self.n_mines], self.MINE)  # mines on distinct tiles
        board = torch.nn.functional.pad(hidden.view(m, self.rows, self.cols), (1, 1, 1, 1))
        neighbours = sum(
            board[:, 1 + di : 1 + di + self.rows, 1 + dj : 1 + dj + self.cols]
            for di in (-1, 0, 1)
            for dj in (-1, 0, 1)
        )
        zero = torch.zeros(m, dtype=torch.int64, device=dev)
        return {
            "hidden": hidden,
            "neighbours": neighbours.reshape(m, -1),
            "t": zero,
            "seen": zero.clone(),
        }

    def _play(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        s = self.state
        at = actions.unsqueeze(1)
        tile = s["hidden"].gather(1, at).squeeze(1)
        mine, viewed = tile == self.MINE, tile == self.VIEWED
        reward = torch.where(
            mine, self.fail_reward, torch.where(viewed, self.bad_action_reward, self.success_reward)
        ).to(torch.float32)
        s["hidden"].scatter_(1, at, torch.where(mine | viewed, tile, self.VIEWED).unsqueeze(1))
        t = s["t"].add_(1)
        terminated = mine | (s["hidden"] != self.CLEAR).all(1)
        truncated = (t == self.max_episode_length) & ~terminated
        s["seen"].copy_(s["neighbours"].gather(1, at).squeeze(1))
        return reward, terminated, truncated

    def _game_obs(self) -> Tensor:
        return torch.nn.functional.one_hot(self.state["seen"], self.obs_size)


# id -> (class, options) of every batched POPGym env, POPGym's difficulties.
BATCHED_POPGYM: dict[str, tuple[type[BatchedPopGym], dict[str, Any]]] = {
    "popgym/RepeatPreviousEasy-v0": (BatchedRepeatPrevious, {}),
    "popgym/RepeatPreviousMedium-v0": (BatchedRepeatPrevious, {"num_decks": 2, "k": 32}),
    "popgym/RepeatPreviousHard-v0": (BatchedRepeatPrevious, {"num_decks": 3, "k": 64}),
    "popgym/AutoencodeEasy-v0": (BatchedAutoencode, {}),
    "popgym/AutoencodeMedium-v0": (BatchedAutoencode, {"num_decks": 2}),
    "popgym/AutoencodeHard-v0": (BatchedAutoencode, {"num_decks": 3}),
    "popgym/CountRecallEasy-v0": (BatchedCountRecall, {}),
    "popgym/CountRecallMedium-v0": (BatchedCountRecall, {"num_decks": 2, "deck_type": "suits"}),
    "popgym/CountRecallHard-v0": (BatchedCountRecall, {"num_decks": 4, "deck_type": "ranks"}),
    "popgym/NoisyPositionOnlyCartPoleEasy-v0": (BatchedNoisyPositionOnlyCartPole, {}),
    "popgym/NoisyPositionOnlyCartPoleMedium-v0": (
        BatchedNoisyPositionOnlyCartPole,
        {"noise_sigma": 0.2},
    ),
    "popgym/NoisyPositionOnlyCartPoleHard-v0": (
        BatchedNoisyPositionOnlyCartPole,
        {"noise_sigma": 0.3},
    ),
    "popgym/MineSweeperEasy-v0": (BatchedMineSweeper, {"difficulty": "easy"}),
    "popgym/MineSweeperMedium-v0": (BatchedMineSweeper, {"difficulty": "medium"}),
    "popgym/MineSweeperHard-v0": (BatchedMineSweeper, {"difficulty": "hard"}),
}


def make_batched_popgym(
    env_id: str, n_envs: int, device: torch.device | str, env_kwargs: dict[str, Any]
) -> BatchedPopGym:
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
