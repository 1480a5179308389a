"""``memcores report SWEEP --out report.md``: markdown result tables with learning-curve plots.

Tables give, per env/task and core (and any other swept key), the final and best value of each
metric as mean ± std over seeds; tables the trials wrote themselves (transfer's train/test
rewards) are averaged over seeds too. Plots are written as PNGs beside the report.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from memcores.experiments.argtypes import finite_float
from memcores.experiments.core_compare import parse_compare
from memcores.experiments.plotting import SPREADS
from memcores.experiments.report import DEFAULT_METRICS, SECTIONS, TRANSFER_QUANTITIES, build_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sweep", help="sweep folder (the --out of `memcores sweep`) or a results folder of records"
    )
    parser.add_argument("--out", default="report.md", help="markdown file; PNGs go beside it")
    parser.add_argument(
        "--metric",
        action="append",
        default=None,
        help="scalar tag to tabulate and plot (repeat for several); default: those of "
        f"{', '.join(DEFAULT_METRICS)} that were logged",
    )
    parser.add_argument(
        "--spread", choices=SPREADS, default="minmax", help="band over seeds in the plots"
    )
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    parser.add_argument("--title", default=None, help="report title")
    parser.add_argument(
        "--reference",
        default=None,
        help="YAML of published train/test returns shown beside ours in the transfer table, "
        "e.g. experiments/configs/references/thesis_table7.yaml",
    )
    parser.add_argument(
        "--compare",
        default=None,
        metavar="BASE,OTHER[,OTHER...]",
        help="cores set side by side with the first per transfer pair: every seed's score, the "
        "difference of means, whether the seeds separate, Welch's t-test (e.g. lstm,rel_lstm)",
    )
    parser.add_argument(
        "--quantity",
        choices=TRANSFER_QUANTITIES,
        default="return",
        help="what --compare compares: the evaluation's mean return (default) or success rate",
    )
    parser.add_argument(
        "--retention",
        action="store_true",
        help="with --compare: one table of train, test and retention (test / train of each "
        "run) per core with Welch's p against BASE, and its figure",
    )
    parser.add_argument(
        "--threshold",
        type=finite_float,
        default=None,
        help="also give each run's first step at which the metric reached this level (from "
        "the record's full-curve numbers where it keeps them: 0.5, 0.8, 0.9, 0.95, 0.99)",
    )
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated parts to write, in this order (default all): {', '.join(SECTIONS)}",
    )


def command_line(argv: list[str]) -> str:
    """``memcores report ...`` as typed (quoted where needed), for the report's header."""
    return "memcores " + shlex.join(argv)


def run(args: argparse.Namespace) -> int:
    if args.retention and not args.compare:
        raise ValueError("--retention needs --compare BASE,OTHER[,OTHER...]")
    text = build_report(
        args.sweep,
        args.out,
        metrics=args.metric,
        spread=args.spread,
        plots=not args.no_plots,
        title=args.title,
        reference=args.reference,
        compare=parse_compare(args.compare) if args.compare else None,
        quantity=args.quantity,
        retention=args.retention,
        sections=[name.strip() for name in args.sections.split(",") if name.strip()],
        command=command_line(sys.argv[1:]) if sys.argv[1:2] == ["report"] else "",
        threshold=args.threshold,
    )
    print(text)
    print(f"\nwrote {args.out}")
    return 0
