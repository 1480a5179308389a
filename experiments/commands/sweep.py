"""``memcores sweep CONFIG --grid key=v1,v2 [--grid ...] [overrides]``: a grid of trials on
Ray Tune (locally, or on a cluster with ``--address``). See docs/sweeps.md."""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from memcores.experiments.argtypes import (
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    seed,
)
from memcores.experiments.sweep import COMMANDS
from memcores.experiments.sweep_options import (
    BACKENDS,
    CLUSTER_RETRIES,
    SCHEDULERS,
    SEARCHES,
    SweepOptions,
)


def _add_trial_arguments(add: Callable[..., object]) -> None:
    """What each trial runs: the config, its overrides, the grid and where things go."""
    add("config", help="YAML config of a train, supervised or transfer run")
    add("overrides", nargs="*", help="dotted overrides for every trial: train.total_steps=20000")
    add(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="a swept key and its values; several --grid options make a cartesian product",
    )
    add("--out", default=None, help="sweep folder (default runs/sweeps/<config name>)")
    add(
        "--results",
        default=None,
        metavar="DIR",
        help="where finished trials' records go, and trials with a record are skipped "
        "(default results/<sweep folder name>)",
    )
    add(
        "--command",
        choices=COMMANDS,
        default=None,
        help="trial command (default: a `task:` section means supervised, `suite:` transfer, "
        "otherwise train)",
    )


def _add_cluster_arguments(add: Callable[..., object]) -> None:
    """Where the trials run: the backend and the Ray cluster."""
    add(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="ray: Ray Tune; local: one trial after the other in this process; auto: ray "
        "when installed",
    )
    add("--address", default=None, help="Ray cluster (`auto`, `ray://head:10001`)")


def _add_resource_arguments(add: Callable[..., object]) -> None:
    """What each trial may use, and how often a failed one is retried."""
    add("--max-concurrent", type=positive_int, default=1, help="trials running at once (default 1)")
    add("--threads-per-trial", type=positive_int, default=1, help="CPUs Ray reserves per trial")
    add(
        "--gpus-per-trial",
        type=nonnegative_float,
        default=0.0,
        help="GPUs (or a fraction) per trial",
    )
    add(
        "--memory-per-trial",
        type=nonnegative_float,
        default=0.0,
        metavar="GB",
        help="memory Ray reserves per trial (default: none reserved)",
    )
    add(
        "--max-failures",
        type=nonnegative_int,
        default=None,
        help=f"retries of a failed trial from its last checkpoint (default {CLUSTER_RETRIES} "
        "with --address, where a node can be lost; 0 otherwise)",
    )


def _add_search_arguments(add: Callable[..., object]) -> None:
    """How the points are chosen: the grid, random or Optuna."""
    add(
        "--search",
        choices=SEARCHES,
        default="grid",
        help="grid: the --grid points; random or optuna (TPE): --samples points of the "
        "config's `search:` section, each run on every --grid train.seed value",
    )
    add(
        "--samples",
        type=positive_int,
        default=None,
        help="points a random or optuna search draws (default 1)",
    )
    add(
        "--search-seed",
        type=seed,
        default=None,
        help="seed of the search's or PBT's sampler (default 0)",
    )


def _add_scheduler_arguments(add: Callable[..., object]) -> None:
    """The trial scheduler (ASHA, PBT) and the metric it optimises."""
    add(
        "--scheduler",
        choices=SCHEDULERS,
        default="fifo",
        help="asha: stop bad trials early; pbt: Population Based Training of the grid's "
        "members over the config's `search:` section",
    )
    add(
        "--perturbation-interval",
        type=positive_int,
        default=0,
        metavar="STEPS",
        help="pbt: frames between exploit/explore steps",
    )
    add(
        "--metric",
        default=None,
        help="the tag ASHA, PBT or Optuna optimise (e.g. rollout/ep_rew_mean)",
    )
    add("--mode", choices=("max", "min"), default="max", help="is --metric better high or low")
    add(
        "--grace-period",
        type=positive_int,
        default=None,
        help="ASHA: steps (frames or updates) before a trial can be stopped (default 1)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # One helper per group, called in the order the options appear in --help.
    add = parser.add_argument
    _add_trial_arguments(add)
    _add_cluster_arguments(add)
    _add_resource_arguments(add)
    _add_search_arguments(add)
    _add_scheduler_arguments(add)
    add(
        "--trial-timeout",
        type=positive_float,
        default=None,
        help="seconds after which a trial stops",
    )
    add("--dry-run", action="store_true", help="check every trial's config, print them, exit")


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def run(args: argparse.Namespace) -> int:
    from memcores.experiments.config import read_yaml_mapping
    from memcores.experiments.search import parse_search, space_corners
    from memcores.experiments.search_trials import seed_trials
    from memcores.experiments.sweep import (
        check_mode,
        check_space,
        make_trials,
        parse_grid,
        run_sweep,
        summarize,
        sweep_meta,
    )
    from memcores.experiments.trials import validate_trials

    options = SweepOptions(
        args.backend,
        args.address,
        args.max_concurrent,
        args.threads_per_trial,
        args.gpus_per_trial,
        args.max_failures,
        args.scheduler,
        args.metric,
        args.mode,
        args.grace_period,
        args.trial_timeout,
        args.search,
        args.samples,
        args.memory_per_trial,
        args.perturbation_interval,
        args.search_seed,
    )
    options.check()
    grid = parse_grid(args.grid)
    space = parse_search(read_yaml_mapping(args.config).get("search"))
    out = Path(args.out) if args.out else Path("runs/sweeps") / Path(args.config).stem
    command, trials = make_trials(
        args.config,
        grid,
        out,
        command=args.command,
        overrides=args.overrides,
        results_dir=args.results,
    )
    check_space(space, options, trials)
    check_mode(options, trials)
    validate_trials(trials)  # every trial's full config, before any folder exists
    # every sampled value is checked too, at the ends of each range and each choice
    validate_trials([t for v in space_corners(space) for t in seed_trials(trials[:1], v)])
    if args.dry_run:
        if space:
            what = f"{options.points} points" if args.search != "grid" else "each member"
            print(f"{what} of `search:` ({', '.join(space)}) added to:")
        for trial in trials:
            print(f"{trial.name}: {trial.cli()}")
        return 0
    meta = sweep_meta(args.config, command, grid, args.overrides)
    line = shlex.join(["memcores", "sweep", *sys.argv[2:]]) if sys.argv[1:2] == ["sweep"] else ""
    # SIGTERM (kill, a batch scheduler) stops the sweep like Ctrl-C: Tune saves its state.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        results = run_sweep(trials, out, options, meta=meta, command_line=line, space=space)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(summarize(results))
    return 0 if all(r.ok for r in results) else 1
