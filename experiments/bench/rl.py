"""``memcores bench rl``: PPO steps/s of memcores vs sb3-contrib RecurrentPPO, side by side.

Same settings on both sides: MiniGrid-MemoryS7-v0, an LSTM of 64 units, 8 sync envs x 128
steps, 4 epochs, minibatch 256, the same number of torch threads, on CPU. sb3-contrib runs
``RecurrentPPO("MlpLstmPolicy", lstm_hidden_size=64, shared_lstm=True,
enable_critic_lstm=False)`` on the flattened 7x7x3 image (minigrid's ``ImgObsWrapper`` +
gymnasium's ``FlattenObservation``: SB3 needs a Box observation); memcores runs its own
policy with the ``flat`` image encoder (one linear layer on the flattened raw image, the
input sb3's MLP gets), direction embedding, mean-of-embeddings mission encoder, ``lstm``
core, seq_len 32. Both sides step the same MiniGrid env with the same observation code:
:mod:`envs.fast_obs` by default, MiniGrid's own ``gen_obs`` with ``--minigrid-obs``
(identical observations; only the env's share of the time changes).
Each side first runs one warm-up update (imports, allocator), then is timed over
``--updates`` updates; the two are run alternately ``--repeats`` times and the best of each is
kept, so a busy machine hurts both alike. Frames = env steps over all envs. Both wall-clock
frames/s and frames per CPU-second of this process (``time.process_time``; one torch thread
and in-process envs, so it counts all the work) are printed: on a shared machine the CPU-time
ratio is the steadier one.

Then the ceiling and the scaling table: for each env layout (``sync``: envs in the trainer's
process; ``async`` with 1 or 2 worker processes) and each ``n_envs`` in 8, 16, 32, 64, the
env-alone steps/s of that same vector env under random actions (no policy: what the envs can
deliver) beside the trainer's frames/s (PPO, minibatch = a quarter of the rollout, so 4
minibatches per epoch at every size) and their ratio. ``--skip-scaling`` leaves it out.

``--update-costs`` times only the PPO update per frame (per image encoder and minibatch size),
then splits the recommended MemoryS7 recipe (``experiments/configs/memory_s7.yaml``: 8 epochs)
into collection and update CPU time per frame, which bounds the frames/s any layout can reach
without changing the algorithm.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
import time

import numpy as np
import torch

from memcores.envs import fast_obs
from memcores.experiments.argtypes import nonnegative_int
from memcores.experiments.bench.record import (
    Table,
    add_record_arguments,
    record_folder,
    write_record,
)
from memcores.experiments.bench.train_rate import train_rates

ENV_ID = "MiniGrid-MemoryS7-v0"


def _ours(
    updates: int,
    n_envs: int,
    n_steps: int,
    core: str,
    device: str,
    tmp: str,
    vector: str = "sync",
    workers: int = 1,
    minibatch: int | None = None,
) -> tuple[float, float]:
    """Frames per wall second and per CPU second of ``memcores train`` (after a warm-up)."""
    minibatch = minibatch or min(256, n_envs * n_steps)
    overrides = [
        f"env.id={ENV_ID}",
        f"env.n_envs={n_envs}",
        f"env.vector={vector}",
        f"env.workers={workers}",
        f"core.name={core}",
        "core.hidden_size=64",
        "agent.image_encoder=flat",  # the flattened raw image, as sb3's MlpLstmPolicy
        "agent.algo=ppo",
        f"agent.n_steps={n_steps}",
        "agent.seq_len=32",
        "agent.n_epochs=4",
        f"agent.minibatch_size={minibatch}",
        f"train.device={device}",
    ]
    return train_rates(None, overrides, n_envs * n_steps, updates, tmp, "memcores")


def _sb3(updates: int, n_envs: int, n_steps: int, device: str) -> tuple[float, float]:
    """Frames per wall second and per CPU second of sb3-contrib RecurrentPPO, same settings."""
    import gymnasium as gym
    from minigrid.wrappers import ImgObsWrapper
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import DummyVecEnv

    import memcores.envs  # noqa: F401  (registers MiniGrid ids)

    def make(i: int):
        def thunk() -> gym.Env:
            base = gym.make(ENV_ID)
            fast_obs.install(base)  # the same observation code as memcores' side
            env = gym.wrappers.FlattenObservation(ImgObsWrapper(base))
            env.reset(seed=i)
            return env

        return thunk

    vec = DummyVecEnv([make(i) for i in range(n_envs)])
    model = RecurrentPPO(
        "MlpLstmPolicy",
        vec,
        n_steps=n_steps,
        batch_size=min(256, n_envs * n_steps),
        n_epochs=4,
        policy_kwargs=dict(lstm_hidden_size=64, shared_lstm=True, enable_critic_lstm=False),
        device=device,
        seed=0,
        verbose=0,
    )
    # without a logger of its own, every learn() makes an empty SB3-<time> folder in the temp dir
    model.set_logger(Logger(folder=None, output_formats=[]))
    model.learn(n_envs * n_steps)  # warm-up update
    start, cpu = time.perf_counter(), time.process_time()
    model.learn(updates * n_envs * n_steps, reset_num_timesteps=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    vec.close()
    frames = updates * n_envs * n_steps
    return frames / wall, frames / cpu


LAYOUTS: tuple[tuple[str, int], ...] = (("sync", 1), ("async", 1), ("async", 2))
"""Env layouts of the scaling table: (``env.vector``, ``env.workers``)."""


def env_alone(n_envs: int, vector: str, workers: int, steps: int) -> float:
    """Steps/s of the vector env the trainer would build, under random actions (no policy)."""
    from memcores.agents.rl_trainer import make_vector_env

    env = make_vector_env(ENV_ID, n_envs, 0, vector, None, workers)
    try:
        env.reset(seed=0)
        actions = np.random.default_rng(0).integers(0, 3, (steps, n_envs))
        env.step(actions[0])  # warm-up (workers' first message)
        start = time.perf_counter()
        for a in actions[1:]:
            env.step(a)
        return (steps - 1) * n_envs / (time.perf_counter() - start)
    finally:
        env.close()


def scaling_table(
    sizes: tuple[int, ...],
    n_steps: int,
    updates: int,
    core: str,
    device: str,
    tmp: str,
    layouts: tuple[tuple[str, int], ...] = LAYOUTS,
) -> list[tuple[str, int, float, float]]:
    """Rows ``(layout, n_envs, env-alone steps/s, trainer frames/s)``, printed as they come."""
    rows = []
    print("\nceiling and scaling (wall clock; minibatch = rollout / 4):")
    print(f"  {'layout':<18}{'n_envs':>7}{'env alone':>12}{'trainer':>10}{'ratio':>8}")
    for vector, workers in layouts:
        layout = "sync (in-process)" if vector == "sync" else f"async, {workers} worker"
        layout += "s" if workers > 1 else ""
        for n in sizes:
            ceiling = env_alone(n, vector, workers, max(50, 4096 // n))
            fps, _ = _ours(
                updates,
                n,
                n_steps,
                core,
                device,
                f"{tmp}/{vector}{workers}_{n}",
                vector,
                workers,
                max(32, n * n_steps // 4),
            )
            rows.append((layout, n, ceiling, fps))
            print(
                f"  {layout:<18}{n:>7}{ceiling:>12.0f}{fps:>10.0f}{fps / ceiling:>8.2f}", flush=True
            )
    return rows


def scaling_record_table(rows: list[tuple[str, int, float, float]]) -> Table:
    """:func:`scaling_table`'s rows as a record table: a line per layout, ``env alone /
    trainer`` frames/s per number of envs."""
    sizes = sorted({n for _, n, _, _ in rows})
    columns = ["layout", *(f"{n} envs: env alone / trainer" for n in sizes)]
    lines = []
    for layout in dict.fromkeys(layout for layout, *_ in rows):
        mine = {n: (ceiling, fps) for name, n, ceiling, fps in rows if name == layout}
        lines.append([layout, *(f"{mine[n][0]:,.0f} / {mine[n][1]:,.0f}" for n in sizes)])
    title = "Ceiling and scaling: the vector env alone and the trainer, frames/s (wall clock)"
    return Table(title, columns, lines)


def update_cost(encoder: str, minibatch: int, n_envs: int, n_steps: int, rounds: int) -> float:
    """CPU microseconds per frame of one PPO update (4 epochs) on a real MemoryS7 rollout,
    best of ``rounds`` after a warm-up update."""
    from memcores.agents.ppo import update
    from memcores.agents.rl_config import RLConfig
    from memcores.agents.rl_trainer import setup
    from memcores.agents.rollout import RolloutBuffer, collect_rollout, obs_shapes, start_rollouts
    from memcores.experiments.config import load_config

    overrides = [f"env.id={ENV_ID}", f"env.n_envs={n_envs}", f"agent.n_steps={n_steps}"]
    overrides += [f"agent.minibatch_size={minibatch}", f"agent.image_encoder={encoder}"]
    overrides += ["agent.mission=none", "train.device=cpu", "train.threads=0"]
    s = setup(load_config(RLConfig, None, overrides))
    try:
        state = s.policy.initial_state(n_envs, s.device)
        buffer = RolloutBuffer(
            obs_shapes(s.envs.single_observation_space), n_steps, n_envs, 32, state, s.device
        )
        carry = collect_rollout(
            s.policy, s.envs, buffer, start_rollouts(s.policy, s.envs, 0, s.device)
        )
        buffer.compute_returns(torch.zeros(n_envs), carry.starts, 0.99, 0.95)
        update(s.policy, s.optimizer, buffer, s.config.agent)
        best = math.inf
        for _ in range(rounds):
            start = time.process_time()
            update(s.policy, s.optimizer, buffer, s.config.agent)
            best = min(best, time.process_time() - start)
    finally:
        s.envs.close()
    return 1e6 * best / (n_envs * n_steps)


def update_costs(n_envs: int, n_steps: int, rounds: int, minibatches: tuple[int, ...]) -> Table:
    """The update's CPU time per frame for each image encoder and minibatch size (printed as
    it comes)."""
    title = f"PPO update cost, CPU us per frame (4 epochs), {n_envs} envs x {n_steps} steps"
    print(f"\n{title}:")
    print(f"  {'encoder':<8}" + "".join(f"{f'mb {m}':>10}" for m in minibatches))
    table = Table(title, ["encoder", *(f"minibatch {m}" for m in minibatches)], [])
    for encoder in ("onehot", "flat"):
        costs = [update_cost(encoder, m, n_envs, n_steps, rounds) for m in minibatches]
        print(f"  {encoder:<8}" + "".join(f"{c:>10.1f}" for c in costs), flush=True)
        table.rows.append([encoder, *(f"{c:.1f}" for c in costs)])
    return table


RECIPE = "experiments/configs/memory_s7.yaml"
"""The recommended MemoryS7 config, whose per-frame costs ``--update-costs`` also splits."""


def recipe_costs(config_path: str, rounds: int, quick: bool = False) -> tuple[float, float]:
    """CPU microseconds per frame of collection (env steps + acting) and of the PPO update of
    ``config_path``'s recipe (its envs, epochs, minibatch and encoder), best of ``rounds``
    rollout+update pairs after a warm-up pair. One torch thread, envs in this process."""
    from memcores.agents.ppo import update
    from memcores.agents.rl_config import RLConfig
    from memcores.agents.rl_trainer import setup
    from memcores.agents.rollout import (
        RolloutBuffer,
        collect_with_returns,
        obs_shapes,
        start_rollouts,
    )
    from memcores.experiments.config import load_config

    overrides = ["train.device=cpu", "train.threads=0", "env.vector=sync"]
    if quick:
        overrides += ["env.n_envs=2", "agent.n_steps=32", "agent.minibatch_size=32"]
    s = setup(load_config(RLConfig, config_path, overrides))
    cfg = s.config
    n_envs, n_steps = cfg.env.n_envs, cfg.agent.n_steps
    try:
        state = s.policy.initial_state(n_envs, s.device)
        buffer = RolloutBuffer(
            obs_shapes(s.envs.single_observation_space),
            n_steps,
            n_envs,
            cfg.agent.seq_len,
            state,
            s.device,
        )
        carry = start_rollouts(s.policy, s.envs, 0, s.device)
        best_collect = best_update = math.inf
        for r in range(rounds + 1):
            start = time.process_time()
            carry = collect_with_returns(s.policy, s.envs, buffer, carry, cfg.agent)
            collect = time.process_time() - start
            start = time.process_time()
            update(s.policy, s.optimizer, buffer, cfg.agent)
            if r > 0:  # round 0 warms up
                best_collect = min(best_collect, collect)
                best_update = min(best_update, time.process_time() - start)
    finally:
        s.envs.close()
    frames = n_envs * n_steps
    return 1e6 * best_collect / frames, 1e6 * best_update / frames


def print_recipe_costs(config_path: str, rounds: int, quick: bool) -> Table:
    """The recipe's collection/update split and the frames/s each part allows (printed)."""
    collect, update_us = recipe_costs(config_path, rounds, quick)
    title = f"{config_path}: CPU us per frame, one process, one torch thread"
    print(f"\n{title}")
    print(f"  collection (env + acting) {collect:8.1f}")
    print(f"  update                    {update_us:8.1f}")
    total, alone = 1e6 / (collect + update_us), 1e6 / update_us
    print(
        f"  frames per CPU-second: {total:.0f}; the update alone "
        f"allows at most {alone:.0f} on one core"
    )
    rows = [
        ["collection (env steps + acting)", f"{collect:.1f}", f"{1e6 / collect:,.0f}"],
        ["update", f"{update_us:.1f}", f"{alone:,.0f}"],
        ["all", f"{collect + update_us:.1f}", f"{total:,.0f}"],
    ]
    return Table(title, ["part", "CPU us per frame", "frames per CPU-second"], rows)


def main(argv: list[str]) -> int:
    if "--algos" in argv:  # PPO, PQN and R2D2 side by side on POPGym
        from memcores.experiments.bench import rl_algos

        return rl_algos.main([a for a in argv if a != "--algos"])
    if "--batched" in argv:  # PPO with the batched envs beside the gymnasium ones
        from memcores.experiments.bench import batched_envs

        return batched_envs.rl_main([a for a in argv if a != "--batched"])
    parser = argparse.ArgumentParser(prog="memcores bench rl", description=__doc__)
    parser.add_argument("--updates", type=int, default=4, help="timed updates per side")
    parser.add_argument("--repeats", type=int, default=2, help="alternating repeats; best kept")
    parser.add_argument(
        "--threads", type=nonnegative_int, default=1, help="torch threads (both sides; 0: leave)"
    )
    parser.add_argument("--core", default="lstm", help="memcores core (default lstm)")
    parser.add_argument("--device", default="cpu", help="device of both sides (default cpu)")
    parser.add_argument(
        "--quick", action="store_true", help="tiny run (2 envs x 32 steps, 1 update) for tests"
    )
    parser.add_argument("--skip-sb3", action="store_true", help="time memcores only")
    add_record_arguments(parser, "rl")
    parser.add_argument(
        "--skip-scaling", action="store_true", help="leave out the ceiling and scaling table"
    )
    parser.add_argument(
        "--update-costs",
        action="store_true",
        help="only time the PPO update per frame, per image encoder and minibatch size, and "
        "split the recommended MemoryS7 recipe's cost into collection and update",
    )
    parser.add_argument(
        "--minigrid-obs",
        action="store_true",
        help="both sides use MiniGrid's own gen_obs instead of envs.fast_obs (same output)",
    )
    args = parser.parse_args(argv)
    if args.minigrid_obs:
        os.environ[fast_obs.DISABLE_VARIABLE] = "1"

    n_envs, n_steps, updates, repeats = 8, 128, args.updates, args.repeats
    sizes: tuple[int, ...] = (8, 16, 32, 64)
    if args.quick:
        n_envs, n_steps, updates, repeats, sizes = 2, 32, 1, 1, (2,)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.update_costs:
        if args.quick:
            costs = update_costs(2, 64, 1, (64, 128))
        else:
            costs = update_costs(64, 128, 3, (512, 2048, 8192))
        recipe = print_recipe_costs(RECIPE, 1 if args.quick else 3, args.quick)
        out = record_folder(args, "rl_update_costs")
        write_record(out, bench="rl_update_costs", argv=["rl", *argv], tables=[costs, recipe])
        return 0
    print(
        f"bench rl: {ENV_ID}, {n_envs} envs x {n_steps} steps, 4 epochs, minibatch "
        f"{min(256, n_envs * n_steps)}, hidden 64, {updates} timed updates x {repeats} repeats, "
        f"torch threads {torch.get_num_threads()}, device {args.device}, observations from "
        f"{'MiniGrid gen_obs' if args.minigrid_obs else 'envs.fast_obs'} on both sides"
    )
    tmp = tempfile.mkdtemp(prefix="memcores_bench_rl_")
    ours: list[tuple[float, float]] = []
    theirs: list[tuple[float, float]] = []
    try:
        for r in range(repeats):
            ours.append(_ours(updates, n_envs, n_steps, args.core, args.device, f"{tmp}/{r}"))
            print(f"  repeat {r + 1}: memcores ({args.core}) {_fmt(ours[-1])}", flush=True)
            if not args.skip_sb3:
                theirs.append(_sb3(updates, n_envs, n_steps, args.device))
                print(f"  repeat {r + 1}: sb3-contrib RecurrentPPO {_fmt(theirs[-1])}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    best_ours = (max(o[0] for o in ours), max(o[1] for o in ours))
    print(f"memcores PPO ({args.core}):     {_fmt(best_ours)}")
    if theirs:
        best_theirs = (max(t[0] for t in theirs), max(t[1] for t in theirs))
        print(f"sb3-contrib RecurrentPPO: {_fmt(best_theirs)}")
        print(
            f"ratio memcores / sb3-contrib: {best_ours[0] / best_theirs[0]:.2f}x (wall), "
            f"{best_ours[1] / best_theirs[1]:.2f}x (CPU time)"
        )
    rows = [[f"memcores PPO ({args.core})", f"{best_ours[0]:.0f}", f"{best_ours[1]:.0f}"]]
    if theirs:
        rows.append(["sb3-contrib RecurrentPPO", f"{best_theirs[0]:.0f}", f"{best_theirs[1]:.0f}"])
        ratios = [best_ours[i] / best_theirs[i] for i in (0, 1)]
        rows.append(["ratio memcores / sb3-contrib", f"{ratios[0]:.2f}x", f"{ratios[1]:.2f}x"])
    columns = ["trainer", "frames/s wall", "frames per CPU-second"]
    table = Table(
        f"PPO on {ENV_ID}, {n_envs} envs x {n_steps} steps, best of {repeats}", columns, rows
    )
    tables = [table]
    if not args.skip_scaling:
        tmp = tempfile.mkdtemp(prefix="memcores_bench_rl_")
        try:
            rows = scaling_table(sizes, n_steps, max(2, updates // 2), args.core, args.device, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        tables.append(scaling_record_table(rows))
    write_record(record_folder(args, "rl"), bench="rl", argv=["rl", *argv], tables=tables)
    return 0


def _fmt(fps: tuple[float, float]) -> str:
    return f"{fps[0]:8.0f} frames/s wall, {fps[1]:8.0f} frames per CPU-second"
