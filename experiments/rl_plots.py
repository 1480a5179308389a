"""Learning curves of RL runs as a PNG, straight from their ``progress.csv``.

python -m experiments.rl_plots runs/doorkey5 runs/memory_s7 --out docs/img/rl_curves.png
python -m experiments.rl_plots runs/ms7_* --label core --title "MemoryS7, core swap"
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import yaml


def read_progress(run: str | Path, tag: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of ``tag`` in ``run/progress.csv`` (empty/NaN cells skipped)."""
    steps, values = [], []
    with (Path(run) / "progress.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            cell = row.get(tag, "")
            if cell in ("", None):
                continue
            value = float(cell)
            if math.isfinite(value):
                steps.append(float(row["step"]))
                values.append(value)
    return steps, values


def run_label(run: str | Path, label: str) -> str:
    """``name`` (folder name), ``core`` (core name) or ``env`` (env id) of a run."""
    run = Path(run)
    if label == "name":
        return run.name
    config = yaml.safe_load((run / "config.yaml").read_text())
    return str(config["core"]["name"] if label == "core" else config["env"]["id"])


def plot_runs(
    runs: list[str | Path],
    out: str | Path,
    tag: str = "rollout/ep_rew_mean",
    label: str = "name",
    title: str | None = None,
    target: float | None = 0.9,
) -> Path:
    """One curve per run of ``tag`` against frames; a dashed line at ``target``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for run in runs:
        steps, values = read_progress(run, tag)
        ax.plot(steps, values, label=run_label(run, label))
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("frames")
    ax.set_ylabel(tag)
    ax.set_title(title or tag)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", help="run folders (with progress.csv)")
    parser.add_argument("--out", required=True, help="PNG path")
    parser.add_argument("--tag", default="rollout/ep_rew_mean", help="progress.csv column")
    parser.add_argument("--label", choices=["name", "core", "env"], default="name")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    print(plot_runs(args.runs, args.out, args.tag, args.label, args.title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
