"""``memcores transfer SUITE [key.sub=value ...]``: train small, test large (thesis Table 7).

For each (train env, test env) pair of the suite (``memcores list suites``): train an agent on
the train env from ``--config`` plus the overrides (``core.name=rel_lstm``...), evaluate it on
both envs, and write ``table.md`` and ``table.csv`` with the mean train/test returns and
success rates into the output folder (updated after every pair). Every pair's config is
validated before anything is trained or written. Re-running with the same ``--out`` resumes
unfinished pairs and re-evaluates finished ones.
"""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from experiments.argtypes import positive_int

if TYPE_CHECKING:
    from agents.evaluation import EvalResult
    from agents.rl_config import RLConfig

DEFAULT_CONFIG = "experiments/configs/transfer.yaml"

FIELDS = [
    "train_env",
    "test_env",
    "core",
    "algo",
    "frames",
    "train_return",
    "train_success",
    "test_return",
    "test_success",
    "episodes",
    "run_dir",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", help="transfer suite (see `memcores list suites`)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides: core.name=ur_lstm ...")
    parser.add_argument(
        "--config", default=DEFAULT_CONFIG, help=f"base RL config (default {DEFAULT_CONFIG})"
    )
    parser.add_argument(
        "--episodes", type=positive_int, default=100, help="evaluation episodes per env"
    )
    parser.add_argument("--argmax", action="store_true", help="greedy actions in evaluation")
    parser.add_argument(
        "--out", default=None, help="output folder (default runs/transfer_<suite>_<core>)"
    )


def short_name(env_id: str) -> str:
    """``MiniGrid-DoorKey-5x5-v0`` -> ``DoorKey-5x5`` (as the thesis table prints them)."""
    name = env_id.split("/")[-1]
    name = re.sub(r"^(MiniGrid|BabyAI)-", "", name)
    return re.sub(r"-v\d+$", "", name)


def table_row(
    train_id: str,
    test_id: str,
    config: RLConfig,
    frames: int,
    on_train: EvalResult,
    on_test: EvalResult,
    episodes: int,
    run_dir: Path,
) -> dict[str, Any]:
    """One row of the transfer table (the columns of :data:`FIELDS`), for one trained pair.

    Shared by ``memcores transfer`` and the sweep's transfer trials, whose tables must agree.
    """
    return dict(
        train_env=train_id,
        test_env=test_id,
        core=config.core.name,
        algo=config.agent.algo,
        frames=frames,
        train_return=on_train.mean_return,
        train_success=on_train.success_rate,
        test_return=on_test.mean_return,
        test_success=on_test.success_rate,
        episodes=episodes,
        run_dir=str(run_dir),
    )


def write_table_csv(path: Path, rows: list[dict]) -> None:
    """Write ``rows`` to ``path`` as CSV with the :data:`FIELDS` header."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(rows: list[dict], core: str) -> str:
    """Table 7 layout: a Train block and a Test block, then the success rates."""
    lines = [f"| Environment | {core} |", "|---|---|", "| **Train** | |"]
    lines += [f"| {short_name(r['train_env'])} | {r['train_return']:.2f} |" for r in rows]
    lines.append("| **Test** | |")
    lines += [f"| {short_name(r['test_env'])} | {r['test_return']:.2f} |" for r in rows]
    lines += [
        "",
        "| Train env | Test env | frames | train return | train success | test return "
        "| test success |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {short_name(r['train_env'])} | {short_name(r['test_env'])} | {r['frames']} "
        f"| {r['train_return']:.3f} | {r['train_success']:.2f} | {r['test_return']:.3f} "
        f"| {r['test_success']:.2f} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from agents.evaluation import evaluate_run
    from agents.rl_config import RLConfig
    from agents.rl_trainer import (
        CHECKPOINT_NAME,
        load_rl_checkpoint,
        make_vector_env,
        setup,
        train,
    )
    from envs.suites import SUITES
    from experiments.config import load_config

    if args.suite not in SUITES:
        raise ValueError(f"unknown suite {args.suite!r}; valid suites: {', '.join(SUITES)}")
    pairs = list(SUITES[args.suite].pairs)
    base = load_config(RLConfig, args.config, args.overrides)
    out = Path(args.out or f"runs/transfer_{args.suite}_{base.core.name}")

    # Validate every pair (config, env ids, core) before training or writing anything.
    plans = []
    for train_id, test_id in pairs:
        run_dir = out / short_name(train_id)
        config = load_config(
            RLConfig, args.config, [*args.overrides, f"env.id={train_id}", f"run.dir={run_dir}"]
        )
        setup(config).envs.close()
        make_vector_env(test_id, 1, 0).close()
        plans.append((train_id, test_id, config, run_dir))

    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for train_id, test_id, config, run_dir in plans:
        # A pair trained before (same --out) is resumed, or just re-evaluated when finished.
        print(f"== transfer: training {config.core.name} on {train_id} -> {run_dir}")
        train(config, run_dir, resume=(run_dir / CHECKPOINT_NAME).is_file())
        frames = load_rl_checkpoint(run_dir)["global_step"]
        on_train = evaluate_run(run_dir, train_id, args.episodes, args.argmax)
        on_test = evaluate_run(run_dir, test_id, args.episodes, args.argmax)
        print(f"   {on_train.summary()}\n   {on_test.summary()}")
        rows.append(
            table_row(train_id, test_id, config, frames, on_train, on_test, args.episodes, run_dir)
        )
        write_table_csv(out / "table.csv", rows)
        (out / "table.md").write_text(markdown_table(rows, base.core.name))
    print((out / "table.md").read_text())
    print(f"wrote {out / 'table.md'} and {out / 'table.csv'}")
    return 0
