"""``memcores supervised CONFIG [key=value ...] [--resume | --eval-only]``.

Train a core on a sequence task, resume a run, or evaluate a trained run (at other task
lengths for transfer). CONFIG is a YAML file (``experiments/configs/copy.yaml``) or a run
directory (its saved ``config.yaml`` is used and ``run.dir`` is that directory).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memcores.agents.files import write_text_atomic
from memcores.agents.supervised_config import SupervisedConfig
from memcores.experiments.argtypes import output_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config file, or a run directory")
    parser.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. core.name=ur_lstm task.length=500"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--resume", action="store_true", help="continue the run in run.dir from its checkpoint"
    )
    mode.add_argument(
        "--eval-only",
        action="store_true",
        help="evaluate a trained run (its saved config + overrides, e.g. task.length=2000)",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="RUN_DIR",
        help="with --eval-only: the run directory to evaluate (default: CONFIG or its run.dir)",
    )
    parser.add_argument(
        "--eval-lengths",
        metavar="T1,T2,...",
        help="with --eval-only: evaluate at each task.length (transfer copy), e.g. 200,400,1000",
    )
    parser.add_argument(
        "--json", metavar="FILE", type=output_file, help="with --eval-only: also write the results"
    )


def load(config_arg: str, overrides: list[str]) -> SupervisedConfig:
    """Config from a YAML file or a run directory (whose run.dir is then that directory)."""
    from memcores.experiments.config import load_config

    path = Path(config_arg)
    if path.is_dir():
        if not (path / "config.yaml").is_file():
            raise FileNotFoundError(
                f"config path {path} is a folder, not a YAML file nor a run folder "
                "(it has no config.yaml)"
            )
        return load_config(SupervisedConfig, path / "config.yaml", [*overrides, f"run.dir={path}"])
    return load_config(SupervisedConfig, path, overrides)


def run(args: argparse.Namespace) -> int:
    from memcores.agents import supervised

    if args.eval_only:
        return _eval_only(args)
    if args.eval_lengths or args.checkpoint or args.json:
        raise ValueError("--eval-lengths, --checkpoint and --json go with --eval-only")
    config = load(args.config, args.overrides)
    results = supervised.train(config, resume=args.resume)
    run_dir = config.run.dir or supervised.default_run_dir(config)
    print(
        f"run: {run_dir}  steps: {results['step']}  skipped: {results['skipped_updates']}  "
        f"wall: {results['wall_s']} s"
    )
    for key, value in results["final"].items():
        print(f"  {key:<32} {value:.4f}")
    return 0


def _eval_only(args: argparse.Namespace) -> int:
    from memcores.agents import supervised

    if args.checkpoint:
        run_dir = Path(args.checkpoint)
    elif Path(args.config).is_dir():
        run_dir = Path(args.config)
    else:
        config = load(args.config, args.overrides)
        run_dir = Path(config.run.dir or supervised.default_run_dir(config))
    saved = load(str(run_dir), [])
    config = load(str(run_dir), args.overrides)
    lengths = None
    if args.eval_lengths:
        try:
            lengths = [int(v) for v in args.eval_lengths.split(",") if v.strip()]
        except ValueError:
            raise ValueError(
                f"--eval-lengths must be integers, got {args.eval_lengths!r}"
            ) from None
    results = supervised.evaluate_run(run_dir, config, saved, lengths)
    keys = sorted({k for m in results.values() for k in m})
    print(f"{'':<10}" + "".join(f"{k:>12}" for k in keys))
    for label, metrics in results.items():
        print(f"{label:<10}" + "".join(f"{metrics.get(k, float('nan')):>12.4f}" for k in keys))
    if args.json:
        write_text_atomic(args.json, json.dumps(results, indent=2))  # makes missing folders
    return 0
