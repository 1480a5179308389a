"""``memcores bench envs --batched``: steps/s of the batched torch envs beside their gymnasium
versions.

Each batched env (:mod:`envs.batched`) is stepped with uniformly random actions at each
``--sizes`` number of envs, on ``--device``; its gymnasium version runs in memcores' in-process
vector env (:mod:`envs.vector`, 64 envs, random actions). Resets at episode ends are included
in both. The sides are timed in interleaved rounds (gymnasium, then every size of the batched
env, ``--rounds`` times) in one process, and the median round of each is reported, so a busy
machine slows both alike. ``--threads`` (default 1) torch threads: on a CPU the ratio is then
one core against one core. The table is written as a bench record
(:mod:`experiments.bench.record`): ``results/bench/envs_batched`` on a CPU,
``results/bench/envs_batched_<device>`` on another device (``--out DIR`` elsewhere).

    memcores bench envs --batched                          # CPU, 64 .. 16384 envs
    memcores bench envs --batched --device cuda            # results/bench/envs_batched_cuda
    memcores bench envs --batched --quick                  # smoke test (no record)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from memcores.envs.batched_registry import batched_ids, make_batched_env
from memcores.envs.vector import VectorEnv
from memcores.experiments.argtypes import nonnegative_int
from memcores.experiments.bench.record import (
    Table,
    add_record_arguments,
    markdown_table,
    record_folder,
    write_record,
)

SIZES = (64, 256, 1024, 4096, 16384)
TARGET_SIZE, TARGET_RATIO = 1024, 10.0
"""The CPU target: each batched env alone at 1,024 envs >= 10x its gymnasium version."""
GYM_ENVS = 64


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batched_steps_per_second(env_id: str, n: int, steps: int, device: torch.device) -> float:
    """Steps/s (over all envs) of ``n`` batched ``env_id`` envs under random actions."""
    env = make_batched_env(env_id, n, device)
    env.reset(seed=0)
    n_actions = int(env.single_action_space.n)
    actions = torch.randint(0, n_actions, (steps, n), device=device)
    for t in range(min(steps, 5)):  # warm-up: allocator, first refill
        env.step(actions[t])
    _sync(device)
    start = time.perf_counter()
    for t in range(steps):
        env.step(actions[t])
    _sync(device)
    return n * steps / (time.perf_counter() - start)


def gym_steps_per_second(env_id: str, steps: int) -> float:
    """Steps/s of ``env_id``'s gymnasium version in the in-process vector env."""
    envs = VectorEnv(env_id, GYM_ENVS, seed=0)
    envs.reset(seed=0)
    rng = np.random.default_rng(0)
    n_actions = int(envs.single_action_space.n)
    actions = rng.integers(0, n_actions, (steps, GYM_ENVS))
    for t in range(min(steps, 10)):  # warm-up: first observations, lazy imports
        envs.step(actions[t])
    start = time.perf_counter()
    for t in range(steps):
        envs.step(actions[t])
    elapsed = time.perf_counter() - start
    envs.close()
    return GYM_ENVS * steps / elapsed


def run(
    env_ids: list[str], sizes: tuple[int, ...], rounds: int, frames: int, device: torch.device
) -> list[dict]:
    """One row per (env, size): median batched and gymnasium steps/s over ``rounds``."""
    rows = []
    for env_id in env_ids:
        gym_samples: list[float] = []
        samples: dict[int, list[float]] = {n: [] for n in sizes}
        for _ in range(rounds):
            gym_samples.append(gym_steps_per_second(env_id, max(4, frames // 8 // GYM_ENVS)))
            for n in sizes:
                samples[n].append(batched_steps_per_second(env_id, n, max(8, frames // n), device))
        gym = statistics.median(gym_samples)
        for n in sizes:
            fast = statistics.median(samples[n])
            rows.append(
                {"env": env_id, "n_envs": n, "batched": fast, "gymnasium": gym, "ratio": fast / gym}
            )
        print(f"  {env_id} done", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict], device: torch.device) -> Table:
    """The rows as a record table: one line per env, its gymnasium steps/s, then the batched
    steps/s and the ratio at each number of envs."""
    sizes = sorted({r["n_envs"] for r in rows})
    columns = ["env", f"gymnasium steps/s (vector env, {GYM_ENVS} envs, CPU)"]
    columns += [f"{n:,} envs: batched steps/s, ratio" for n in sizes]
    cells = []
    for env_id in dict.fromkeys(r["env"] for r in rows):
        mine = {r["n_envs"]: r for r in rows if r["env"] == env_id}
        line = [env_id, f"{next(iter(mine.values()))['gymnasium']:,.0f}"]
        line += [f"{mine[n]['batched']:,.0f}, {mine[n]['ratio']:.1f}x" for n in sizes]
        cells.append(line)
    return Table(f"Batched envs ({device.type}) against their gymnasium versions", columns, cells)


def parse_sizes(parser: argparse.ArgumentParser, text: str) -> tuple[int, ...]:
    """``--sizes 64,1024`` as numbers of envs, each >= 1 (argparse's error, exit 2, for any
    other text)."""
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {text!r}")
    if min(sizes) < 1:
        parser.error(f"--sizes must be numbers of envs >= 1, got {text!r}")
    return sizes


def bench_device(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """``--device`` as a device the computer has (argparse's error, exit 2, otherwise)."""
    from memcores.agents.device import resolve_device

    try:
        return resolve_device(name)
    except ValueError as err:
        parser.error(f"--device: {err}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="memcores bench envs --batched", description=__doc__)
    parser.add_argument("--device", default="cpu", help="device of the batched envs")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="numbers of envs")
    parser.add_argument("--envs", default="", help="comma-separated ids (default: every one)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--frames", type=int, default=200_000, help="env steps per measurement")
    parser.add_argument(
        "--threads", type=nonnegative_int, default=1, help="torch threads (0: leave)"
    )
    parser.add_argument("--quick", action="store_true", help="1 round, 2,000 frames, 64 envs")
    add_record_arguments(parser, "envs_batched")
    args = parser.parse_args(argv)
    sizes = parse_sizes(parser, args.sizes)
    env_ids = [e for e in args.envs.split(",") if e] or batched_ids()
    unknown = [e for e in env_ids if e not in batched_ids()]
    if unknown:
        parser.error(
            f"no batched version of {', '.join(unknown)}; valid: {', '.join(batched_ids())}"
        )
    if args.quick:
        args.rounds, args.frames, sizes = 1, 2000, (64,)
    if args.rounds < 1 or args.frames < 1 or min(sizes) < 1:
        parser.error("--rounds, --frames and every size must be >= 1")
    device = bench_device(parser, args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(
        f"bench envs --batched: random actions, {args.rounds} interleaved rounds x "
        f"{args.frames} env steps per measurement, median round; batched envs on {device}, "
        f"torch threads {torch.get_num_threads()}"
    )
    rows = run(env_ids, sizes, args.rounds, args.frames, device)
    result = table(rows, device)
    print(markdown_table(result))
    notes = [
        f"{args.rounds} interleaved rounds x {args.frames} env steps per measurement, median "
        f"round; torch threads {torch.get_num_threads()}"
    ]
    at_target = [r for r in rows if r["n_envs"] == TARGET_SIZE]
    if at_target and device.type == "cpu":
        worst = min(at_target, key=lambda r: r["ratio"])
        verdict = "meets" if worst["ratio"] >= TARGET_RATIO else "BELOW"
        notes.append(
            f"slowest at {TARGET_SIZE} envs: {worst['env']} {worst['ratio']:.1f}x its gymnasium "
            f"version ({verdict} target {TARGET_RATIO:.0f}x)"
        )
        print(notes[-1])
    name = "envs_batched" if device.type == "cpu" else f"envs_batched_{device.type}"
    write_record(
        record_folder(args, name),
        bench=name,
        argv=["envs", "--batched", *argv],
        tables=[result],
        notes=notes,
        numbers={"rows": rows},
    )
    return 0


# ---------------------------------------------------------------------------- bench rl --batched
RL_CONFIG = "experiments/configs/passive_visual_match.yaml"


def train_fps(vector: str, n_envs: int, updates: int, device: str, tmp: str) -> tuple[float, float]:
    """Frames per wall second and per CPU second of ``memcores train`` on :data:`RL_CONFIG`
    (PPO, ``lstm``, its reconstruction loss) with ``env.vector=vector`` (after a warm-up)."""
    from memcores.experiments.bench.train_rate import train_rates

    overrides = [f"env.vector={vector}", f"env.n_envs={n_envs}", f"train.device={device}"]
    return train_rates(RL_CONFIG, overrides, n_envs * 128, updates, tmp, f"{vector}_{n_envs}")


def rl_main(argv: list[str]) -> int:
    """``memcores bench rl --batched``: PPO frames/s on Passive Visual Match with the
    gymnasium envs (``env.vector=sync``) beside the batched envs (``env.vector=batched``),
    same config, same device, alternately."""
    import shutil
    import tempfile

    parser = argparse.ArgumentParser(
        prog="memcores bench rl --batched",
        description=f"PPO frames/s on {RL_CONFIG}: env.vector=sync beside env.vector=batched",
    )
    parser.add_argument("--sizes", default="8,32", help="numbers of envs (128 steps each)")
    parser.add_argument("--updates", type=int, default=2, help="timed updates per run")
    parser.add_argument("--device", default="cpu", help="train.device of both sides")
    parser.add_argument(
        "--threads", type=nonnegative_int, default=1, help="torch threads (0: leave)"
    )
    parser.add_argument("--quick", action="store_true", help="2 envs, 1 update")
    add_record_arguments(parser, "rl_batched")
    args = parser.parse_args(argv)
    bench_device(parser, args.device)
    sizes = (2,) if args.quick else parse_sizes(parser, args.sizes)
    updates = 1 if args.quick else args.updates
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    setting = (
        f"{RL_CONFIG} (PPO, lstm 64, 128 steps per env per update), {updates} timed updates "
        f"after one warm-up, device {args.device}, torch threads {torch.get_num_threads()}"
    )
    print(f"bench rl --batched: {setting}")
    columns = [
        "envs", "sync frames/s", "batched frames/s", "ratio", "sync frames/CPU-s",
        "batched frames/CPU-s",
    ]  # fmt: skip
    result = Table("PPO on Passive Visual Match: gymnasium envs beside batched envs", columns, [])
    tmp = tempfile.mkdtemp(prefix="memcores_bench_rl_batched_")
    try:
        for n in sizes:
            sync = train_fps("sync", n, updates, args.device, tmp)
            batched = train_fps("batched", n, updates, args.device, tmp)
            result.rows.append(
                [str(n), f"{sync[0]:,.0f}", f"{batched[0]:,.0f}", f"{batched[0] / sync[0]:.2f}x",
                 f"{sync[1]:,.0f}", f"{batched[1]:,.0f}"]
            )  # fmt: skip
            print(" | ".join(result.rows[-1]), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(markdown_table(result))
    device = torch.device(args.device).type
    name = "rl_batched" if device == "cpu" else f"rl_batched_{device}"
    write_record(
        record_folder(args, name),
        bench=name,
        argv=["rl", "--batched", *argv],
        tables=[result],
        notes=[setting],
    )
    return 0
