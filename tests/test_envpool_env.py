"""MiniGrid through EnvPool (``env.vector: envpool``): the same observations, statistics and
trained-policy results as memcores' own vector env over minigrid.

The tests that step EnvPool skip where the ``envpool`` extra is not installed; the refusal
without it is tested everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from memcores.agents.rl_config import EnvConfig
from memcores.envs import envpool_env
from memcores.envs.vector import VectorEnv
from tests.rl_helpers import tiny_config

REPO = Path(__file__).resolve().parents[1]
needs_envpool = pytest.mark.skipif(
    not envpool_env.available(), reason="envpool not installed (pip install 'memcores[envpool]')"
)
MEMORY_S7 = "MiniGrid-MemoryS7-v0"
POLICY_RUN = REPO / "results/table7/seed=0,name=lstm,suite=memory/MemoryS7"


def test_refused_without_envpool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(envpool_env, "available", lambda: False)
    with pytest.raises(ValueError, match=r"memcores\[envpool\]"):
        EnvConfig(id=MEMORY_S7, vector="envpool").validate()
    with pytest.raises(ValueError, match=r"memcores\[envpool\]"):
        envpool_env.EnvPoolVectorEnv(MEMORY_S7, 2, 0)


@needs_envpool
def test_refuses_ids_envpool_lacks() -> None:
    with pytest.raises(ValueError, match="EnvPool has no env 'memcores/PassiveVisualMatch-v0'"):
        EnvConfig(id="memcores/PassiveVisualMatch-v0", vector="envpool").validate()
    with pytest.raises(ValueError, match="only the env option max_steps"):
        envpool_env.EnvPoolVectorEnv(MEMORY_S7, 2, 0, {"size": 9})


def random_walk(envs, steps: int, seed: int) -> dict[str, np.ndarray]:
    """Step ``envs`` with uniform random actions; the observations, rewards, dones, successes."""
    rng = np.random.default_rng(seed)
    obs = envs.reset(seed=seed)
    seen: dict[str, list[np.ndarray]] = {f"obs.{k}": [v.copy()] for k, v in obs.items()}
    seen.update(reward=[], done=[], success=[])
    for _ in range(steps):
        obs, reward, done, success = envs.step(rng.integers(0, 7, envs.num_envs))
        for k, v in obs.items():
            seen[f"obs.{k}"].append(v.copy())
        for k, v in (("reward", reward), ("done", done), ("success", success)):
            seen[k].append(v.copy())
    return {k: np.stack(v) for k, v in seen.items()}


@needs_envpool
@pytest.mark.parametrize(
    "env_id", [MEMORY_S7, "MiniGrid-DoorKey-5x5-v0", "MiniGrid-GoToObject-6x6-N2-v0"]
)
def test_random_policy_sees_minigrids_observations(env_id: str) -> None:
    """Same format; the same statistics of cells, directions, missions, episode ends."""
    n, steps = 16, 400
    pool = envpool_env.EnvPoolVectorEnv(env_id, n, seed=0)
    ours = VectorEnv(env_id, n, seed=0)
    try:
        assert pool.single_observation_space == ours.single_observation_space
        a, b = random_walk(pool, steps, seed=0), random_walk(ours, steps, seed=0)
    finally:
        pool.close()
        ours.close()
    for key in a:
        assert a[key].shape == b[key].shape and a[key].dtype == b[key].dtype, key
    # every (channel, value) of the egocentric view is as frequent (within sampling noise)
    for channel in range(3):
        ca = (
            np.bincount(a["obs.image"][..., channel].ravel(), minlength=16)
            / a["obs.image"][..., channel].size
        )
        cb = (
            np.bincount(b["obs.image"][..., channel].ravel(), minlength=16)
            / b["obs.image"][..., channel].size
        )
        assert np.abs(ca - cb).max() < 0.03, (channel, ca.round(3), cb.round(3))
    # and at every position of the view (a transposed view differs by up to 1.0 here)
    kinds_a, kinds_b = a["obs.image"][..., 0], b["obs.image"][..., 0]
    for kind in np.union1d(np.unique(kinds_a), np.unique(kinds_b)):
        where_a, where_b = (kinds_a == kind).mean((0, 1)), (kinds_b == kind).mean((0, 1))
        assert np.abs(where_a - where_b).max() < 0.08, kind
    assert set(np.unique(a["obs.direction"])) == set(np.unique(b["obs.direction"]))
    # missions: the same token vocabulary (GoToObject's vary by episode)
    assert {m.tobytes() for m in a["obs.mission"][:, 0]} == {
        m.tobytes() for m in b["obs.mission"][:, 0]
    } or env_id.startswith("MiniGrid-GoToObject")
    assert set(np.unique(a["obs.mission"])) == set(np.unique(b["obs.mission"]))
    episodes_a, episodes_b = a["done"].sum(), b["done"].sum()
    assert abs(episodes_a - episodes_b) <= 4 * np.sqrt(max(episodes_a, episodes_b)) + 4
    rate_a = a["success"].sum() / max(episodes_a, 1)
    rate_b = b["success"].sum() / max(episodes_b, 1)
    assert abs(rate_a - rate_b) < 0.15, (rate_a, rate_b)
    assert ((a["reward"] > 0) == a["success"]).all()  # MiniGrid pays only on success


@needs_envpool
def test_same_step_auto_reset_and_truncation() -> None:
    """A terminal step returns the next episode's first observation; max_steps truncates."""
    pool = envpool_env.EnvPoolVectorEnv(MEMORY_S7, 8, seed=3, env_kwargs={"max_steps": 4})
    try:
        first = pool.reset(seed=3)
        assert (first["direction"] == 0).all()  # MemoryS7 starts facing right
        lengths = np.zeros(8, int)
        for _ in range(12):
            obs, _, done, _ = pool.step(np.zeros(8, int))  # turn left: never ends early
            lengths += 1
            assert (done == (lengths == 4)).all()
            assert (obs["direction"][done] == 0).all()  # already reset
            lengths[done] = 0
    finally:
        pool.close()


@needs_envpool
def test_envpool_itself_resets_on_the_next_step() -> None:
    """What the wrapper undoes: EnvPool resets an ended env on its next step (action ignored)."""
    import envpool

    pool = envpool.make_gymnasium(MEMORY_S7, num_envs=2, num_threads=1, seed=0, max_episode_steps=2)
    try:
        pool.reset()
        turn = np.zeros(2, np.int32)
        for _ in range(2):
            _, _, terminated, truncated, info = pool.step(turn)
        assert truncated.all() and not terminated.any()
        obs, reward, terminated, truncated, info = pool.step(turn)
        assert (info["elapsed_step"] == 0).all() and (obs["direction"] == 0).all()
        assert not (terminated | truncated).any() and (reward == 0).all()
    finally:
        pool.close()


@needs_envpool
def test_seeded_like_the_vector_env() -> None:
    """Env ``i`` from ``seed + i``: the same seed replays, a reset with another seed does not."""
    pool = envpool_env.EnvPoolVectorEnv(MEMORY_S7, 4, seed=5)
    try:
        a = random_walk(pool, 50, seed=5)
        b = random_walk(pool, 50, seed=5)
        c = random_walk(pool, 50, seed=6)
    finally:
        pool.close()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["obs.image"], c["obs.image"])


@needs_envpool
def test_committed_memory_s7_policy_scores_its_record_through_envpool() -> None:
    """The committed MemoryS7 lstm policy: success and return within sampling noise of its
    record (100 sampled episodes there and here)."""
    from memcores.agents.evaluation import evaluate_run

    record = json.loads((POLICY_RUN / "record.json").read_text())["eval"][MEMORY_S7]
    result = evaluate_run(POLICY_RUN / "policy.pt", MEMORY_S7, episodes=100, vector="envpool")
    assert result.episodes == 100
    # success 1.0 in the record (a policy that forgot the cue scores 0.5)
    assert result.success_rate >= record["success"] - 0.05
    assert abs(result.mean_return - record["return"]) < 0.03


@needs_envpool
def test_train_and_evaluate_select_envpool_by_one_key(tmp_path: Path) -> None:
    from memcores.agents.evaluation import evaluate_run
    from memcores.agents.rl_trainer import train

    config = tiny_config(f"env.id={MEMORY_S7}", "env.vector=envpool")
    result = train(config, tmp_path / "run")
    assert result.global_step >= 128
    evaluated = evaluate_run(tmp_path / "run", episodes=2)  # the run's env.vector: envpool
    assert evaluated.episodes == 2


def test_bench_refuses_without_envpool(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from memcores.experiments.bench import envs as bench_envs

    monkeypatch.setattr(envpool_env, "available", lambda: False)
    assert bench_envs.main(["--envpool"]) == 2
    assert "memcores[envpool]" in capsys.readouterr().err


@needs_envpool
def test_bench_rows_and_record(tmp_path: Path) -> None:
    from memcores.experiments.bench import envs as bench_envs

    out = tmp_path / "bench.json"
    argv = ["--envpool", "--sizes", "4", "--env-steps", "40", "--rounds", "1", "--out", str(out)]
    assert bench_envs.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["command"] == "memcores bench envs " + " ".join(argv)
    engines = [r["engine"] for r in record["rows"]]
    assert engines[0] == "memcores" and "envpool T2" in engines
    assert all(r["envs"] == 4 and r["steps_per_s"] > 0 for r in record["rows"])


@needs_envpool
def test_evaluate_cli_vector_option(capsys: pytest.CaptureFixture) -> None:
    from memcores.experiments.cli import main

    policy = str(POLICY_RUN / "policy.pt")
    argv = ["evaluate", policy, "--vector", "envpool", "--episodes", "4", "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 4
    lacking = ["evaluate", policy, "--vector", "envpool", "--env", "memcores/ActiveVisualMatch-v0"]
    assert main(lacking) == 2
    assert "EnvPool has no env" in capsys.readouterr().err
