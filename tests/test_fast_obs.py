"""envs/fast_obs.py: the fast observation equals MiniGrid's own gen_obs on random walks."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from minigrid.minigrid_env import MiniGridEnv

from memcores.envs import fast_obs
from memcores.envs.observation import make_env

ENVS = [
    ("MiniGrid-MemoryS7-v0", {}),
    ("MiniGrid-DoorKey-5x5-v0", {}),
    ("MiniGrid-DoorKey-8x8-v0", {}),
    ("MiniGrid-RedBlueDoors-6x6-v0", {}),
    ("MiniGrid-GoToObject-6x6-N2-v0", {}),
    ("MiniGrid-Fetch-5x5-N2-v0", {}),
    ("MiniGrid-KeyCorridorS3R1-v0", {}),
    ("MiniGrid-LavaCrossingS9N1-v0", {}),
    ("MiniGrid-DoorKey-5x5-v0", {"see_through_walls": True}),
    ("MiniGrid-Empty-5x5-v0", {"agent_view_size": 5}),
    ("memcores/PassiveVisualMatch-v0", {}),
    ("memcores/ActiveVisualMatch-v0", {}),
]


@pytest.mark.parametrize(("env_id", "kwargs"), ENVS, ids=[f"{e}{k or ''}" for e, k in ENVS])
def test_fast_obs_equals_minigrid(env_id: str, kwargs: dict) -> None:
    env = make_env(env_id, seed=0, **kwargs)
    base = env.unwrapped
    assert base.gen_obs.__func__ is fast_obs.fast_gen_obs  # make_env installed it
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    carried = doors_toggled = 0
    for _ in range(400):
        # bias towards the actions that change the map: pickup, drop, toggle
        action = int(rng.choice(7, p=[0.2, 0.2, 0.25, 0.12, 0.08, 0.15, 0.0]))
        _, _, terminated, truncated, _ = env.step(action)
        fast = fast_obs.fast_gen_obs(base)
        slow = MiniGridEnv.gen_obs(base)
        np.testing.assert_array_equal(fast["image"], slow["image"])
        assert fast["image"].dtype == slow["image"].dtype == np.uint8
        assert fast["image"].flags.c_contiguous  # as MiniGrid's: torch.from_numpy(...).view
        assert fast["direction"] == slow["direction"]
        assert fast["mission"] == slow["mission"]
        carried += base.carrying is not None
        doors_toggled += action == 5
        if terminated or truncated:
            env.reset()
    assert doors_toggled > 0
    if env_id.startswith(("MiniGrid-Fetch", "MiniGrid-DoorKey", "MiniGrid-KeyCorridor")):
        assert carried > 0  # the walk exercised the carried-object cell


def test_install_skips_custom_observations() -> None:
    class OwnObs(gym.make("MiniGrid-Empty-5x5-v0").unwrapped.__class__):
        def gen_obs(self):  # a user env with its own observation
            return super().gen_obs()

    env = OwnObs()
    assert not fast_obs.install(env)
    assert "gen_obs" not in vars(env)
    assert not fast_obs.install(gym.make("CartPole-v1"))


def test_environment_variable_keeps_minigrid_observation(monkeypatch) -> None:
    monkeypatch.setenv(fast_obs.DISABLE_VARIABLE, "1")
    env = make_env("MiniGrid-MemoryS7-v0", seed=0)
    assert "gen_obs" not in vars(env.unwrapped)


def test_fast_obs_follows_objects_changed_in_place() -> None:
    """A recoloured key or ball, or a door opened behind the agent's back, shows at once."""
    env = make_env("MiniGrid-Fetch-5x5-N2-v0", seed=3)
    base = env.unwrapped
    env.reset(seed=3)
    objects = [cell for cell in base.grid.grid if cell is not None and cell.type != "wall"]
    assert objects
    for colour in ("red", "purple"):
        for obj in objects:
            obj.color = colour
        np.testing.assert_array_equal(
            fast_obs.fast_gen_obs(base)["image"], MiniGridEnv.gen_obs(base)["image"]
        )
    env = make_env("MiniGrid-DoorKey-5x5-v0", seed=0)
    base = env.unwrapped
    env.reset(seed=0)
    (door,) = [cell for cell in base.grid.grid if cell is not None and cell.type == "door"]
    for is_open, is_locked in ((True, False), (False, False), (False, True)):
        door.is_open, door.is_locked = is_open, is_locked
        np.testing.assert_array_equal(
            fast_obs.fast_gen_obs(base)["image"], MiniGridEnv.gen_obs(base)["image"]
        )


def test_uninstall_restores_minigrid_observation() -> None:
    env = make_env("MiniGrid-DoorKey-5x5-v0", seed=0)
    env.reset(seed=0)
    fast_obs.uninstall(env)
    assert "gen_obs" not in vars(env.unwrapped)
    assert env.unwrapped.gen_obs.__func__ is MiniGridEnv.gen_obs
    fast_obs.uninstall(env)  # a second call changes nothing
    assert fast_obs.install(env)
