"""Algorithms side by side on the same envs and core: one results folder of records per
algorithm, the first the baseline.

    python -m memcores.experiments.algo_compare results/popgym_150k results/popgym_150k_pqn \\
        results/popgym_150k_r2d2 --core gru --out results/sweeps/popgym_150k_algos.md

For each env the baseline and every other folder recorded with ``--core``, the table gives
each algorithm's final ``--metric`` (default ``rollout/ep_rew_mean``; the memory-match rooms
also record ``rollout/success_rate``) per seed (seed order), mean ± sample std, the
difference of means against the baseline, whether the runs separate (every run above / below
every baseline run), Welch's two-sided p (unequal variances; ``-`` below two seeds a side or
with no spread at all), and what the runs cost: their frames and their wall time in seconds
(the records' ``frames`` and ``wall_seconds``, a range when the runs differ).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from memcores.agents.files import write_text_atomic
from memcores.experiments.core_compare import format_p, mean_std, separation, welch_p

METRICS = ("rollout/ep_rew_mean", "rollout/success_rate")
"""What a record's ``final`` holds that the table can compare."""


def _records_by_env(folder: Path, core: str, metric: str) -> dict[str, list[dict]]:
    """``env id -> records`` under ``folder`` with ``core`` whose ``final`` holds ``metric``."""
    by_env: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*/record.json")):
        record = json.loads(path.read_text())
        if record.get("core") == core and metric in record.get("final", {}):
            by_env.setdefault(record["env"], []).append(record)
    return by_env


def _span(values: list[float], digits: int = 0) -> str:
    """``"a"`` when every value rounds alike, else ``"min-max"``; ``"-"`` for none."""
    if not values:
        return "-"
    low, high = (f"{v:,.{digits}f}" for v in (min(values), max(values)))
    return low if low == high else f"{low}-{high}"


def run_costs(records: list[dict]) -> list[str]:
    """``[frames, wall seconds]`` of ``records``, each one value or a ``min-max`` range (``-``
    where the records do not say)."""
    frames = [r["frames"] for r in records if "frames" in r]
    walls = [r["wall_seconds"] for r in records if "wall_seconds" in r]
    return [_span(frames), _span(walls)]


def _scores_in_seed_order(records: list[dict], metric: str) -> list[float]:
    """The final ``metric`` of ``records``, one per seed (a later record of a seed wins)."""
    by_seed = {int(r["seed"]): r["final"][metric] for r in records}
    return [by_seed[seed] for seed in sorted(by_seed)]


def compare_rows(folders: list[Path], core: str, metric: str = METRICS[0]) -> list[list[str]]:
    """One row per (env, algorithm) of the table (see the module docstring), for the envs
    that a folder besides the baseline recorded."""
    base_records = _records_by_env(folders[0], core, metric)
    others = [(folder, _records_by_env(folder, core, metric)) for folder in folders[1:]]
    rows = []
    for env in sorted(base_records):
        if not any(env in records for _, records in others):
            continue
        base = _scores_in_seed_order(base_records[env], metric)
        rows.append(
            [env, core, folders[0].name, ", ".join(f"{v:.3f}" for v in base), mean_std(base)]
        )
        rows[-1] += ["", "", "", *run_costs(base_records[env])]
        for folder, records in others:
            if env not in records:
                continue
            runs = _scores_in_seed_order(records[env], metric)
            diff = statistics.mean(runs) - statistics.mean(base)
            rows.append(
                [env, core, folder.name, ", ".join(f"{v:.3f}" for v in runs), mean_std(runs),
                 f"{diff:+.3f}", separation(base, runs), format_p(welch_p(base, runs)),
                 *run_costs(records[env])]
            )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memcores.experiments.algo_compare")
    parser.add_argument("folders", nargs="+", help="results folders; the first is the baseline")
    parser.add_argument(
        "--core", nargs="+", required=True, help="core.name(s) of the compared records"
    )
    parser.add_argument(
        "--metric", default=METRICS[0], choices=METRICS, help="the final value compared"
    )
    parser.add_argument("--out", default=None, help="markdown file (default: print)")
    args = parser.parse_args(argv)
    folders = [Path(f) for f in args.folders]
    header = ["env.id", "core.name", "records", "final per seed", "mean ± std", "vs first"]
    header += ["runs", "Welch p", "frames", "wall s"]
    rows = [row for core in args.core for row in compare_rows(folders, core, args.metric)]
    metric = "" if args.metric == METRICS[0] else f" --metric {args.metric}"
    lines = [
        f"# {', '.join(args.core)}: {', '.join(f.name for f in folders)}",
        "",
        f"Final `{args.metric}` of each record (seed order); the difference of means, separation "
        f"and Welch's two-sided p against `{folders[0].name}`; the runs' frames and wall seconds "
        f"(a machine's load varies between runs: wall time is cost, not speed). Made by "
        f"`python -m "
        f"memcores.experiments.algo_compare {' '.join(args.folders)} --core {' '.join(args.core)}"
        f"{metric}{' --out ' + args.out if args.out else ''}`.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    text = "\n".join(lines) + "\n"
    if args.out:
        write_text_atomic(Path(args.out), text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
