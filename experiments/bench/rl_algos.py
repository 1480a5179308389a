"""``memcores bench rl --algos``: frames per second of PPO, PQN and R2D2 side by side.

Each learner trains from its POPGym config (``experiments/configs/popgym_pqn.yaml``,
``popgym_r2d2.yaml``; PPO on the PQN file with ``agent.algo=ppo``): RepeatPreviousEasy, gru
with hidden size 64, 8 batched envs x 128 steps per update, on the same device and thread
count. R2D2 runs with ``agent.learning_starts=0`` so that every timed update takes its
gradient steps (its steady state). One update of warm-up, then ``--updates`` timed; the
algorithms alternate over ``--repeats`` and each keeps its best.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile

import torch

from memcores.experiments.bench.record import (
    Table,
    add_record_arguments,
    record_folder,
    write_record,
)
from memcores.experiments.bench.train_rate import train_rates

PQN_CONFIG = "experiments/configs/popgym_pqn.yaml"
R2D2_CONFIG = "experiments/configs/popgym_r2d2.yaml"
SIDES: dict[str, tuple[str, list[str]]] = {
    "PPO": (PQN_CONFIG, ["agent.algo=ppo"]),
    "PQN": (PQN_CONFIG, []),
    "R2D2": (R2D2_CONFIG, ["agent.learning_starts=0"]),
}
"""Algorithm -> (config file, overrides)."""


def scaled_overrides(n_envs: int, n_steps: int) -> list[str]:
    """The configs' settings at ``n_envs`` envs other than their 8: four minibatches per epoch
    (PPO and PQN), and R2D2's sequences per gradient step grown with the envs (32 at 8), so
    each frame is replayed as often, in a replay of at least four rollouts."""
    if n_envs == 8:
        return []
    return [
        f"env.n_envs={n_envs}",
        f"agent.minibatch_size={n_envs * n_steps // 4}",
        f"agent.replay_batch={4 * n_envs}",
        f"agent.replay_size={max(50_000, 4 * n_envs * n_steps)}",
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="memcores bench rl --algos", description=__doc__)
    parser.add_argument("--updates", type=int, default=10, help="timed updates per algorithm")
    parser.add_argument("--repeats", type=int, default=2, help="alternating repeats; best kept")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--device", default="cpu", help="device of every learner")
    parser.add_argument(
        "--envs", type=int, default=8, help="batched envs (beyond 8: 4 minibatches per epoch)"
    )
    parser.add_argument("--quick", action="store_true", help="tiny run for tests")
    add_record_arguments(parser, "rl_algos")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.envs < 1:
        raise ValueError(f"--envs must be at least 1, got {args.envs}")
    n_envs, n_steps, updates, repeats = args.envs, 128, args.updates, args.repeats
    extra = [f"train.device={args.device}"]
    extra += scaled_overrides(n_envs, n_steps)
    if args.quick:
        n_envs, n_steps, updates, repeats = 2, 32, 1, 1
        extra += ["env.n_envs=2", "agent.n_steps=32", "agent.minibatch_size=64"]
        extra += ["agent.replay_batch=4", "core.hidden_size=8"]
    print(
        f"bench rl --algos: popgym/RepeatPreviousEasy-v0 batched, gru, {n_envs} envs x "
        f"{n_steps} steps, {updates} timed updates x {repeats} repeats, torch threads "
        f"{torch.get_num_threads()}, device {args.device}"
    )
    best: dict[str, tuple[float, float]] = {name: (0.0, 0.0) for name in SIDES}
    tmp = tempfile.mkdtemp(prefix="memcores_bench_algos_")
    try:
        for r in range(repeats):
            for name, (config, overrides) in SIDES.items():
                rates = train_rates(
                    config, [*overrides, *extra], n_envs * n_steps, updates, f"{tmp}/{r}", name
                )
                best[name] = (max(best[name][0], rates[0]), max(best[name][1], rates[1]))
                print(f"  repeat {r + 1}: {name} {rates[0]:.0f} frames/s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ppo = best["PPO"][0]
    rows = [
        [name, f"{wall:.0f}", f"{cpu:.0f}", f"{wall / ppo:.2f}x"]
        for name, (wall, cpu) in best.items()
    ]
    table = Table(
        f"popgym/RepeatPreviousEasy-v0 (batched), gru 64, {n_envs} envs x {n_steps} steps, "
        f"best of {repeats}",
        ["algorithm", "frames/s wall", "frames per CPU-second", "wall vs PPO"],
        rows,
    )
    print("\n".join(" | ".join(r) for r in rows))
    notes = [
        f"PPO and PQN: 4 epochs of minibatches of {n_envs * n_steps // 4} "
        "steps per update; R2D2: the 8 gradient steps of popgym_r2d2.yaml per update on "
        f"{4 * n_envs} sequences each, agent.learning_starts=0."
    ]
    write_record(
        record_folder(args, "rl_algos"),
        bench="rl_algos",
        argv=["rl", "--algos", *argv],
        tables=[table],
        notes=notes,
        numbers={name: {"wall": w, "cpu": c} for name, (w, c) in best.items()},
    )
    return 0
