"""``memcores report SWEEP --out report.md``: markdown result tables with learning-curve plots.

Tables give, per env/task and core (and any other swept key), the final and best value of each
metric as mean ± std over seeds; tables the trials wrote themselves (transfer's train/test
rewards) are averaged over seeds too. Plots are written as PNGs beside the report.
"""

from __future__ import annotations

import argparse

from experiments.core_compare import parse_compare
from experiments.plotting import SPREADS
from experiments.report import DEFAULT_METRICS, build_report


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
        metavar="BASE,OTHER",
        help="two cores set side by side per transfer pair: every seed's return, the difference "
        "of means, whether the seeds separate, Welch's t-test (e.g. lstm,rel_lstm)",
    )


def run(args: argparse.Namespace) -> int:
    text = build_report(
        args.sweep,
        args.out,
        metrics=args.metric,
        spread=args.spread,
        plots=not args.no_plots,
        title=args.title,
        reference=args.reference,
        compare=parse_compare(args.compare) if args.compare else None,
    )
    print(text)
    print(f"\nwrote {args.out}")
    return 0
