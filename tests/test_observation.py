"""The memcores observation contract of ``envs.make_env`` (shared by every RL env)."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from memcores import envs
from memcores.envs.observation import (
    MAX_MISSION_LEN,
    PAD,
    UNK,
    VOCAB,
    VOCAB_SIZE,
    WORD_TO_ID,
    detokenize,
    make_env,
    supported_env_ids,
    tokenize,
)

MINIGRID_IDS = [
    "MiniGrid-DoorKey-5x5-v0",
    "MiniGrid-MemoryS7-v0",
    "MiniGrid-GoToObject-6x6-N2-v0",
    "MiniGrid-Fetch-5x5-N2-v0",
    "MiniGrid-LockedRoom-v0",
]
MEMORY_IDS = ["memcores/PassiveVisualMatch-v0", "memcores/ActiveVisualMatch-v0"]


def _check_space(env) -> None:
    space = env.observation_space
    assert isinstance(space, spaces.Dict)
    assert set(space.spaces) == {"image", "direction", "mission"}
    assert space["image"] == spaces.Box(0, 255, (7, 7, 3), np.uint8)
    assert space["direction"] == spaces.Discrete(4)
    assert space["mission"] == spaces.Box(0, VOCAB_SIZE - 1, (MAX_MISSION_LEN,), np.int64)
    assert env.action_space == spaces.Discrete(7)


@pytest.mark.parametrize("env_id", MINIGRID_IDS + MEMORY_IDS)
def test_space_and_observations(env_id: str) -> None:
    env = make_env(env_id, seed=0)
    _check_space(env)
    obs, info = env.reset()
    assert env.observation_space.contains(obs), obs
    assert info["success"] is False
    assert (obs["mission"] != PAD).any() and not (obs["mission"] == UNK).any()
    for _ in range(20):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
        assert isinstance(info["success"], bool)
        if terminated or truncated:
            obs, info = env.reset()
    env.close()


def test_namespace_exports() -> None:
    assert envs.make_env is make_env
    assert envs.VOCAB is VOCAB and envs.VOCAB_SIZE == len(VOCAB)
    ids = supported_env_ids()
    for env_id in MEMORY_IDS + MINIGRID_IDS:
        assert env_id in ids


def test_vocabulary_is_fixed_and_covers_minigrid_missions() -> None:
    assert VOCAB[PAD] == "<pad>" and VOCAB[UNK] == "<unk>"
    assert len(set(VOCAB)) == VOCAB_SIZE
    # The first ids are frozen: saved policies depend on them.
    assert VOCAB[2:8] == ("red", "green", "blue", "purple", "yellow", "grey")
    for word in ("the", "a", "to", "go", "pick", "up", "open", "door", "key", "ball", "box"):
        assert word in WORD_TO_ID
    # Missions sampled from many MiniGrid envs contain no unknown word.
    for env_id in MINIGRID_IDS + ["MiniGrid-RedBlueDoors-6x6-v0", "MiniGrid-PutNear-6x6-N2-v0"]:
        env = make_env(env_id, seed=1)
        for _ in range(5):
            obs, _ = env.reset()
            assert UNK not in obs["mission"], detokenize(obs["mission"])
        env.close()


def test_same_ids_across_grid_sizes() -> None:
    """A mission reads the same on GoToObject-6x6 and -8x8 (fixed vocabulary)."""
    seen: dict[str, np.ndarray] = {}
    for env_id in ("MiniGrid-GoToObject-6x6-N2-v0", "MiniGrid-GoToObject-8x8-N2-v0"):
        env = make_env(env_id, seed=0)
        for _ in range(30):
            obs, _ = env.reset()
            text = env.unwrapped.mission
            tokens = obs["mission"]
            assert np.array_equal(tokens, tokenize(text))
            if text in seen:
                assert np.array_equal(seen[text], tokens)
            seen[text] = tokens
        env.close()
    assert tokenize("go to the red ball")[:5].tolist() == [
        WORD_TO_ID[w] for w in ("go", "to", "the", "red", "ball")
    ]


def test_tokenize_pads_truncates_and_marks_unknown() -> None:
    t = tokenize("Get the YELLOW key, unlock the zorblax door")
    assert t.dtype == np.int64 and t.shape == (MAX_MISSION_LEN,)
    assert detokenize(t) == "get the yellow key unlock the <unk> door"
    assert (t[8:] == PAD).all()
    long = tokenize(" ".join(["go"] * (MAX_MISSION_LEN + 10)))
    assert (long == WORD_TO_ID["go"]).all()
    assert (tokenize("") == PAD).all()


def test_success_rule_minigrid() -> None:
    """success == terminated with reward > 0: walk straight to the goal of Empty-5x5."""
    env = make_env("MiniGrid-Empty-5x5-v0", seed=0)
    env.reset()
    forward, right = 2, 1
    # Agent starts at (1, 1) facing right; goal at (3, 3).
    actions = [forward, forward, right, forward, forward]
    for i, a in enumerate(actions):
        _, reward, terminated, truncated, info = env.step(a)
        if i < len(actions) - 1:
            assert not terminated and info["success"] is False
    assert terminated and reward > 0 and info["success"] is True
    # Truncation (time out) is not success.
    env = make_env("MiniGrid-Empty-5x5-v0", seed=0, max_steps=3)
    env.reset()
    for _ in range(3):
        _, reward, terminated, truncated, info = env.step(0)
    assert truncated and not terminated and info["success"] is False


def test_seed_reproducible() -> None:
    def rollout(seed: int) -> list[np.ndarray]:
        env = make_env("MiniGrid-DoorKey-5x5-v0", seed=seed)
        out = [env.reset()[0]["image"]]
        for _ in range(30):
            obs, _, term, trunc, _ = env.step(env.action_space.sample())
            out.append(obs["image"])
            if term or trunc:
                out.append(env.reset()[0]["image"])
        return out

    a, b, c = rollout(3), rollout(3), rollout(4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=False))


def test_unknown_and_unsupported_ids() -> None:
    with pytest.raises(ValueError, match="MiniGrid-DoorKey-5x5-v0"):
        make_env("MiniGrid-DoorKey-5x6-v0")
    with pytest.raises(ValueError, match="memcores/PassiveVisualMatch-v0"):
        make_env("nonsense")
    with pytest.raises(ValueError, match="not a MiniGrid-API env"):
        make_env("CartPole-v1")
    with pytest.raises(ValueError, match="bad options"):
        make_env("MiniGrid-DoorKey-5x5-v0", no_such_option=3)


def test_rgb_render_minigrid() -> None:
    env = make_env("MiniGrid-DoorKey-5x5-v0", seed=0, render_mode="rgb_array")
    env.reset()
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3


def test_envs_package_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import memcores.envs.memory_match, memcores.envs.suites, memcores.envs.observation\n"
        "from memcores import envs\n"
        "envs.make_env('memcores/ActiveVisualMatch-v0', seed=0).reset()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.split('.')[:2] in "
        "(['memcores', 'agents'], ['memcores', 'experiments'], ['memcores', 'cores']))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_vector_env_batches_observations_and_success() -> None:
    import gymnasium as gym

    ids = ["MiniGrid-Empty-5x5-v0", "memcores/PassiveVisualMatch-v0"]
    for env_id in ids:
        vec = gym.vector.SyncVectorEnv(
            [lambda i=i, e=env_id: make_env(e, seed=i) for i in range(3)]
        )
        obs, info = vec.reset()
        assert obs["image"].shape == (3, 7, 7, 3) and obs["mission"].shape == (3, MAX_MISSION_LEN)
        assert obs["direction"].shape == (3,)
        for _ in range(10):
            obs, reward, term, trunc, info = vec.step(vec.action_space.sample())
            assert info["success"].dtype == bool and info["success"].shape == (3,)
        vec.close()
