"""``memcores record RUN_DIR --out results/<experiment>/<trial>``: commit a run's small record.

Writes ``record.json``, ``config.yaml`` and ``curve.csv`` (<= 300 rows) from a finished run
folder, and with ``--policy`` the final policy weights (refused over 1 MB). A record of
another run already in ``--out``, or a run folder as ``--out``, is kept unless ``--replace``
is given; a run that stopped before its budget is recorded as incomplete. See
:mod:`experiments.records`.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a finished run folder (config.yaml + progress.csv)")
    parser.add_argument("--out", required=True, help="record folder results/<experiment>/<trial>")
    parser.add_argument(
        "--command", default="", help="the exact command that produced the run (stored as is)"
    )
    parser.add_argument(
        "--policy",
        action="store_true",
        help="also keep the final policy (RL runs; refused over 1 MB)",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help="overwrite a record of a different run in --out (refused by default)",
    )


def run(args: argparse.Namespace) -> int:
    from memcores.experiments.records import (
        CURVE_FILE,
        POLICY_FILE,
        RECORD_FILE,
        read_record,
        write_record,
    )

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder results/<experiment>/<trial>")
    try:
        path = write_record(
            args.run_dir,
            out,
            command=args.command,
            policy=args.policy,
            replace=args.replace,
            require_policy=args.policy,
        )
    except PermissionError as err:
        raise ValueError(f"cannot write the record into {out}: {err.strerror}") from None
    record = read_record(path.parent).record
    written = [RECORD_FILE, "config.yaml", CURVE_FILE] + ([POLICY_FILE] if args.policy else [])
    print(f"wrote {path.parent} ({', '.join(sorted(written))})")
    if record.get("incomplete"):
        unit = "updates" if record.get("kind") == "supervised" else "frames"
        print(
            f"note: incomplete run: {record.get(unit)} of {record.get('planned')} {unit}; "
            "the record says so and reports mark it"
        )
    if not args.command:
        print(f"note: no --command given; consider: --command {shlex.quote('memcores ...')}")
    return 0
