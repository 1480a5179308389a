"""Exact rewards and successes: every memory-match variant (the transfer suites' envs), the
vector env that carries them to the trainer, and POPGym's reward scale as memcores reads it.

The expected values are the documented formulas evaluated in the test: a memory-match choice
after ``k`` phase-3 actions pays ``1 - 0.9 k / (max_steps - cue_steps - distractor_steps)``;
POPGym's card games pay ``+-1 / (number of scored steps)`` per step.
"""

from __future__ import annotations

import numpy as np
import pytest
from memory_match_helpers import plan_to_face
from minigrid.core.actions import Actions

from memcores import envs
from memcores.envs.memory_match import PHASE_DISTRACTOR, PHASE_REWARD, Apple
from memcores.envs.observation import make_env
from memcores.envs.suites import SUITES
from memcores.envs.vector import VectorEnv

VARIANTS = sorted(envs.MEMORY_MATCH_IDS)


def test_the_memory_match_suites_use_only_the_registered_variants():
    ids = {
        i
        for name in ("memory-match-room", "memory-match-delay")
        for p in SUITES[name].pairs
        for i in p
    }
    assert ids == set(VARIANTS)


def _ball_cells(env) -> dict[str, tuple[int, int]]:
    grid = env.unwrapped.grid
    return {
        obj.color: (x, y)
        for y in range(grid.height)
        for x in range(grid.width)
        if (obj := grid.get(x, y)) is not None and obj.type == "ball"
    }


def _to_phase_3(env, seed: int, cue: str | None = None) -> float:
    """Reset, then turn left until the reward room (no apple is eaten); the rewards' sum."""
    env.reset(seed=seed, options={"cue_color": cue} if cue else None)
    u = env.unwrapped
    total = 0.0
    for t in range(1, u.cue_steps + u.distractor_steps + 1):
        _, reward, terminated, truncated, info = env.step(int(Actions.left))
        assert not (terminated or truncated) and not info["success"]
        # the phase of the returned observation: the step with t = cue_steps enters phase 2
        assert info["phase"] == 1 + (t >= u.cue_steps) + (t >= u.cue_steps + u.distractor_steps)
        total += reward
    assert info["phase"] == PHASE_REWARD and u.step_count == u.cue_steps + u.distractor_steps
    return total


def _choose(env, color: str, wait: int) -> tuple[int, float, bool, bool, dict]:
    """``wait`` turns in place, then walk to the ``color`` ball and touch it: the number of
    phase-3 actions taken and the last step's reward, flags and info."""
    u = env.unwrapped
    for _ in range(wait // 2):  # left then right: back to the same heading
        for action in (Actions.left, Actions.right):
            _, reward, terminated, truncated, _ = env.step(int(action))
            assert reward == 0.0 and not (terminated or truncated)
    plan = plan_to_face(u.grid, u.agent_pos, u.agent_dir, _ball_cells(env)[color])
    for action in plan:
        _, reward, terminated, truncated, _ = env.step(action)
        assert reward == 0.0 and not (terminated or truncated)
    obs, reward, terminated, truncated, info = env.step(int(Actions.forward))
    return 2 * (wait // 2) + len(plan) + 1, reward, terminated, truncated, info


@pytest.mark.parametrize("env_id", VARIANTS)
def test_memory_match_choice_pays_the_documented_reward(env_id):
    env = make_env(env_id, seed=0)
    u = env.unwrapped
    budget = u.max_steps - u.cue_steps - u.distractor_steps
    for seed, wait in ((0, 0), (1, 4)):
        assert _to_phase_3(env, seed) == 0.0
        k, reward, terminated, truncated, info = _choose(env, u.cue_color, wait)
        assert terminated and not truncated and info["success"]
        assert reward == pytest.approx(1.0 - 0.9 * k / budget, abs=1e-12)
    # a wrong ball ends the episode with nothing
    _to_phase_3(env, 2, cue=u.colors[0])
    _, reward, terminated, truncated, info = _choose(env, u.colors[1], 0)
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)


def test_memory_match_reward_counts_phase_3_actions_only():
    """Adjacent layout, cue straight ahead: the first action can be the choice (k = 1)."""
    env = make_env("memcores/PassiveVisualMatch-v0", seed=0, reward_layout="adjacent")
    u = env.unwrapped
    for seed in range(6):
        _to_phase_3(env, seed)
        if _ball_cells(env)[u.cue_color] == tuple(u.front_pos):
            break
    else:
        pytest.fail("no seed put the cue ball in front of the agent")
    _, reward, terminated, _, info = env.step(int(Actions.forward))
    assert terminated and info["success"]
    assert reward == pytest.approx(1.0 - 0.9 / (u.max_steps - 5 - 30))


def test_memory_match_time_out_pays_nothing_and_is_not_a_success():
    env = make_env("memcores/PassiveVisualMatch-v0", seed=0, distractor_steps=3, max_steps=12)
    _to_phase_3(env, 0)
    flags = []
    for _ in range(12 - 8):  # phase 3 starts after 5 + 3 actions
        _, reward, terminated, truncated, info = env.step(int(Actions.left))
        assert reward == 0.0 and not terminated and not info["success"]
        flags.append(truncated)
    assert flags == [False, False, False, True]


def test_memory_match_pickup_chooses_like_forward_and_the_last_step_still_terminates():
    """Touching a ball with ``pickup`` is a choice too; a choice on the very last allowed step
    terminates (not truncated) and pays the floor ``1 - 0.9 B / B = 0.1``."""
    env = make_env("memcores/PassiveVisualMatch-v0", seed=0, reward_layout="adjacent")
    u = env.unwrapped
    budget = u.max_steps - u.cue_steps - u.distractor_steps
    for seed in range(8):
        _to_phase_3(env, seed)
        if _ball_cells(env)[u.cue_color] == tuple(u.front_pos):
            break
    for _ in range((budget - 1) // 2):  # wait, facing the cue ball again after each pair
        env.step(int(Actions.left))
        env.step(int(Actions.right))
    if (budget - 1) % 2:
        env.step(int(Actions.drop))  # a no-op: nothing is carried
    assert u.step_count == u.max_steps - 1
    _, reward, terminated, truncated, info = env.step(int(Actions.pickup))
    assert (terminated, truncated, info["success"]) == (True, False, True)
    assert reward == pytest.approx(0.1, abs=1e-12)


def test_the_env_itself_reports_phase_and_success_in_its_info():
    """Without memcores' wrappers: every step's info is exactly ``{phase, success}``, success
    a bool that is True only at the right choice."""
    import gymnasium as gym

    env = gym.make("memcores/PassiveVisualMatch-v0").unwrapped
    _, info = env.reset(seed=0)
    assert info == {"phase": 1, "success": False}
    infos = []
    for _ in range(env.cue_steps + env.distractor_steps):
        infos.append(env.step(int(Actions.left))[4])
    assert all(i["success"] is False for i in infos) and infos[-1] == {"phase": 3, "success": False}
    plan = plan_to_face(env.grid, env.agent_pos, env.agent_dir, _ball_cells(env)[env.cue_color])
    for action in plan:
        assert env.step(action)[4] == {"phase": 3, "success": False}
    assert env.step(int(Actions.forward))[4] == {"phase": 3, "success": True}


def test_passive_cue_phase_freezes_the_agent():
    env = make_env("memcores/PassiveVisualMatch-v0", seed=0)
    env.reset(seed=0)
    u = env.unwrapped
    pose = (tuple(u.agent_pos), u.agent_dir)
    for action in (Actions.forward, Actions.left, Actions.pickup, Actions.toggle):
        env.step(int(action))
        assert (tuple(u.agent_pos), u.agent_dir) == pose and u.grid.get(*u.front_pos) is not None


@pytest.mark.parametrize("apple_reward", [0.1, 0.5])
def test_apples_pay_exactly_apple_reward_each_in_phase_2_only(apple_reward):
    """Walk into every apple in front; each bite pays ``apple_reward`` and nothing else pays."""
    env = make_env(
        "memcores/PassiveVisualMatch-v0", seed=0, apple_reward=apple_reward, apple_density=0.6
    )
    u = env.unwrapped
    eaten = 0
    for seed in range(3):
        _, info = env.reset(seed=seed)
        while True:
            phase = info["phase"]
            apple_ahead = phase == PHASE_DISTRACTOR and isinstance(u.grid.get(*u.front_pos), Apple)
            free_ahead = u.grid.get(*u.front_pos) is None
            action = Actions.forward if apple_ahead or free_ahead else Actions.left
            if apple_ahead and eaten % 2:
                action = Actions.pickup  # eats the apple without moving
            before, pos = u.apples_eaten, tuple(u.agent_pos)
            cell = tuple(u.front_pos)
            _, reward, terminated, truncated, info = env.step(int(action))
            if phase == PHASE_DISTRACTOR and apple_ahead:
                assert u.apples_eaten == before + 1 and reward == apple_reward
                assert u.grid.get(*cell) is None or info["phase"] != PHASE_DISTRACTOR
                moved = tuple(u.agent_pos) == cell
                assert moved == (action == Actions.forward) or info["phase"] != PHASE_DISTRACTOR
                assert moved or tuple(u.agent_pos) == pos or info["phase"] != PHASE_DISTRACTOR
                eaten += 1
            elif not terminated:
                assert reward == 0.0 and u.apples_eaten == before
            if info["phase"] == PHASE_REWARD:
                break
    assert eaten >= 3


def test_vector_env_reports_the_choice_reward_and_success_once():
    """The vector env passes the env's reward and success through, and resets in that step."""
    env_id, seed = "memcores/PassiveVisualMatch-v0", 4
    ref = make_env(env_id, seed=seed)
    vec = VectorEnv(env_id, 1, seed=seed)
    try:
        vec.reset(seed=seed)
        _to_phase_3(ref, seed)
        u = ref.unwrapped
        for _ in range(u.cue_steps + u.distractor_steps):
            _, reward, done, success = vec.step(np.array([int(Actions.left)]))
            assert reward[0] == 0.0 and not done[0] and not success[0]
        plan = plan_to_face(u.grid, u.agent_pos, u.agent_dir, _ball_cells(ref)[u.cue_color])
        for action in [*plan, int(Actions.forward)]:
            _, expected, terminated, _, info = ref.step(action)
            _, reward, done, success = vec.step(np.array([action]))
            assert reward[0] == expected and done[0] == terminated and success[0] == terminated
        assert success[0] and expected > 0.1
        _, reward, done, success = vec.step(np.array([int(Actions.left)]))  # a new episode
        assert reward[0] == 0.0 and not done[0] and not success[0]
    finally:
        vec.close()


# ---------------------------------------------------------------------------- POPGym
def _card_episode(env_id: str, right: bool) -> list[float]:
    """One episode of a POPGym card game through make_env: the suit is the first 4 entries of
    the observation vector; answer the suit the task asks for (or a wrong one)."""
    env = make_env(env_id, seed=0, prev_reward=True)
    k = getattr(env.unwrapped, "k", None)  # RepeatPrevious: the suit of k steps ago
    obs, _ = env.reset(seed=0)
    suits = [int(np.argmax(obs["vector"][:4]))]
    rewards: list[float] = []
    while True:
        wanted = suits[0] if k is None else suits[max(0, len(suits) - k)]
        action = wanted if right else (wanted + 1) % 4
        obs, reward, terminated, truncated, _ = env.step(action)
        assert obs["vector"][-1] == np.float32(reward)  # the previous-reward input
        assert obs["vector"][4 + action] == 1.0 and obs["vector"][8] == 0.0  # prev action
        rewards.append(reward)
        suits.append(int(np.argmax(obs["vector"][:4])))
        if terminated or truncated:
            return rewards


@pytest.mark.parametrize(
    "env_id, scored",
    [("popgym/RepeatPreviousEasy-v0", 52 - 4), ("popgym/RepeatFirstEasy-v0", 52 - 1)],
)
def test_popgym_rewards_are_scaled_to_a_unit_episode_return(env_id, scored):
    """Every scored step pays exactly ``+-1 / scored``, so a perfect episode returns 1 and an
    always-wrong one -1 (POPGym's normalisation), unchanged by memcores' wrapper."""
    for right, sign in ((True, 1.0), (False, -1.0)):
        rewards = _card_episode(env_id, right)
        paid = [r for r in rewards if r != 0.0]
        assert len(paid) == scored
        assert all(r == pytest.approx(sign / scored, abs=1e-12) for r in paid)
        assert sum(rewards) == pytest.approx(sign, abs=1e-9)


def test_step_wait_reports_a_time_out_as_done_and_needs_step_async():
    """The trainer's path (step_async / step_wait per group): ``done`` is terminated or
    truncated, ``obs`` the group's rows, and a wait without a step is refused."""
    vec = VectorEnv("memcores/PassiveVisualMatch-v0", 2, seed=0, env_kwargs={"max_steps": 36})
    try:
        vec.reset(seed=0)
        with pytest.raises(RuntimeError, match=r"step_wait\(0\) without step_async\(0\)"):
            vec.step_wait(0)
        for t in range(36):  # turning only: the time limit ends the episode (truncated)
            vec.step_async(0, np.full(2, int(Actions.left)))
            obs, reward, done, success = vec.step_wait(0)
            assert done.tolist() == [t == 35] * 2 and not success.any() and reward.sum() == 0
            assert set(obs) == set(vec.obs) and obs["image"].shape[0] == 2
    finally:
        vec.close()
