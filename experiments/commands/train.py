"""``memcores train CONFIG [key.sub=value ...] [--resume]``: train a recurrent PPO/A2C agent.

The whole config (keys, values, core name/options, env id, device) is validated before the run
folder is created; a bad one stops with a message naming it and the valid choices.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memcores.experiments.config import config_path as config_file
from memcores.experiments.config import load_config, read_yaml_mapping


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


def algo_defaults(config_path: str, overrides: list[str]) -> list[str]:
    """The switched-to algorithm's defaults when ``agent.algo=...`` changes the file's algorithm
    (:func:`agents.rl_config.algo_switch_overrides`); says on stderr which keys it set."""
    from memcores.agents.rl_config import algo_switch_overrides

    path = config_file(config_path)
    agent = read_yaml_mapping(path).get("agent") if path.is_file() else None
    file_algo = agent.get("algo", "ppo") if isinstance(agent, dict) else "ppo"
    extra = algo_switch_overrides(str(file_algo), overrides)
    if extra:
        print(
            f"memcores train: {config_path} is a {file_algo} config; using the new algorithm's "
            f"defaults for the keys not given: {' '.join(extra)}",
            file=sys.stderr,
        )
    return extra


def run(args: argparse.Namespace) -> int:
    from memcores.agents.rl_config import RLConfig
    from memcores.agents.rl_trainer import train

    overrides = [*algo_defaults(args.config, args.overrides), *args.overrides]
    config = load_config(RLConfig, args.config, overrides)
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
