"""Episode bookkeeping shared by training and evaluation: running returns and lengths per env,
and the episodes that end on each step.

Both the trainer's rollout statistics (:class:`EpisodeStats`, SB3's last-100-episodes means)
and ``agents.evaluation`` (every counted episode) read finished episodes from
:class:`RunningEpisodes`, so a return is summed the same way in both.
"""

from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

import numpy as np


class Finished(NamedTuple):
    """The episodes that ended on one step: ``envs [K]`` (indices into the stepped rows),
    ``returns [K]`` and ``lengths [K]``."""

    envs: np.ndarray
    returns: np.ndarray
    lengths: np.ndarray


NONE_FINISHED = Finished(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64))
"""What :meth:`RunningEpisodes.step` returns for a step that ended no episode (shared, so
read-only)."""
for _empty in NONE_FINISHED:
    _empty.setflags(write=False)


class RunningEpisodes:
    """The return and length so far of the episode each of ``n_envs`` envs is playing."""

    def __init__(self, n_envs: int) -> None:
        self.returns = np.zeros(n_envs)
        self.lengths = np.zeros(n_envs, dtype=np.int64)

    def step(self, reward: np.ndarray, done: np.ndarray, rows: slice = slice(None)) -> Finished:
        """Account one step of the envs ``rows`` (``reward``/``done`` are ``[R]``) and return
        the episodes that ended on it; their envs start again from zero."""
        ret, length = self.returns[rows], self.lengths[rows]  # views
        ret += reward
        length += 1
        if not done.any():  # most steps end no episode: skip the indexing (rollout hot path)
            return NONE_FINISHED
        ended = np.flatnonzero(done)
        finished = Finished(ended, ret[ended].copy(), length[ended].copy())
        ret[ended] = 0.0
        length[ended] = 0
        return finished


class EpisodeStats:
    """Running episode returns/lengths per env and the last ``window`` finished episodes (100,
    as SB3's ``ep_rew_mean``)."""

    def __init__(self, n_envs: int, window: int = 100) -> None:
        self.returns: deque[float] = deque(maxlen=window)
        self.lengths: deque[float] = deque(maxlen=window)
        self.successes: deque[float] = deque(maxlen=window)
        self._running = RunningEpisodes(n_envs)

    def step(
        self,
        reward: np.ndarray,
        done: np.ndarray,
        success: np.ndarray,
        rows: slice = slice(None),
    ) -> None:
        """Account one step of the envs ``rows`` (``reward``/``done``/``success`` are ``[R]``;
        ``success`` says whether an episode that ended on this step succeeded)."""
        finished = self._running.step(reward, done, rows)
        if not finished.envs.size:
            return
        self.returns.extend(finished.returns.tolist())
        self.lengths.extend(finished.lengths.astype(float).tolist())
        self.successes.extend(np.asarray(success, dtype=float)[finished.envs].tolist())

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else math.nan

    @property
    def mean_length(self) -> float:
        return float(np.mean(self.lengths)) if self.lengths else math.nan

    @property
    def success_rate(self) -> float:
        return float(np.mean(self.successes)) if self.successes else math.nan
