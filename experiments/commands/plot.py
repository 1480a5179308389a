"""``memcores plot RUN_OR_SWEEP... --metric TAG --out curves.png``: learning curves.

Reads every run folder (``progress.csv``) and results record (``record.json``) under the given
folders and draws, per group of runs (one core by default), the mean over seeds with a min-max
(or std) band. ``--against KEY`` draws the final value against a numeric config key instead
(success against the memory delay, one line per core).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from memcores.experiments.plotting import SPREADS, plot_against, plot_runs
from memcores.experiments.records import find_runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", help="run folders, sweep folders and/or results folders"
    )
    parser.add_argument(
        "--metric",
        default=None,
        help="logged scalar tag (default rollout/ep_rew_mean; supervised runs: eval/accuracy)",
    )
    parser.add_argument(
        "--out", default=None, help="PNG file to write (default curves.png in this folder)"
    )
    parser.add_argument(
        "--group-by",
        action="append",
        default=None,
        metavar="KEY",
        help="config key(s) that make one line each (default core.name); repeat for several",
    )
    parser.add_argument(
        "--panel-by",
        default="auto",
        help="config key with one subplot per value; auto: env.id or task.name when they "
        "differ between runs; none: one plot",
    )
    parser.add_argument(
        "--spread", choices=SPREADS, default="minmax", help="band over seeds (default minmax)"
    )
    parser.add_argument(
        "--smooth",
        type=float,
        default=0.0,
        help="TensorBoard-style EMA weight in [0, 1) applied to each run before averaging",
    )
    parser.add_argument("--title", default=None, help="figure title")
    parser.add_argument("--log-y", action="store_true", help="logarithmic y axis")
    parser.add_argument(
        "--against",
        default=None,
        metavar="KEY",
        help="numeric config key (e.g. env.kwargs.distractor_steps): plot the final value "
        "against it instead of learning curves",
    )


RL_METRIC = "rollout/ep_rew_mean"
SUPERVISED_METRIC = "eval/accuracy"


def default_metric(paths: list[str]) -> str:
    """``eval/accuracy`` when every run under ``paths`` is supervised, else the RL return."""
    runs = find_runs(paths)
    supervised = bool(runs) and all("task" in run.config for run in runs)
    return SUPERVISED_METRIC if supervised else RL_METRIC


def run(args: argparse.Namespace) -> int:
    args.metric = args.metric or default_metric(args.paths)
    if args.out is None:  # say where: the reader did not choose the place
        args.out = str(Path.cwd() / "curves.png")
    if args.against:
        out, bands = plot_against(
            args.paths,
            args.metric,
            args.against,
            args.out,
            group_by=args.group_by or ["core.name"],
            spread=args.spread,
            title=args.title,
            log_y=args.log_y,
        )
        for b in bands:
            values = ", ".join(f"{x:g}: {m:.3g}" for x, m in zip(b.steps, b.mean, strict=True))
            print(f"{b.label} ({b.count}): {values}")
        print(f"wrote {out}")
        return 0
    panel_by = None if args.panel_by in ("none", "") else args.panel_by
    out, panels = plot_runs(
        args.paths,
        args.metric,
        args.out,
        group_by=args.group_by or ["core.name"],
        panel_by=panel_by,
        spread=args.spread,
        smoothing=args.smooth,
        title=args.title,
        log_y=args.log_y,
    )
    for panel, bands in panels.items():
        head = f"{panel}: " if panel else ""
        lines = ", ".join(f"{b.label} ({b.count}, last mean {b.mean[-1]:.4g})" for b in bands)
        print(f"{head}{lines}")
    print(f"wrote {out}")
    return 0
