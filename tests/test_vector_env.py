"""envs.vector.VectorEnv: same-step auto-reset, success flags, groups, and worker processes
that reproduce the in-process envs exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rl_helpers import tiny_config

from memcores.agents.rl_trainer import train
from memcores.envs import make_env
from memcores.envs.vector import VectorEnv

ENV = "MiniGrid-MemoryS7-v0"


def _rollout(env: VectorEnv, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Step ``env`` with a fixed action sequence; stack everything it returns."""
    rng = np.random.default_rng(seed)
    obs = env.reset(seed=seed)
    out = {"image": [obs["image"].copy()], "reward": [], "done": [], "success": []}
    for _ in range(steps):
        obs, reward, done, success = env.step(rng.integers(0, 3, env.num_envs))
        out["image"].append(obs["image"].copy())
        out["reward"].append(reward.copy())
        out["done"].append(done.copy())
        out["success"].append(success.copy())
    return {k: np.stack(v) for k, v in out.items()}


def test_matches_single_envs_with_same_step_reset():
    """Row i of the vector env is env i of make_env(seed + i), reset in the step that ends it."""
    n, steps = 3, 60
    vec = VectorEnv(ENV, n, seed=5, env_kwargs={"max_steps": 20})
    got = _rollout(vec, steps, seed=5)
    vec.close()
    assert got["done"].any()
    rng = np.random.default_rng(5)
    actions = [rng.integers(0, 3, n) for _ in range(steps)]
    for i in range(n):
        env = make_env(ENV, seed=5 + i, max_steps=20)
        obs, _ = env.reset(seed=5 + i)
        np.testing.assert_array_equal(got["image"][0, i], obs["image"])
        for t in range(steps):
            obs, reward, terminated, truncated, info = env.step(int(actions[t][i]))
            done = terminated or truncated
            assert got["done"][t, i] == done and got["reward"][t, i] == pytest.approx(reward)
            assert got["success"][t, i] == (done and info["success"])
            if done:
                obs, _ = env.reset()
            np.testing.assert_array_equal(got["image"][t + 1, i], obs["image"])


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_reproduce_in_process_envs(workers):
    """Worker processes over shared memory step exactly the envs the trainer's process would."""
    inline = VectorEnv(ENV, 4, seed=3, env_kwargs={"max_steps": 15})
    remote = VectorEnv(ENV, 4, seed=3, env_kwargs={"max_steps": 15}, workers=workers, groups=2)
    try:
        assert [(g.start, g.stop) for g in remote.groups] == [(0, 2), (2, 4)]
        a, b = _rollout(inline, 40), _rollout(remote, 40)
    finally:
        inline.close()
        remote.close()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_bad_env_and_worker_errors_are_clear():
    with pytest.raises(ValueError, match="workers"):
        VectorEnv(ENV, 2, seed=0, workers=-1)
    with pytest.raises(Exception, match="NoSuchEnv"):
        VectorEnv("MiniGrid-NoSuchEnv-v0", 2, seed=0, workers=1, groups=2)
    env = VectorEnv(ENV, 2, seed=0, groups=2)
    with pytest.raises(RuntimeError, match="without step_async"):
        env.step_wait(0)
    env.close()
    env.close()  # idempotent


def test_async_training_equals_sync_training(tmp_path):
    """The trainer with worker processes gives the same run as with in-process envs in two
    groups (same seed, same grouping): the pipelining changes where envs step, not what."""

    from memcores.agents import rl_trainer

    # in-process envs, but split in the same two groups as the async layout
    original = rl_trainer.make_vector_env

    def two_groups(env_id, n_envs, seed, vector="sync", env_kwargs=None, workers=1):
        return VectorEnv(env_id, n_envs, seed, env_kwargs, workers=0, groups=2)

    rl_trainer.make_vector_env = two_groups
    try:
        sync_run = train(tiny_config("train.total_steps=256"), tmp_path / "sync")
    finally:
        rl_trainer.make_vector_env = original
    async_run = train(
        tiny_config("env.vector=async", "env.workers=1", "train.total_steps=256"),
        tmp_path / "async",
    )
    assert sync_run.global_step == async_run.global_step
    for a, b in zip(sync_run.history, async_run.history, strict=True):
        for key in ("rollout/ep_rew_mean", "train/policy_loss", "train/value_loss"):
            assert a[key] == b[key] or (np.isnan(a[key]) and np.isnan(b[key])), key
    sync_w = torch.load(tmp_path / "sync/checkpoints/last.pt", weights_only=True)["model"]
    async_w = torch.load(tmp_path / "async/checkpoints/last.pt", weights_only=True)["model"]
    for name in sync_w:
        torch.testing.assert_close(sync_w[name], async_w[name], rtol=0, atol=0)


def test_bench_scaling_table_measures_every_layout(tmp_path, capsys):
    """`memcores bench rl` prints, per layout and size, the env-alone rate, the trainer's rate
    and their ratio; every one is a measured positive number and the ratio is their quotient."""
    from memcores.experiments.bench.rl import scaling_table

    layouts = (("sync", 1), ("async", 1))
    rows = scaling_table((2,), 32, 1, "lstm", "cpu", str(tmp_path), layouts)
    assert [(layout.split()[0], n) for layout, n, _, _ in rows] == [("sync", 2), ("async,", 2)]
    out = capsys.readouterr().out
    for layout, _n, ceiling, fps in rows:
        assert ceiling > 0 and fps > 0
        line = next(x for x in out.splitlines() if x.strip().startswith(layout))
        assert line.split()[-1] == f"{fps / ceiling:.2f}"


def test_separate_acting_policy_gives_the_same_run(tmp_path, monkeypatch):
    """The GPU layout (a CPU copy of the policy acts, the learner updates, the copy is refreshed
    after each update) is exercised on CPU by forcing the copy: the run must be identical."""
    import copy

    from memcores.agents import rl_trainer

    plain = train(tiny_config(), tmp_path / "plain")
    monkeypatch.setattr(
        rl_trainer, "acting_policy", lambda policy, device, **_: copy.deepcopy(policy)
    )
    split = train(tiny_config(), tmp_path / "split")
    a = torch.load(tmp_path / "plain/checkpoints/last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "split/checkpoints/last.pt", weights_only=True)["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)
    assert [r["train/value_loss"] for r in plain.history] == [
        r["train/value_loss"] for r in split.history
    ]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_learner_acts_on_cpu(tmp_path):
    """train.device=cuda: the learner's weights live on the GPU, acting stays on the CPU."""
    from memcores.agents import rl_trainer

    result = train(tiny_config("train.device=cuda"), tmp_path / "cuda")
    assert result.global_step == 128
    payload = torch.load(tmp_path / "cuda/checkpoints/last.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in payload["model"].values())
    policy = torch.nn.Linear(1, 1).cuda()
    assert rl_trainer.acting_policy(policy, torch.device("cuda")).weight.device.type == "cpu"


def test_overlap_collects_with_the_previous_policy_and_is_reproducible(tmp_path, monkeypatch):
    """train.overlap: rollout 0 is collected by theta_0, and rollout k >= 1 (collected while
    update k-1 runs) by theta_{k-1}, the policy from before that update; two runs with one
    seed end with identical weights."""
    from memcores.agents import learners, rollout

    acted, learned = [], []
    real_collect, real_update = rollout.collect_rollout, learners.update

    def fingerprint(module: torch.nn.Module) -> float:
        return float(sum(p.detach().double().sum() for p in module.parameters()))

    def collect(policy, *args, **kwargs):
        acted.append(fingerprint(policy))
        return real_collect(policy, *args, **kwargs)

    def update(policy, *args, **kwargs):
        learned.append(fingerprint(policy))  # the weights this update starts from
        return real_update(policy, *args, **kwargs)

    monkeypatch.setattr(rollout, "collect_rollout", collect)
    monkeypatch.setattr(learners, "update", update)  # what PPO's learner calls
    result = train(tiny_config("train.overlap=true", "train.total_steps=256"), tmp_path / "a")
    assert result.updates == 4 and result.global_step == 256
    assert len(acted) == 4 and len(learned) == 4  # no rollout collected after the last update
    assert acted[0] == learned[0]  # theta_0 both
    for k in range(1, 4):
        assert acted[k] == pytest.approx(learned[k - 1], abs=0, rel=1e-15)
    assert learned[1] != learned[0]

    monkeypatch.undo()
    train(tiny_config("train.overlap=true", "train.total_steps=256"), tmp_path / "b")
    a = torch.load(tmp_path / "a/checkpoints/last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b/checkpoints/last.pt", weights_only=True)["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)


def test_bench_update_costs_prints_one_row_per_encoder(capsys, tmp_path):
    """`memcores bench rl --update-costs --quick`: a row per encoder, a positive cost per
    minibatch size, the same numbers in its record."""
    from memcores.experiments.bench.record import read_record
    from memcores.experiments.cli import main

    assert main(["bench", "rl", "--quick", "--update-costs", "--out", str(tmp_path)]) == 0
    costs, recipe = read_record(tmp_path)["tables"]
    assert [row[0] for row in costs["rows"]] == ["onehot", "flat"]
    assert [row[0] for row in recipe["rows"]][1:] == ["update", "all"]
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.split()[:1] == ["encoder"]) + 1
    last = lines.index("", first)
    rows = {line.split()[0]: line.split()[1:] for line in lines[first:last]}
    assert set(rows) >= {"onehot", "flat"}
    assert all(
        len(v) == 2 and all(float(c) > 0 for c in v) for k, v in rows.items() if k != "encoder"
    )
    # the recommended recipe's split: positive costs, and a ceiling that follows from them
    collect = next(float(x.split()[-1]) for x in lines if x.strip().startswith("collection"))
    update_us = next(float(x.split()[-1]) for x in lines if x.strip().startswith("update "))
    ceiling = next(x for x in lines if "the update alone allows at most" in x)
    assert collect > 0 and update_us > 0
    assert int(ceiling.split()[-4]) == pytest.approx(1e6 / update_us, rel=1e-3, abs=1)
    assert recipe["rows"][1][1] == f"{update_us:.1f}"
    assert costs["rows"][0][1:] == rows["onehot"]


def test_overlap_resumed_after_an_odd_update_learns_from_collected_rollouts(tmp_path, monkeypatch):
    """Resumed after update 3, the overlapped loop learns from the rollout it just collected
    (every stored log-prob is a real one, < 0), not from the other, never-filled buffer."""
    from memcores.agents import learners

    run = tmp_path / "run"
    train(tiny_config("train.overlap=true", "train.total_steps=192"), run)  # 3 updates
    seen = []
    real_update = learners.update

    def update(policy, optimizer, buffer, *args, **kwargs):
        seen.append(bool((buffer.logprobs < 0).all()))
        return real_update(policy, optimizer, buffer, *args, **kwargs)

    monkeypatch.setattr(learners, "update", update)
    result = train(tiny_config("train.overlap=true", "train.total_steps=320"), run, resume=True)
    assert result.updates == 5 and seen == [True, True]
