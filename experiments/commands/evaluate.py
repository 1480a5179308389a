"""``memcores evaluate RUN --env ID --episodes N [--argmax]``: mean return and success rate.

RUN is a run folder (``runs/<name>``) or a checkpoint file. The env may differ from the
training env (transfer: train on DoorKey-5x5, evaluate on DoorKey-16x16). ``--phases`` (memory-
match envs) splits the episodes by whether the cue was seen and by how they ended
(:mod:`agents.memory_match_eval`).
"""

from __future__ import annotations

import argparse
import json

from memcores.experiments.argtypes import positive_int, seed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run folder or checkpoint file")
    parser.add_argument("--env", default=None, help="env id (default: the training env)")
    parser.add_argument("--episodes", type=positive_int, default=100, help="episodes (default 100)")
    parser.add_argument("--argmax", action="store_true", help="greedy actions, not sampled")
    parser.add_argument("--seed", type=seed, default=10_000, help="env seed (default 10000)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    parser.add_argument(
        "--vector",
        choices=("sync", "batched", "envpool"),
        default=None,
        help="step the envs in memcores (sync), as batched tensors on --device (batched) or "
        "in EnvPool's C++ MiniGrid (envpool; the envpool extra); default: the run's "
        "env.vector where the env has that version, else sync",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--phases",
        action="store_true",
        help="memory-match envs: outcome (right/wrong ball, timeout) and phase-3 length, "
        "split by whether the cue was seen in phase 1",
    )


def run(args: argparse.Namespace) -> int:
    from memcores.agents.device import resolve_device
    from memcores.agents.evaluation import evaluate_run

    if args.phases:
        return _phases(args, resolve_device(args.device))

    result = evaluate_run(
        args.run,
        args.env,
        args.episodes,
        args.argmax,
        args.seed,
        resolve_device(args.device),
        vector=args.vector,
    )
    if args.json:
        print(
            json.dumps(
                dict(
                    env=result.env_id,
                    episodes=result.episodes,
                    mean_return=result.mean_return,
                    std_return=result.std_return,
                    success_rate=result.success_rate,
                    mean_length=result.mean_length,
                )
            )
        )
    else:
        print(result.summary())
    return 0


def _phases(args: argparse.Namespace, device) -> int:  # noqa: ANN001
    from memcores.agents.evaluation import load_policy
    from memcores.agents.memory_match_eval import phase_breakdown

    policy, config = load_policy(args.run, device)
    env_id = args.env or config.env.id
    kwargs = config.env.kwargs if env_id == config.env.id else {}
    result = phase_breakdown(
        policy, env_id, args.episodes, args.argmax, args.seed, env_kwargs=kwargs
    )
    if args.json:
        print(json.dumps(dict(env=result.env_id, groups=dict(result.groups()))))
    else:
        print(result.summary())
    return 0
