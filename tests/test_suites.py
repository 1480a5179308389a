"""Transfer suites and env listing (``memcores list envs|suites``)."""

from __future__ import annotations

import pytest

from memcores.envs.observation import UNK, make_env
from memcores.envs.suites import SUITES, get_suite, list_envs
from memcores.experiments.cli import main as cli_main

ALL_PAIRS = sorted({pair for suite in SUITES.values() for pair in suite.pairs})


def test_table7_pairs_present() -> None:
    pairs = set(SUITES["thesis-table7"].pairs)
    assert len(pairs) == 6
    assert ("MiniGrid-DoorKey-5x5-v0", "MiniGrid-DoorKey-16x16-v0") in pairs
    assert ("MiniGrid-MemoryS7-v0", "MiniGrid-MemoryS13-v0") in pairs
    room = SUITES["memory-match-room"].pairs
    delay = SUITES["memory-match-delay"].pairs
    assert all(a.startswith("memcores/") for a, _ in room + delay)


@pytest.mark.parametrize("pair", sorted(SUITES["thesis-table7"].pairs), ids=lambda p: p[0])
def test_table7_test_env_is_the_larger_grid(pair: tuple[str, str]) -> None:
    """Transfer means train small, test large: every test grid is wider than its train grid."""
    sizes = []
    for env_id in pair:
        env = make_env(env_id)
        env.reset(seed=0)
        sizes.append(env.unwrapped.width)
        env.close()
    assert sizes[1] > sizes[0], (pair, sizes)


@pytest.mark.parametrize("pair", ALL_PAIRS, ids=lambda p: f"{p[0]}->{p[1]}")
def test_pair_envs_build_with_identical_spaces(pair: tuple[str, str]) -> None:
    """A policy trained on the first env must accept the second env's observations."""
    train_id, test_id = pair
    train, test = make_env(train_id, seed=0), make_env(test_id, seed=0)
    assert train.observation_space == test.observation_space
    assert train.action_space == test.action_space
    for env in (train, test):
        obs, _ = env.reset()
        assert env.observation_space.contains(obs)
        assert UNK not in obs.get("mission", [])  # popgym/* ids have no mission
        obs, *_ = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
        env.close()


def test_memory_match_variants_differ_as_named() -> None:
    for small, large in SUITES["memory-match-room"].pairs:
        a, b = make_env(small).unwrapped, make_env(large).unwrapped
        assert b.room_size > a.room_size and b.distractor_steps == a.distractor_steps
    for short, long in SUITES["memory-match-delay"].pairs:
        a, b = make_env(short).unwrapped, make_env(long).unwrapped
        assert b.distractor_steps > a.distractor_steps and b.room_size == a.room_size


def test_memory_match_passive_is_the_passive_rows_of_memory_match() -> None:
    passive = SUITES["memory-match-passive"].pairs
    assert passive == (
        ("memcores/PassiveVisualMatch-v0", "memcores/PassiveVisualMatch-Large-v0"),
        ("memcores/PassiveVisualMatch-v0", "memcores/PassiveVisualMatch-LongDelay-v0"),
    )
    assert set(passive) < set(SUITES["memory-match"].pairs)


def test_list_envs_covers_suites_and_memory_match() -> None:
    rows = list_envs()
    ids = [env_id for env_id, _ in rows]
    assert len(ids) == len(set(ids))
    for a, b in ALL_PAIRS:
        assert a in ids and b in ids
    assert all(isinstance(d, str) and d and "\n" not in d for _, d in rows)


def test_get_suite_unknown_lists_valid() -> None:
    assert get_suite("doorkey").pairs == (("MiniGrid-DoorKey-5x5-v0", "MiniGrid-DoorKey-16x16-v0"),)
    with pytest.raises(ValueError, match="thesis-table7"):
        get_suite("nope")


def test_cli_list_envs_and_suites(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["list", "envs"]) == 0
    out = capsys.readouterr().out
    assert "memcores/ActiveVisualMatch-v0" in out and "MiniGrid-MemoryS13-v0" in out
    assert cli_main(["list", "suites"]) == 0
    out = capsys.readouterr().out
    for name in SUITES:
        assert name in out
    assert "MiniGrid-Fetch-5x5-N2-v0 -> MiniGrid-Fetch-8x8-N3-v0" in out
