"""``memcores sweep CONFIG --grid key=v1,v2 [--grid ...] [overrides]``: run a grid of trials.

Each trial is the normal ``memcores train|supervised|transfer CONFIG overrides run.dir=...``
in its own process, on Ray Tune when it is installed (locally, or on a cluster with
``--address``) and in local processes otherwise. See docs/sweeps.md.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from experiments.sweep import (
    BACKENDS,
    COMMANDS,
    DEFAULT_TEMPLATE,
    make_trials,
    parse_grid,
    run_sweep,
    summarize,
    validate_trials,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML config of a train, supervised or transfer run")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="dotted overrides applied to every trial, e.g. train.total_steps=20000",
    )
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="a swept key and its values; several --grid options make a cartesian product",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="sweep folder (default runs/sweeps/<config name>); re-running skips finished trials",
    )
    parser.add_argument(
        "--command",
        choices=COMMANDS,
        default=None,
        help="trial command (default: inferred from the config: a `task:` section means "
        "supervised, `suite:` means transfer, otherwise train)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="ray (Ray Tune), local (child processes), auto: ray when installed",
    )
    parser.add_argument(
        "--address",
        default=None,
        help="Ray cluster address (`auto`, `ray://head:10001`); default: a private local Ray",
    )
    parser.add_argument(
        "--max-concurrent", type=int, default=1, help="trials running at once (default 1)"
    )
    parser.add_argument(
        "--threads-per-trial",
        type=int,
        default=1,
        help="OMP/MKL threads of each trial unless already set in the environment, and the "
        "CPUs Ray reserves for it (default 1)",
    )
    parser.add_argument(
        "--gpus-per-trial",
        type=float,
        default=0.0,
        help="Ray: GPUs (or a fraction, e.g. 0.5) reserved per trial; add train.device=cuda",
    )
    parser.add_argument(
        "--trial-timeout",
        type=float,
        default=None,
        help="seconds after which a trial is killed and reported as timeout",
    )
    parser.add_argument(
        "--command-template",
        default=DEFAULT_TEMPLATE,
        help="how a trial is started; placeholders {python} {command} {config} {overrides} "
        f"(default: {DEFAULT_TEMPLATE!r})",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue unfinished trials from their last checkpoint (train/supervised "
        "--resume; transfer resumes its env pairs) instead of restarting them",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the trials' command lines and exit"
    )
    # Overrides may come before or after the options (`sweep CFG --grid a=1,2 train.seed=3`);
    # plain parse_args rejects positionals after options, the intermixed parser accepts both.
    parser.parse_args = parser.parse_intermixed_args  # type: ignore[method-assign]


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def run(args: argparse.Namespace) -> int:
    if args.max_concurrent < 1:
        raise ValueError(f"--max-concurrent must be >= 1, got {args.max_concurrent}")
    if args.threads_per_trial < 1 or args.gpus_per_trial < 0:
        raise ValueError("--threads-per-trial must be >= 1 and --gpus-per-trial >= 0")
    grid = parse_grid(args.grid)
    out = Path(args.out) if args.out else Path("runs/sweeps") / Path(args.config).stem
    command, trials = make_trials(
        args.config,
        grid,
        out,
        command=args.command,
        overrides=args.overrides,
        template=args.command_template,
        timeout=args.trial_timeout,
        threads_per_trial=args.threads_per_trial,
        gpus_per_trial=args.gpus_per_trial,
        resume=args.resume,
    )
    if args.command_template == DEFAULT_TEMPLATE:
        # the trials run memcores itself: check each trial's config now, before any folder exists
        validate_trials(command, trials)
    if args.dry_run:
        import shlex

        for trial in trials:
            print(f"{trial.name}: {shlex.join(trial.argv)}")
        return 0
    meta = {
        "config": str(Path(args.config).resolve()),
        "command": command,
        "grid": {k: v for k, v in grid},
        "overrides": list(args.overrides),
    }
    # A sweep stopped with SIGTERM (kill, a batch scheduler) must take its trials along; the
    # runners kill their children on KeyboardInterrupt, so turn SIGTERM into one.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        results = run_sweep(
            trials,
            out,
            backend=args.backend,
            address=args.address,
            max_concurrent=args.max_concurrent,
            meta=meta,
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(summarize(results))
    return 0 if all(r.ok for r in results) else 1
