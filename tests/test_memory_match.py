"""Passive/Active Visual Match: API checks, phase rules, oracle/random baselines, no leaks."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from memory_match_helpers import plan_to_face
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX

import memcores.envs  # noqa: F401  (registers memcores/* ids)
from memcores.envs.memory_match import (
    MISSION,
    PALETTE,
    PHASE_CUE,
    PHASE_DISTRACTOR,
    PHASE_REWARD,
    Apple,
)
from memcores.envs.observation import WORD_TO_ID, make_env

IDS = ["memcores/PassiveVisualMatch-v0", "memcores/ActiveVisualMatch-v0"]
FORWARD = 2
BALL = OBJECT_TO_IDX["ball"]
IDX_TO_COLOR = {v: k for k, v in COLOR_TO_IDX.items()}


def _balls_in_view(image: np.ndarray) -> list[str]:
    """Colours of the balls visible in a [7, 7, 3] symbolic view."""
    mask = image[..., 0] == BALL
    return [IDX_TO_COLOR[int(c)] for c in image[..., 1][mask]]


def _ball_cells(env) -> dict[str, tuple[int, int]]:
    grid = env.unwrapped.grid
    return {
        obj.color: (x, y)
        for y in range(grid.height)
        for x in range(grid.width)
        if (obj := grid.get(x, y)) is not None and obj.type == "ball"
    }


def _run_episode(env, choose, seed: int | None = None, explore: bool = True) -> dict:
    """Play one episode. Phase 1: read the cue colour from the observation (exploring toward
    the ball with the planner in Active); phase 2: random turns/moves; phase 3: walk to and
    touch the ball ``choose(remembered_colour, colours_present)``."""
    obs, info = env.reset(seed=seed)
    u = env.unwrapped
    rng = np.random.default_rng(seed)
    remembered = None
    plan: list[int] = []
    target = None
    while True:
        phase = info["phase"]
        if phase == PHASE_CUE:
            seen = _balls_in_view(obs["image"])
            if seen:
                remembered = seen[0]
            if remembered is None and explore:
                cue_cell = next(iter(_ball_cells(env).values()))
                path = plan_to_face(u.grid, u.agent_pos, u.agent_dir, cue_cell) or [0]
                action = path[0]
            else:
                action = 0  # turn in place
        elif phase == PHASE_DISTRACTOR:
            action = int(rng.choice([0, 1, FORWARD, FORWARD]))
        else:
            if target is None:
                cells = _ball_cells(env)
                target = cells[choose(remembered, sorted(cells), rng)]
                plan = plan_to_face(u.grid, u.agent_pos, u.agent_dir, target) + [FORWARD]
            action = plan.pop(0)
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return {
                "success": info["success"],
                "reward": reward,
                "terminated": terminated,
                "remembered": remembered,
                "cue": u.cue_color,
            }


def _oracle(remembered, present, rng):
    return remembered


def _uniform(remembered, present, rng):
    return present[int(rng.integers(len(present)))]


@pytest.mark.parametrize("env_id", IDS)
def test_gymnasium_and_sb3_check_env(env_id: str) -> None:
    from gymnasium.utils.env_checker import check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # gymnasium: the raw env (MiniGrid's mission string space) and the make_env'd env.
        check_env(gym.make(env_id, render_mode="rgb_array").unwrapped)
        check_env(make_env(env_id, seed=0), skip_render_check=True)
        # SB3 does not support text spaces, so it checks the make_env'd (tokenised) env.
        sb3_check_env(make_env(env_id, seed=0))


@pytest.mark.parametrize("env_id", IDS)
def test_oracle_that_remembers_the_cue_succeeds(env_id: str) -> None:
    env = make_env(env_id, seed=123)
    results = [_run_episode(env, _oracle, seed=s) for s in range(200)]
    success = np.mean([r["success"] for r in results])
    assert success >= 0.99, success
    for r in results:
        assert r["remembered"] == r["cue"]
        if r["success"]:
            assert 0.1 <= r["reward"] < 1.0


@pytest.mark.parametrize(
    "env_id,n_colors",
    [(IDS[0], 3), (IDS[1], 3), (IDS[0], 6)],
    ids=["passive3", "active3", "passive6"],
)
def test_uniform_choice_gets_one_over_n(env_id: str, n_colors: int) -> None:
    env = make_env(env_id, seed=0, n_colors=n_colors, distractor_steps=1, cue_steps=1)
    n = 500
    results = [_run_episode(env, _uniform, seed=1000 + s, explore=False) for s in range(n)]
    assert all(r["terminated"] for r in results)  # a choice is always made
    rate = np.mean([r["success"] for r in results])
    se = np.sqrt((1 / n_colors) * (1 - 1 / n_colors) / n)
    assert abs(rate - 1 / n_colors) < 4 * se, (rate, 1 / n_colors)
    # Wrong choices pay exactly 0.
    assert all(r["reward"] == 0.0 for r in results if not r["success"])


@pytest.mark.parametrize("apple_reward", [0.0, 0.5])
def test_apple_reward(apple_reward: float) -> None:
    env = make_env("memcores/ActiveVisualMatch-v0", seed=0, apple_reward=apple_reward)
    phase2 = []
    for s in range(30):
        _, info = env.reset(seed=s)
        for _ in range(env.unwrapped.cue_steps + env.unwrapped.distractor_steps):
            before = info["phase"]
            _, r, term, trunc, info = env.step(int(env.action_space.sample()))
            if before == PHASE_DISTRACTOR:
                phase2.append(r)
            else:
                assert r == 0.0
    phase2 = np.array(phase2)
    if apple_reward == 0:
        assert (phase2 == 0).all()
    else:
        # Apples pay exactly apple_reward each, and a random walk eats some.
        assert set(np.unique(phase2)) <= {0.0, apple_reward}
        assert phase2.sum() > 0


@pytest.mark.parametrize("env_id", IDS)
@pytest.mark.parametrize("cue_steps,distractor_steps", [(1, 1), (3, 7), (6, 25)])
def test_phase_lengths_exact(env_id: str, cue_steps: int, distractor_steps: int) -> None:
    env = make_env(env_id, seed=5, cue_steps=cue_steps, distractor_steps=distractor_steps)
    for _ in range(5):
        _, info = env.reset()
        phases = [info["phase"]]
        while True:
            _, _, term, trunc, info = env.step(env.action_space.sample())
            phases.append(info["phase"])
            if term or trunc:
                break
        phases = np.array(phases)
        assert (phases[:cue_steps] == PHASE_CUE).all()
        assert (phases[cue_steps : cue_steps + distractor_steps] == PHASE_DISTRACTOR).all()
        assert (phases[cue_steps + distractor_steps :] == PHASE_REWARD).all()
        assert len(phases) > cue_steps + distractor_steps
        assert len(phases) - 1 <= env.unwrapped.max_steps


@pytest.mark.parametrize("env_id", IDS)
def test_phase_2_and_3_observations_do_not_depend_on_the_cue(env_id: str) -> None:
    """Same seed, different cue colours: phase-1 views differ, phase-2/3 views are identical."""
    env = make_env(env_id)
    u = env.unwrapped
    for seed in range(8):
        views: dict[str, list[np.ndarray]] = {}
        cue_views: dict[str, list[np.ndarray]] = {}
        for color in u.colors:
            obs, info = env.reset(seed=seed, options={"cue_color": color})
            assert u.cue_color == color
            actions = np.random.default_rng(seed).integers(0, 3, size=u.max_steps)
            views[color], cue_views[color] = [], []
            for a in actions:
                (cue_views if info["phase"] == PHASE_CUE else views)[color].append(obs["image"])
                if info["phase"] != PHASE_CUE:
                    assert BALL not in obs["image"][..., 0] or info["phase"] == PHASE_REWARD
                obs, _, term, trunc, info = env.step(int(a))
                if term or trunc:
                    break
        ref = views[u.colors[0]]
        for color in u.colors[1:]:
            assert len(views[color]) == len(ref)
            assert all(np.array_equal(a, b) for a, b in zip(ref, views[color], strict=True))
        if env_id.startswith("memcores/Passive"):
            # The test can fail: the cue phase does show the colour.
            assert not np.array_equal(cue_views[u.colors[0]][0], cue_views[u.colors[1]][0])


def test_phase_3_shows_every_colour_once_and_mission_names_none() -> None:
    env = make_env("memcores/PassiveVisualMatch-v0", seed=0, n_colors=4, distractor_steps=1)
    for _ in range(20):
        obs, info = env.reset()
        while info["phase"] != PHASE_REWARD:
            obs, _, _, _, info = env.step(0)
        visible = _balls_in_view(obs["image"])
        assert len(set(visible)) == len(visible) and set(visible) <= set(PALETTE[:4])
        assert sorted(_ball_cells(env)) == sorted(PALETTE[:4])
        grid = env.unwrapped.grid
        assert not any(isinstance(grid.get(x, y), Apple) for x in range(7) for y in range(7))
    colour_ids = {WORD_TO_ID[c] for c in PALETTE}
    assert not colour_ids & set(obs["mission"].tolist())
    assert not any(c in MISSION for c in PALETTE)


@pytest.mark.parametrize("env_id", IDS)
def test_same_seed_same_episode(env_id: str) -> None:
    def play(seed: int) -> tuple[list, list]:
        env = make_env(env_id, seed=seed)
        obs, _ = env.reset()
        images, rewards = [obs["image"]], []
        for _ in range(200):
            obs, r, term, trunc, _ = env.step(env.action_space.sample())
            images.append(obs["image"])
            rewards.append(r)
            if term or trunc:
                obs, _ = env.reset()
                images.append(obs["image"])
        return images, rewards

    a, b, c = play(7), play(7), play(8)
    assert all(np.array_equal(x, y) for x, y in zip(a[0], b[0], strict=True)) and a[1] == b[1]
    assert not all(np.array_equal(x, y) for x, y in zip(a[0], c[0], strict=False))


@pytest.mark.parametrize("env_id", IDS)
def test_rgb_rendering(env_id: str) -> None:
    env = make_env(env_id, seed=0, render_mode="rgb_array", room_size=9)
    env.reset()
    frames = [env.render()]
    for _ in range(60):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        frames.append(env.render())
        if term or trunc:
            break
    for f in frames:
        assert f.dtype == np.uint8 and f.shape == (9 * 32, 9 * 32, 3)
    assert len({f.tobytes() for f in frames}) > 1


def test_variants_and_bad_options() -> None:
    large = make_env("memcores/PassiveVisualMatch-Large-v0").unwrapped
    long = make_env("memcores/ActiveVisualMatch-LongDelay-v0").unwrapped
    base = make_env("memcores/ActiveVisualMatch-v0").unwrapped
    assert large.room_size > 7 and long.distractor_steps > base.distractor_steps
    with pytest.raises(ValueError, match="n_colors"):
        make_env("memcores/PassiveVisualMatch-v0", n_colors=7)
    with pytest.raises(ValueError, match="max_steps"):
        make_env("memcores/PassiveVisualMatch-v0", cue_steps=5, distractor_steps=5, max_steps=10)
    with pytest.raises(ValueError, match="cue_color"):
        make_env("memcores/PassiveVisualMatch-v0").reset(options={"cue_color": "grey"})


def test_active_cue_starts_out_of_view() -> None:
    env = make_env("memcores/ActiveVisualMatch-v0", seed=0)
    hidden = 0
    for _ in range(50):
        obs, _ = env.reset()
        hidden += not _balls_in_view(obs["image"])
    assert hidden == 50


def test_bench_envs_quick(capsys: pytest.CaptureFixture[str]) -> None:
    """``memcores bench envs --quick`` prints steps/s, the ratio to MemoryS7 and the speed-up
    over MiniGrid's own observation code for every env."""
    from memcores.experiments.bench.envs import BASELINE, ENV_IDS
    from memcores.experiments.cli import main as cli_main

    assert cli_main(["bench", "envs", "--quick"]) == 0
    out = capsys.readouterr().out
    for env_id in ENV_IDS:
        line = next(x for x in out.splitlines() if x.startswith(env_id))
        sps, ratio, minigrid, speedup = (float(v.rstrip("x")) for v in line.split()[1:5])
        assert sps > 0 and ratio > 0 and minigrid > 0
        assert speedup == pytest.approx(sps / minigrid, rel=0.01, abs=0.01)
        if env_id == BASELINE:
            assert ratio == 1.0
    assert "slowest memory-match / MemoryS7" in out


@pytest.mark.parametrize(
    ("env_id", "kwargs", "horizon"),
    [
        ("memcores/PassiveVisualMatch-v0", {}, 32),
        ("memcores/PassiveVisualMatch-v0", {"distractor_steps": 5}, 7),
        ("memcores/ActiveVisualMatch-v0", {}, 15 + 30),
        ("MiniGrid-MemoryS7-v0", {}, None),
    ],
)
def test_declared_memory_horizon_gates_the_bptt_window(env_id, kwargs, horizon):
    """The trainer refuses a seq_len shorter than the env's horizon, before any file exists,
    and accepts it at the horizon or with the check switched off."""
    from memcores.agents.rl_config import RLConfig
    from memcores.agents.rl_trainer import check_bptt_window, setup
    from memcores.envs.vector import VectorEnv
    from memcores.experiments.config import load_config

    env = VectorEnv(env_id, 1, seed=0, env_kwargs=kwargs)
    assert env.memory_horizon == horizon
    env.close()
    if horizon is None:
        return
    base = [f"env.id={env_id}", "env.n_envs=1", "agent.mission=none"]
    base += [f"env.kwargs.{k}={v}" for k, v in kwargs.items()]

    def config(seq_len: int, *extra: str) -> RLConfig:
        window = [f"agent.{k}={seq_len}" for k in ("n_steps", "seq_len", "minibatch_size")]
        return load_config(RLConfig, None, [*base, *window, *extra])

    with pytest.raises(ValueError, match=f"memory horizon of {horizon} steps"):
        setup(config(horizon - 1))
    check_bptt_window(config(horizon), horizon)
    check_bptt_window(config(1, "agent.bptt_check=false"), horizon)


def test_row_layout_shows_every_ball_in_shuffled_order():
    from minigrid.core.world_object import Ball

    """reward_layout=row (default): the balls stand in the far row, evenly spaced, all in view
    of the agent, which starts facing them; the colour order varies between episodes."""
    orders = set()
    for seed in range(12):
        env = make_env("memcores/PassiveVisualMatch-v0", seed=seed, distractor_steps=1)
        env.reset(seed=seed)
        for _ in range(6):
            obs, *_ = env.step(2)
        base = env.unwrapped
        assert base.phase == 3 and base.agent_dir == 3
        row = [base.grid.get(x, 1) for x in (1, 3, 5)]
        assert all(isinstance(b, Ball) for b in row)
        orders.add(tuple(b.color for b in row))
        assert int((obs["image"][:, :, 0] == OBJECT_TO_IDX["ball"]).sum()) == 3  # all three in view
    assert len(orders) > 2


@pytest.mark.parametrize("n_colors", [2, 3])
def test_adjacent_layout_puts_one_ball_per_choice_beside_the_agent(n_colors):
    """reward_layout=adjacent: the balls stand on the agent's left / front / right cells (left
    and right for 2 colours), every colour once, order shuffled; turning then moving forward
    into a ball is the choice, and it pays only for the cue colour."""
    from minigrid.core.world_object import Ball

    orders = set()
    for seed in range(12):
        env = make_env(
            "memcores/PassiveVisualMatch-v0",
            seed=seed,
            distractor_steps=1,
            reward_layout="adjacent",
            n_colors=n_colors,
        )
        env.reset(seed=seed)
        for _ in range(6):
            env.step(2)
        base = env.unwrapped
        assert base.phase == 3 and base.agent_pos == (3, 3) and base.agent_dir == 3
        cells = [(2, 3), (4, 3)] if n_colors == 2 else [(2, 3), (3, 2), (4, 3)]
        balls = [base.grid.get(*c) for c in cells]
        assert all(isinstance(b, Ball) for b in balls)
        assert sorted(b.color for b in balls) == sorted(base.colors)
        orders.add(tuple(b.color for b in balls))
        target = cells[[b.color for b in balls].index(base.cue_color)]
        turn = {(2, 3): [0], (3, 2): [], (4, 3): [1]}[target]  # left / none / right
        for action in turn:
            env.step(action)
        _, reward, terminated, _, info = env.step(2)
        assert terminated and info["success"] and reward > 0.9
    assert len(orders) > 1
    with pytest.raises(ValueError, match="adjacent holds at most 3 colours"):
        make_env("memcores/PassiveVisualMatch-v0", reward_layout="adjacent", n_colors=4)


def test_cue_distance_moves_the_cue_to_another_view_cell():
    """cue_distance=2: every cue-phase view shows the cue ball two cells ahead (view cell
    (3, 4)) with an empty cell between, never on the cell a chosen ball occupies (3, 5)."""
    ball = OBJECT_TO_IDX["ball"]
    for seed in range(10):
        env = make_env("memcores/PassiveVisualMatch-v0", seed=seed, cue_distance=2)
        obs, _ = env.reset(seed=seed)
        base = env.unwrapped
        for _ in range(base.cue_steps):
            image = obs["image"]
            assert image[3, 4, 0] == ball and image[3, 5, 0] == OBJECT_TO_IDX["empty"]
            assert image[3, 4, 1] == COLOR_TO_IDX[base.cue_color]
            obs, *_ = env.step(2)  # frozen: forward does not move the agent
    with pytest.raises(ValueError, match="cue_distance must be in 1..4"):
        make_env("memcores/PassiveVisualMatch-v0", cue_distance=5)


def test_reveal_cue_names_the_colour_in_the_mission():
    env = make_env("memcores/PassiveVisualMatch-v0", seed=0, reveal_cue=True)
    env.reset(seed=0, options={"cue_color": "blue"})
    assert env.unwrapped.mission == "go to the blue ball"
    with pytest.raises(ValueError, match="reward_layout must be one of row, adjacent, random"):
        make_env("memcores/PassiveVisualMatch-v0", reward_layout="grid")


def test_memory_probe_finds_the_cue_in_a_fresh_core_and_learns_it_by_backprop():
    """experiments.bench.memory_probe: an untrained LSTM's state holds the cue while it is in
    view (decodable well above chance 1/3), and backpropagation with a dense label teaches
    the same encoder and core to report it one step after the delay."""
    from memcores.experiments.bench import memory_probe

    torch.manual_seed(0)
    policy, env = memory_probe._policy_and_env(
        None,
        "experiments/configs/passive_visual_match.yaml",
        ["env.kwargs.reward_layout=adjacent", "env.kwargs.distractor_steps=1"],
    )
    scores = memory_probe.decode(policy, env, episodes=90)
    assert len(scores) == 7  # 5 cue views, 1 distractor view, the first reward-room view
    assert scores[0] > 0.8
    accuracies = memory_probe.supervised(policy, env, episodes=512, updates=150)
    assert accuracies[0] < 0.6 and accuracies[-1] > 0.9


def test_memory_horizon_sweep_expands_into_valid_trials_that_span_the_cue(tmp_path) -> None:
    """sweep_memory_horizon.yaml with the grid its header documents: 3 seeds x 6 cores x 5
    delays, seeds varying slowest (a partly run sweep holds whole seed-0 curves), each trial a
    valid config whose BPTT window spans the cue at its delay."""
    from memcores.agents.rl_config import RLConfig
    from memcores.experiments.config import load_config
    from memcores.experiments.sweep import make_trials
    from tests.rl_helpers import documented_grid

    config = "experiments/configs/sweep_memory_horizon.yaml"
    grid = documented_grid(config)
    assert [k for k, _ in grid] == ["train.seed", "core.name", "env.kwargs.distractor_steps"]
    command, trials = make_trials(config, grid, tmp_path / "sweep", results_dir=tmp_path / "res")
    assert command == "train" and len(trials) == 3 * 6 * 5
    assert all("seed=0," in t.name for t in trials[:30])
    for trial in trials[::6]:
        rl = load_config(RLConfig, config, trial.overrides)
        assert rl.train.total_steps == 500_000 and rl.agent.recon_coef > 0
        env = make_env(rl.env.id, **rl.env.kwargs)
        assert env.unwrapped.memory_horizon <= rl.agent.seq_len


def test_active_visual_match_config_fine_tunes_the_passive_configs_run(tmp_path) -> None:
    """The two commands of active_visual_match.yaml's header: the Active run starts from the
    Passive run's weights (decoder included: same lags and target) at a quarter of its
    learning rate, and without the Passive run it stops with a one-line error."""
    from memcores.agents.rl_config import RLConfig
    from memcores.agents.rl_trainer import CHECKPOINT_NAME, setup
    from memcores.experiments.cli import main
    from memcores.experiments.config import load_config

    small = ["env.n_envs=2", "core.hidden_size=16", "train.total_steps=256"]
    small += ["train.progress=false", "train.device=cpu"]
    passive = tmp_path / "passive"
    config = "experiments/configs/passive_visual_match.yaml"
    assert main(["train", config, *small, f"run.dir={passive}"]) == 0
    active = "experiments/configs/active_visual_match.yaml"
    # by default it reads the folder the Passive config writes (runs/<config stem>)
    assert load_config(RLConfig, active, []).train.init_from == "runs/passive_visual_match"
    missing = [f"train.init_from={tmp_path / 'none'}", f"run.dir={tmp_path / 'missing'}"]
    assert main(["train", active, *small, *missing]) == 2
    overrides = [*small, f"train.init_from={passive}"]
    rl = load_config(RLConfig, active, overrides)
    assert rl.agent.learning_rate == load_config(RLConfig, config, []).agent.learning_rate / 4
    s = setup(rl)
    s.envs.close()
    saved = torch.load(passive / CHECKPOINT_NAME, weights_only=True)["model"]
    start = s.policy.state_dict()
    assert set(saved) == set(start) and all(torch.equal(start[k], saved[k]) for k in saved)
    assert main(["train", active, *overrides, f"run.dir={tmp_path / 'active'}"]) == 0


def test_memory_match_sweep_trains_both_tasks_with_the_recipes_that_learn_them(tmp_path):
    """sweep_memory_match.yaml with its documented grid: transfer trials on the memory-match
    suite whose Passive pair is passive_visual_match.yaml and whose Active pair is
    active_visual_match.yaml starting from the same trial's Passive run."""
    from pathlib import Path

    from memcores.agents.rl_config import RLConfig
    from memcores.experiments.config import load_config
    from memcores.experiments.sweep import make_trials
    from memcores.experiments.trials import (
        _pair_overrides,
        record_dirs,
        trial_config,
        validate_trials,
    )
    from tests.rl_helpers import documented_grid

    config = "experiments/configs/sweep_memory_match.yaml"
    grid = documented_grid(config)
    command, trials = make_trials(config, grid, tmp_path / "sweep", results_dir=tmp_path / "res")
    assert command == "transfer" and len(trials) == 5
    validate_trials(trials)
    trial = trials[-1]
    assert trial.transfer["suite"] == "memory-match" and trial.transfer["episodes"] == 200
    assert len(record_dirs(trial)) == 4
    per_pair = _pair_overrides(trial)
    passive_id, active_id = "memcores/PassiveVisualMatch-v0", "memcores/ActiveVisualMatch-v0"
    passive = trial_config(trial, tmp_path / "p", passive_id, per_pair[passive_id])
    active = trial_config(trial, tmp_path / "a", active_id, per_pair[active_id])
    for pair, recipe in (
        (passive, "experiments/configs/passive_visual_match.yaml"),
        (active, "experiments/configs/active_visual_match.yaml"),
    ):
        want = load_config(RLConfig, recipe, [])
        assert pair.agent == want.agent
        assert pair.train.total_steps == want.train.total_steps
    assert passive.train.init_from is None
    assert active.train.init_from == str(Path(trial.run_dir) / "PassiveVisualMatch")
