"""``memcores train CONFIG [key.sub=value ...] [--resume]``: train a recurrent PPO/A2C agent.

The whole config (keys, values, core name/options, env id, device) is validated before the run
folder is created; a bad one stops with a message naming it and the valid choices.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.config import load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config, e.g. experiments/configs/demo_rl.yaml")
    parser.add_argument(
        "overrides", nargs="*", help="dotted overrides: core.name=ur_lstm agent.seq_len=64 ..."
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue from RUN_DIR/checkpoints/last.pt"
    )


def resolve_run_dir(config_path: str, run_dir: str) -> Path:
    """``run.dir`` or, when empty, ``runs/<config file stem>``."""
    return Path(run_dir) if run_dir else Path("runs") / Path(config_path).stem


def run(args: argparse.Namespace) -> int:
    from agents.rl_config import RLConfig
    from agents.rl_trainer import train

    config = load_config(RLConfig, args.config, args.overrides)
    run_dir = resolve_run_dir(args.config, config.run.dir)
    config.run.dir = str(run_dir)
    result = train(config, run_dir, resume=args.resume)
    print(
        f"trained {result.global_step} frames ({result.updates} updates, "
        f"{result.skipped_updates} minibatches skipped): "
        f"ep_rew_mean={result.ep_rew_mean:.3f} success_rate={result.success_rate:.3f} "
        f"-> {result.run_dir}"
    )
    return 0
