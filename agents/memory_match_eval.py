"""Where a memory-match policy wins or loses: the cue phase and the choice, episode by episode.

``memcores evaluate RUN --phases`` on Passive/Active Visual Match (:mod:`envs.memory_match`)
splits the evaluation episodes by whether the cue ball was ever in the agent's view during
phase 1 (always, in Passive) and reports, for each group, how the episode ended: the matching
ball (``right``), another ball (``wrong``) or the phase-3 budget running out (``timeout``), and
the median number of phase-3 actions. A policy that holds the cue scores more when it saw it
than when it did not; one that does not find the balls in time shows it as timeouts and long
choice phases, which a plain success rate mixes up with wrong choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from minigrid.core.constants import OBJECT_TO_IDX

from memcores.agents.evaluation import check_observations, eval_envs, play_episodes
from memcores.agents.policy import RecurrentActorCritic

OUTCOMES = ("right", "wrong", "timeout")
_BALL = OBJECT_TO_IDX["ball"]


@dataclass
class PhaseBreakdown:
    """Per-episode cue sighting, outcome and phase-3 length on one memory-match env."""

    env_id: str
    cue_seen: list[bool] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)  # one of OUTCOMES per episode
    choice_steps: list[int] = field(default_factory=list)  # phase-3 actions, the choice included

    def groups(self) -> list[tuple[str, dict[str, float]]]:
        """``[(name, stats)]`` for all episodes, cue seen, cue not seen (empty groups left
        out). ``stats``: ``episodes``, the rate of each outcome, ``median_choice_steps``."""
        seen = np.array(self.cue_seen, dtype=bool)
        outcomes = np.array(self.outcomes)
        steps = np.array(self.choice_steps)
        out = []
        for name, mask in (("all", np.ones_like(seen)), ("cue seen", seen), ("not seen", ~seen)):
            if mask.any():
                stats = {"episodes": float(mask.sum())}
                stats |= {o: float(np.mean(outcomes[mask] == o)) for o in OUTCOMES}
                stats["median_choice_steps"] = float(np.median(steps[mask]))
                out.append((name, stats))
        return out

    def summary(self) -> str:
        """A small text table, one line per group."""
        lines = [
            f"{self.env_id}: {len(self.outcomes)} episodes, cue seen in phase 1 in "
            f"{np.mean(self.cue_seen):.2f} of them",
            f"{'':10s} {'episodes':>8s} {'right':>6s} {'wrong':>6s} {'timeout':>7s} "
            f"{'phase-3 steps (median)':>23s}",
        ]
        for name, s in self.groups():
            lines.append(
                f"{name:10s} {s['episodes']:8.0f} {s['right']:6.2f} {s['wrong']:6.2f} "
                f"{s['timeout']:7.2f} {s['median_choice_steps']:23.0f}"
            )
        return "\n".join(lines)


@torch.no_grad()
def phase_breakdown(
    policy: RecurrentActorCritic,
    env_id: str,
    episodes: int = 200,
    argmax: bool = False,
    seed: int = 10_000,
    n_envs: int = 8,
    env_kwargs: dict[str, Any] | None = None,
) -> PhaseBreakdown:
    """Play ``episodes`` episodes of ``policy`` (on its device) on a memory-match env and
    classify each.

    The envs step in this process, so each one's phase is read before the policy acts on its
    observation (auto-reset happens inside the step). The cue counts as seen when a ball is in
    the 7x7 view during phase 1, where the cue ball is the only ball. An episode without the
    matching ball that used the whole phase-3 budget is a timeout (a wrong ball touched on the
    very last action included).

    :raises ValueError: ``env_id`` is not a memory-match env, or its observations do not fit.
    """
    from memcores.envs.memory_match import PHASE_CUE, PHASE_REWARD, VisualMatchEnv

    envs = eval_envs(env_id, episodes, n_envs, seed, env_kwargs)
    try:
        inner = [envs.local_env(i).unwrapped for i in range(envs.num_envs)]
        if not isinstance(inner[0], VisualMatchEnv):
            raise ValueError(
                f"--phases needs a memory-match env (memcores/PassiveVisualMatch-v0, "
                f"memcores/ActiveVisualMatch-v0 and their variants), got {env_id!r}"
            )
        check_observations(policy, envs, env_id)
        budget = [e.max_steps - e.cue_steps - e.distractor_steps for e in inner]
        seen = np.zeros(envs.num_envs, dtype=bool)
        steps = np.zeros(envs.num_envs, dtype=np.int64)

        def observe(obs: dict[str, np.ndarray]) -> None:  # the phase of the obs about to be read
            for i, env in enumerate(inner):
                if env.phase == PHASE_CUE:
                    seen[i] |= bool((obs["image"][i][..., 0] == _BALL).any())
                elif env.phase == PHASE_REWARD:
                    steps[i] += 1

        result = PhaseBreakdown(env_id)
        for _, done, counted, success in play_episodes(
            policy, envs, episodes, argmax, seed, observe
        ):
            for i in np.flatnonzero(counted):
                timeout = not success[i] and steps[i] >= budget[i]
                result.cue_seen.append(bool(seen[i]))
                result.outcomes.append(
                    "right" if success[i] else ("timeout" if timeout else "wrong")
                )
                result.choice_steps.append(int(steps[i]))
            seen[done], steps[done] = False, 0
        return result
    finally:
        envs.close()
