"""``memcores bench envs``: steps/s of the memory-match envs vs MiniGrid-MemoryS7.

Every env is built with :func:`envs.make_env` (the observation pipeline a trainer uses) and
stepped with uniformly random actions; resets at episode ends are included in the time. The
envs are timed in interleaved rounds (A, B, C, A, B, C, ...) in one process, and the median
round of each is reported, so the ratios are robust to a busy, shared machine.

    memcores bench envs            # 5 rounds x 20000 steps per env
    memcores bench envs --quick    # 2 rounds x 1000 steps (smoke test)
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from envs import make_env

BASELINE = "MiniGrid-MemoryS7-v0"
ENV_IDS = ("memcores/PassiveVisualMatch-v0", "memcores/ActiveVisualMatch-v0", BASELINE)
TARGET_RATIO = 0.5


def steps_per_second(env, actions: np.ndarray) -> float:
    """Time ``len(actions)`` steps of ``env`` (resetting at episode ends) -> steps/s."""
    env.reset()
    start = time.perf_counter()
    for a in actions:
        _, _, terminated, truncated, _ = env.step(int(a))
        if terminated or truncated:
            env.reset()
    return len(actions) / (time.perf_counter() - start)


def run(
    env_ids: tuple[str, ...] = ENV_IDS, steps: int = 20000, rounds: int = 5, seed: int = 0
) -> dict[str, float]:
    """Median steps/s per env id over ``rounds`` interleaved rounds of ``steps`` steps."""
    rng = np.random.default_rng(seed)
    envs = {env_id: make_env(env_id, seed=seed) for env_id in env_ids}
    samples: dict[str, list[float]] = {env_id: [] for env_id in env_ids}
    for _ in range(rounds):
        for env_id, env in envs.items():
            actions = rng.integers(0, env.action_space.n, size=steps)
            samples[env_id].append(steps_per_second(env, actions))
    for env in envs.values():
        env.close()
    return {env_id: statistics.median(s) for env_id, s in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memcores bench envs", description=__doc__)
    parser.add_argument("--steps", type=int, default=20000, help="steps per env per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 rounds x 1000 steps")
    args = parser.parse_args(argv or [])
    if args.quick:
        args.steps, args.rounds = 1000, 2
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be >= 1")
    print(
        f"bench envs: random actions through envs.make_env, {args.rounds} interleaved rounds "
        f"x {args.steps} steps per env, median round reported"
    )
    result = run(ENV_IDS, steps=args.steps, rounds=args.rounds, seed=args.seed)
    base = result[BASELINE]
    width = max(len(i) for i in result)
    print(f"{'env':<{width}}  {'steps/s':>9}  {'vs MemoryS7':>11}")
    for env_id, sps in result.items():
        print(f"{env_id:<{width}}  {sps:>9.0f}  {sps / base:>11.2f}")
    worst = min(result[i] / base for i in ENV_IDS if i != BASELINE)
    verdict = "meets" if worst >= TARGET_RATIO else "BELOW"
    print(f"slowest memory-match / MemoryS7 = {worst:.2f} ({verdict} target {TARGET_RATIO:.2f})")
    return 0
