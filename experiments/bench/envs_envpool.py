"""EnvPool's rows of ``memcores bench envs``: MiniGrid stepped by EnvPool beside memcores'
own vector env, side by side in one process.

Each size ``N`` times, with uniformly random actions and resets included:

- ``memcores``: :class:`envs.vector.VectorEnv` in this process (``env.vector: sync``);
- ``envpool Tt``: :class:`envs.envpool_env.EnvPoolVectorEnv` on ``t`` threads (``env.vector:
  envpool``): EnvPool's step, the same-step reset of the envs that ended and the memcores
  observation format;
- ``raw envpool Tt``: EnvPool's own ``send``/``recv`` (its next-step resets, its observation
  format), the ceiling of the above.

All of them are timed in interleaved rounds (A, B, C, A, B, C, ...) and the median round is
reported, so the ratios are robust to a busy, shared machine.

    memcores bench envs --envpool                      # MemoryS7 at 64 and 1024 envs
    memcores bench envs --envpool --sizes 64 --out results/envpool/bench_cpu.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ENV_ID = "MiniGrid-MemoryS7-v0"
SIZES = (64, 1024)
THREADS = (1, 2)
TARGET = (64, 2.5)
"""At 64 envs, ``env.vector: envpool`` on 2 threads at least 2.5x memcores' vector env."""


class _RawPool:
    """EnvPool's gymnasium pool stepped as it is (the interface the timer needs)."""

    def __init__(self, env_id: str, n: int, threads: int, seed: int) -> None:
        import envpool

        self.num_envs = n
        self.pool = envpool.make_gymnasium(
            env_id, num_envs=n, batch_size=n, num_threads=threads, seed=seed
        )

    def reset(self, seed: int) -> Any:
        return self.pool.reset()

    def step(self, actions: np.ndarray) -> Any:
        self.pool.send(actions.astype(np.int32))
        return self.pool.recv()

    def close(self) -> None:
        self.pool.close()


def make_engines(env_id: str, n: int, seed: int) -> dict[str, Any]:
    """Label -> a vector env of ``n`` copies of ``env_id`` for every engine timed."""
    from memcores.envs.envpool_env import EnvPoolVectorEnv
    from memcores.envs.vector import VectorEnv

    engines: dict[str, Any] = {"memcores": VectorEnv(env_id, n, seed)}
    for t in THREADS:
        engines[f"envpool T{t}"] = EnvPoolVectorEnv(env_id, n, seed, threads=t)
    for t in THREADS:
        engines[f"raw envpool T{t}"] = _RawPool(env_id, n, t, seed)
    return engines


def steps_per_second(envs: Any, actions: np.ndarray) -> float:
    """Env steps/s of ``len(actions)`` batched steps (``actions [steps, N]``)."""
    start = time.perf_counter()
    for a in actions:
        envs.step(a)
    return actions.size / (time.perf_counter() - start)


def run(
    env_id: str = ENV_ID,
    sizes: tuple[int, ...] = SIZES,
    env_steps: int = 100_000,
    rounds: int = 5,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per (size, engine): median env steps/s over ``rounds`` interleaved rounds of
    about ``env_steps`` env steps each."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        engines = make_engines(env_id, n, seed)
        try:
            for envs in engines.values():
                envs.reset(seed=seed)
            samples: dict[str, list[float]] = {label: [] for label in engines}
            batches = max(1, env_steps // n)
            for _ in range(rounds):
                for label, envs in engines.items():
                    actions = rng.integers(0, 7, size=(batches, n))
                    samples[label].append(steps_per_second(envs, actions))
        finally:
            for envs in engines.values():
                envs.close()
        base = statistics.median(samples["memcores"])
        for label, s in samples.items():
            rate = statistics.median(s)
            rows.append(dict(env=env_id, envs=n, engine=label, steps_per_s=rate, vs=rate / base))
    return rows


def check_sizes_fit(env_id: str, sizes: tuple[int, ...]) -> None:
    """Refuse a ``--sizes`` whose observation buffers alone (one set per engine timed at once)
    exceed the computer's memory, before any env is made.

    :raises ValueError: naming ``--sizes``, the bytes needed and the memory there is.
    """
    import torch

    from memcores.agents.memory_need import check_fits, observation_bytes

    n, engines, per_env = max(sizes), 1 + 2 * len(THREADS), observation_bytes(env_id)
    check_fits(
        n * engines * per_env,
        (torch.device("cpu"),),
        f"--sizes {n:,} envs x {engines} engines x {per_env:,} observation bytes",
        "lower --sizes",
    )


def main(args: Any, command: str) -> int:
    """Print (and with ``--out`` write) the EnvPool table; 2 where envpool is missing."""
    from memcores.envs.envpool_env import EXTRA_HINT, available

    if not available():
        print(f"bench envs --envpool needs the envpool package ({EXTRA_HINT})", file=sys.stderr)
        return 2
    sizes = tuple(args.sizes)
    check_sizes_fit(ENV_ID, sizes)
    env_steps, rounds = (5_000, 2) if args.quick else (args.env_steps, args.rounds)
    print(
        f"bench envs --envpool: {ENV_ID}, random actions, {rounds} interleaved rounds of "
        f"~{env_steps} env steps per engine, median round reported"
    )
    start, cpu_start, load = time.perf_counter(), time.process_time(), os.getloadavg()[0]
    rows = run(ENV_ID, sizes, env_steps, rounds, args.seed)
    print(f"{'envs':>6}  {'engine':<16}  {'steps/s':>10}  {'vs memcores':>11}")
    for r in rows:
        print(f"{r['envs']:>6}  {r['engine']:<16}  {r['steps_per_s']:>10.0f}  {r['vs']:>10.2f}x")
    n, target = TARGET
    ours = [r["vs"] for r in rows if r["envs"] == n and r["engine"].startswith("envpool")]
    best = max(ours, default=None)
    if best is not None:
        verdict = "meets" if best >= target else "BELOW"
        print(f"env.vector=envpool at {n} envs: {best:.2f}x memcores ({verdict} target {target}x)")
    if args.out:
        from memcores.experiments.records import hardware

        out = Path(args.out)  # a .json file, or the record folder --out names
        out = out if out.suffix == ".json" else out / "bench_envpool.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        record = dict(
            command=command,
            hardware=hardware(),
            rounds=rounds,
            env_steps_per_round=env_steps,
            seed=args.seed,
            wall_seconds=round(time.perf_counter() - start, 1),
            cpu_seconds=round(time.process_time() - cpu_start, 1),
            load_average_at_start=round(load, 2),  # other processes' demand for the cores
            rows=rows,
        )
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(out)
        print(f"wrote {out}")
    return 0
