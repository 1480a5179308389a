"""``memcores bench envs``: steps/s of the memory-match envs and the Table 7 train envs.

Every env is built with :func:`envs.make_env` (the observation pipeline a trainer uses) and
stepped with uniformly random actions; resets at episode ends are included in the time. Each
env is timed twice, with :mod:`envs.fast_obs` and with MiniGrid's own ``gen_obs`` (same
observations), and every (env, observation code) pair is timed in interleaved rounds (A, B,
C, A, B, C, ...) in one process; the median round of each is reported, so the ratios are
robust to a busy, shared machine.

    memcores bench envs            # 5 rounds x 10000 steps per env and observation code
    memcores bench envs --quick    # 2 rounds x 1000 steps (smoke test)
    memcores bench envs --batched  # the batched torch envs (experiments/bench/batched_envs.py)
    memcores bench envs --envpool  # MemoryS7 through EnvPool vs memcores' vector env
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from memcores.envs import fast_obs, make_env
from memcores.experiments.argtypes import positive_int
from memcores.experiments.bench.record import (
    Table,
    add_record_arguments,
    record_folder,
    write_record,
)

BASELINE = "MiniGrid-MemoryS7-v0"
MEMORY_MATCH = ("memcores/PassiveVisualMatch-v0", "memcores/ActiveVisualMatch-v0")
TABLE7_TRAIN = (
    "MiniGrid-RedBlueDoors-6x6-v0",
    "MiniGrid-GoToObject-6x6-N2-v0",
    "MiniGrid-GoToDoor-5x5-v0",
    "MiniGrid-Fetch-5x5-N2-v0",
    "MiniGrid-DoorKey-5x5-v0",
)
ENV_IDS = (*MEMORY_MATCH, BASELINE, *TABLE7_TRAIN)
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


def make_timed_env(env_id: str, seed: int, minigrid_obs: bool):
    """``make_env(env_id)``, with MiniGrid's own ``gen_obs`` restored if ``minigrid_obs``."""
    env = make_env(env_id, seed=seed)
    if minigrid_obs:
        fast_obs.uninstall(env)
    return env


def run(
    env_ids: tuple[str, ...] = ENV_IDS, steps: int = 10000, rounds: int = 5, seed: int = 0
) -> dict[tuple[str, bool], float]:
    """Median steps/s per ``(env id, minigrid_obs)`` over ``rounds`` interleaved rounds."""
    rng = np.random.default_rng(seed)
    keys = [(env_id, minigrid) for env_id in env_ids for minigrid in (False, True)]
    envs = {key: make_timed_env(key[0], seed, key[1]) for key in keys}
    samples: dict[tuple[str, bool], list[float]] = {key: [] for key in keys}
    for _ in range(rounds):
        for key, env in envs.items():
            actions = rng.integers(0, env.action_space.n, size=steps)
            samples[key].append(steps_per_second(env, actions))
    for env in envs.values():
        env.close()
    return {key: statistics.median(s) for key, s in samples.items()}


def result_table(result: dict[tuple[str, bool], float]) -> Table:
    """Steps/s per env, the ratio to MemoryS7, and the ``fast_obs`` speed-up."""
    base = result[BASELINE, False]
    columns = ["env", "steps/s", "vs MemoryS7", "MiniGrid obs steps/s", "fast_obs speed-up"]
    rows = []
    for env_id in dict.fromkeys(e for e, _ in result):
        fast, slow = result[env_id, False], result[env_id, True]
        rows.append(
            [env_id, f"{fast:.0f}", f"{fast / base:.2f}", f"{slow:.0f}", f"{fast / slow:.2f}x"]
        )
    return Table("random actions through envs.make_env, median round", columns, rows)


def envpool_options(parser: argparse.ArgumentParser) -> None:
    """``--envpool`` and its options (:mod:`experiments.bench.envs_envpool`)."""
    parser.add_argument(
        "--envpool",
        action="store_true",
        help="time MiniGrid-MemoryS7 through EnvPool beside memcores' vector env instead",
    )
    parser.add_argument(
        "--sizes", type=positive_int, nargs="+", default=[64, 1024], help="--envpool: envs"
    )
    parser.add_argument(
        "--env-steps",
        type=positive_int,
        default=100_000,
        help="--envpool: env steps per engine and round",
    )


def main(argv: list[str] | None = None) -> int:
    if argv and "--batched" in argv:  # the batched torch envs: their own table
        from memcores.experiments.bench import batched_envs

        return batched_envs.main([a for a in argv if a != "--batched"])
    parser = argparse.ArgumentParser(prog="memcores bench envs", description=__doc__)
    parser.add_argument("--steps", type=int, default=10000, help="steps per env per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 rounds x 1000 steps")
    add_record_arguments(parser, "envs")
    envpool_options(parser)
    args = parser.parse_args(argv or [])
    if args.envpool:
        from memcores.experiments.bench import envs_envpool

        return envs_envpool.main(args, "memcores bench envs " + " ".join(argv or []))
    if args.quick:
        args.steps, args.rounds = 1000, 2
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be >= 1")
    print(
        f"bench envs: random actions through envs.make_env, {args.rounds} interleaved rounds "
        f"x {args.steps} steps per env and observation code, median round reported"
    )
    result = run(ENV_IDS, steps=args.steps, rounds=args.rounds, seed=args.seed)
    base = result[BASELINE, False]
    width = max(len(i) for i in ENV_IDS)
    print(
        f"{'env':<{width}}  {'steps/s':>9}  {'vs MemoryS7':>11}  {'MiniGrid obs':>12}  "
        f"{'fast_obs speed-up':>17}"
    )
    for env_id in ENV_IDS:
        fast, slow = result[env_id, False], result[env_id, True]
        print(
            f"{env_id:<{width}}  {fast:>9.0f}  {fast / base:>11.2f}  {slow:>12.0f}  "
            f"{fast / slow:>16.2f}x"
        )
    worst = min(result[i, False] / base for i in MEMORY_MATCH)
    verdict = "meets" if worst >= TARGET_RATIO else "BELOW"
    summary = f"slowest memory-match / MemoryS7 = {worst:.2f} ({verdict} target {TARGET_RATIO:.2f})"
    print(summary)
    write_record(
        record_folder(args, "envs"),
        bench="envs",
        argv=["envs", *(argv or [])],
        tables=[result_table(result)],
        notes=[f"{args.rounds} rounds x {args.steps} steps", summary],
    )
    return 0
