"""The batched envs' own draws and carried state, against values written out by hand and
statistical tests: what the parity tests (which load the gymnasium env's state into a row)
never reach.

Every check here is deterministic (fixed seeds): a statistical bound that holds once holds
always; the bounds are p < 0.001 tails, so a correct generator passes them at almost any seed.
"""

from __future__ import annotations

import pytest
import torch

from memcores.envs.batched import env_keys, hash32, random_words, uniform_int
from memcores.envs.batched_registry import make_batched_env

CHI2_P001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 9: 27.88, 15: 37.70}
"""Chi-square quantiles at p = 0.001 by degrees of freedom."""


def chi2_uniform(counts: torch.Tensor) -> float:
    """Pearson's statistic of ``counts`` against equal expected counts."""
    counts = counts.double()
    expected = counts.sum() / counts.numel()
    return float(((counts - expected) ** 2 / expected).sum())


def chi2_independent(table: torch.Tensor) -> float:
    """Pearson's statistic of a contingency ``table`` against independence of its axes."""
    table = table.double()
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum())


# --------------------------------------------------------------------------- the generator
def fmix32(x: int) -> int:
    """MurmurHash3's finaliser in plain Python: the reference the tensor version must match."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_hash32_is_murmur3s_finaliser():
    # fmix32(0) = 0 and fmix32(1) = 0x514E28B7 are MurmurHash3's published values
    values = [0, 1, 2, 0xFFFFFFFF, 0x12345678, 0x80000000]
    got = hash32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert got[:2] == [0, 0x514E28B7]
    assert got == [fmix32(v) for v in values]


def test_env_keys_and_words_are_pure_functions_of_seed_plus_i():
    # env i is keyed by seed + i alone: env 3 of seed 0 is env 0 of seed 3
    assert env_keys(0, 5)[3] == env_keys(3, 1)[0]
    key = fmix32(fmix32(7) ^ 0)  # seed 7, env 0: the high word of 7 is 0
    assert env_keys(7, 1).tolist() == [key]
    # a seed past 2**32 folds its high word in: seed 2**32 + 7 is not seed 7
    assert env_keys(2**32 + 7, 1).tolist() == [fmix32(fmix32(7) ^ 1)]
    assert env_keys(2**33 + 7, 1).tolist() == [fmix32(fmix32(7) ^ 2)]
    keys, episodes = env_keys(7, 1), torch.tensor([2])
    words = random_words(keys, episodes, 3)
    base = fmix32(key + ((2 * 0x9E3779B1) & 0xFFFFFFFF))
    expected = [(fmix32(base ^ ((s * 0x7FEB352D) & 0xFFFFFFFF)) >> 8) / 2**24 for s in (1, 2, 3)]
    assert words[0].tolist() == pytest.approx(expected, abs=0)
    # slots continue where first_slot says: slots 3.. of a draw are slots 1.. after first_slot=2
    assert random_words(keys, episodes, 1, 2)[0, 0] == words[0, 2]


def test_uniform_int_covers_exactly_0_to_n_minus_1():
    u = torch.tensor([0.0, 0.249, 0.25, 0.999999, 1.0 - 2**-24])
    assert uniform_int(u, 4).tolist() == [0, 0, 1, 3, 3]
    assert uniform_int(u, torch.tensor(4)).tolist() == [0, 0, 1, 3, 3]
    # a u rounded up to 1.0 upstream still gives n - 1, never n
    assert uniform_int(torch.tensor([1.0]), 4).tolist() == [3]
    assert uniform_int(torch.tensor([1.0]), torch.tensor(4)).tolist() == [3]


def test_words_are_uniform_and_successive_draws_independent():
    """40,000 draws: each of 16 bins is hit equally often, and a word tells nothing about
    the next slot's, the next episode's or the next env's (4 x 4 tables)."""
    n = 10_000
    keys = env_keys(0, n)
    words = random_words(keys, torch.zeros(n, dtype=torch.int64), 4)
    bins = (words * 16).long().flatten()
    assert chi2_uniform(torch.bincount(bins, minlength=16)) < CHI2_P001[15]
    quarter = (words * 4).long()
    later = (random_words(keys, torch.ones(n, dtype=torch.int64), 1)[:, 0] * 4).long()
    pairs = {
        "next slot": (quarter[:, 0], quarter[:, 1]),
        "next episode": (quarter[:, 0], later),
        "next env": (quarter[:-1, 0], quarter[1:, 0]),
    }
    for what, (a, b) in pairs.items():
        table = torch.bincount(a * 4 + b, minlength=16).view(4, 4)
        assert chi2_independent(table) < CHI2_P001[9], what
    assert abs(words.mean().item() - 0.5) < 0.01


# --------------------------------------------------------------------------- POPGym's deal
def test_repeat_previous_from_its_own_reset_pays_exactly_plus_and_minus_one():
    """RepeatPreviousEasy (52 cards, k = 4) from the batched env's own shuffles: naming the
    suit shown 4 steps earlier (read from the carried observations) earns 48 x 1/48 = 1 over
    the 51 steps of an episode; naming another suit earns -1. The episode then restarts in
    the same step with a new deal."""
    n = 6
    env = make_batched_env("popgym/RepeatPreviousEasy-v0", n)
    obs = env.reset(seed=3)
    for offset, total in ((0, 1.0), (1, -1.0)):
        shown = [obs["vector"][:, :4].argmax(1)]  # the suit of the card dealt at the reset
        assert obs["vector"][:, 8].eq(1).all()  # the first-step flag
        returns = torch.zeros(n)
        for step in range(1, 52):
            old = shown[-4] if len(shown) >= 4 else torch.zeros(n, dtype=torch.int64)
            obs, reward, done, _ = env.step((old + offset) % 4)
            returns += reward
            assert done.all() == (step == 51), step  # an episode deals the whole deck
            shown.append(obs["vector"][:, :4].argmax(1))
        assert returns.tolist() == pytest.approx([total] * n, abs=1e-5)
        # a deal is a permutation: 13 cards of each suit among the 52 shown
        suits = torch.stack(shown[:-1], 1)  # the 51 cards shown before the last step + reset
        counts = torch.stack([(suits == s).sum(1) for s in range(4)], 1)
        assert (counts >= 12).all() and (counts <= 13).all()


def test_popgym_deals_are_uniform_permutations():
    """The first card of 4,000 deals is uniform over the suits; the second is of the same
    suit 12 times in 51 (a deck dealt without replacement), not 1 in 4."""
    n = 4000
    env = make_batched_env("popgym/RepeatPreviousEasy-v0", n)
    env.reset(seed=0)
    deal = env.state["deal"]
    assert (deal.sort(1).values == torch.arange(52)).all()  # every row a permutation
    first, second = deal[:, 0] % 4, deal[:, 1] % 4
    assert chi2_uniform(torch.bincount(first, minlength=4)) < CHI2_P001[3]
    same = (first == second).double().mean().item()
    assert abs(same - 12 / 51) < 3 * (12 / 51 * 39 / 51 / n) ** 0.5 + 0.005
    # each of the 52 positions holds each card equally often: position 0 over 52 cards
    positions = torch.bincount(deal[:, 0], minlength=52)
    assert positions.min() > 40 and positions.max() < 115  # 76.9 expected


# --------------------------------------------------------------------------- visual match
def test_visual_match_cues_are_uniform_and_independent_across_episodes_and_envs():
    """The cue colour of the batched env's own resets: uniform over the colours, and
    independent of the same env's next episode and of the next env's."""
    n = 4000
    env = make_batched_env("memcores/PassiveVisualMatch-v0", n)
    env.reset(seed=0)
    k = env.n_colors
    cue = env.state["cue"]
    assert chi2_uniform(torch.bincount(cue, minlength=k)) < CHI2_P001[k - 1]
    following = env._next["cue"]  # the next episode of each env, drawn ahead
    for a, b in ((cue, following), (cue[:-1], cue[1:])):
        table = torch.bincount(a * k + b, minlength=k * k).view(k, k)
        assert chi2_independent(table) < CHI2_P001[(k - 1) ** 2]
    # the observation shows it: the cue room's ball is one of the palette's colours
    assert env.obs["image"].shape == (n, 7, 7, 3)


# --------------------------------------------------------------------------- carried episodes
@pytest.mark.parametrize("compact", [True, False])
def test_each_env_plays_its_own_episodes_in_order_over_auto_resets(compact):
    """Envs that end at different steps: after its e-th end, env i holds exactly the
    episode ``(seed + i, e)``, drawn ahead into the pool (compact rows on a CPU, every row
    masked on an accelerator): none is skipped, repeated or taken from another env."""
    n = 16
    options = {"room_size": 5, "distractor_steps": 2, "max_steps": 30}
    env = make_batched_env("memcores/PassiveVisualMatch-v0", n, env_kwargs=options)
    env.compact_resets = compact
    env.reset(seed=5)
    generator = torch.Generator().manual_seed(0)
    ended = torch.zeros(n, dtype=torch.int64)
    lengths: set[int] = set()
    since = torch.zeros(n, dtype=torch.int64)
    for _ in range(300):
        actions = torch.randint(0, 7, (n,), generator=generator)
        _, _, done, _ = env.step(actions)
        since += 1
        for i in done.nonzero().flatten().tolist():
            ended[i] += 1
            lengths.add(int(since[i]))
            since[i] = 0
            fresh = env._fresh(env.keys[i : i + 1], ended[i : i + 1])
            for key, value in fresh.items():
                assert torch.equal(env.state[key][i], value[0].to(env.state[key].dtype)), key
    assert env.episodes.tolist() == ended.tolist()
    assert ended.min() >= 3 and len(lengths) >= 3  # several episodes, of unequal lengths


def test_the_pool_is_refilled_every_min_episode_length_minus_one_steps():
    """The rows that ended wait in ``_stale`` until the pool's refill, which comes every
    ``min_episode_length - 1`` steps, before any env can end again; then none waits."""
    n = 16
    options = {"room_size": 5, "distractor_steps": 2, "max_steps": 30}
    env = make_batched_env("memcores/PassiveVisualMatch-v0", n, env_kwargs=options)
    period = env.min_episode_length - 1
    assert period >= 2  # else every step refills and nothing is pinned
    env.reset(seed=1)
    generator = torch.Generator().manual_seed(1)
    waiting = torch.zeros(n, dtype=torch.bool)
    refills = 0
    for step in range(1, 4 * period + 1):
        _, _, done, _ = env.step(torch.randint(0, 7, (n,), generator=generator))
        waiting |= done
        if step % period == 0:
            waiting[:] = False
            refills += 1
        assert torch.equal(env._stale, waiting), step
    assert refills == 4 and env._steps == 4 * period


def test_a_reset_keeps_the_storage_of_the_tensors_it_rewrites():
    """A recorded step reads the env's tensors by address: a second reset writes the new
    seed's keys, episode counters and flags into the same storage."""
    env = make_batched_env("popgym/RepeatPreviousEasy-v0", 5)
    env.reset(seed=0)
    env.step(torch.zeros(5, dtype=torch.int64))
    tensors = {"keys": env.keys, "episodes": env.episodes, "_stale": env._stale}
    addresses = {name: t.data_ptr() for name, t in tensors.items()}
    env.reset(seed=9)
    assert {name: getattr(env, name).data_ptr() for name in tensors} == addresses
    assert torch.equal(env.keys, env_keys(9, 5)) and env.episodes.tolist() == [0] * 5
    assert not env._stale.any() and env._steps == 0


def test_an_env_whose_episodes_may_end_on_every_step_refills_on_every_step():
    """Declared ``min_episode_length`` 2 (a lower bound, as a two-step game would declare): the
    pool is refilled after every step, so no row that ended waits in ``_stale``. Here episodes
    end on steps 3, 6 and 9 (adjacent layout, one cue and one distractor step, then forward
    into the ball ahead)."""
    options = {"reward_layout": "adjacent", "cue_steps": 1, "distractor_steps": 1}
    env = make_batched_env("memcores/PassiveVisualMatch-v0", 8, env_kwargs=options)
    env.min_episode_length = 2
    env.reset(seed=0)
    ends = 0
    for _ in range(9):
        _, _, done, _ = env.step(torch.full((8,), 2))
        ends += int(done.sum())
        assert not env._stale.any()
    assert ends == 24
