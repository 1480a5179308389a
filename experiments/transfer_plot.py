"""The transfer figure: each core's train-env score against its test-env score, one panel per
env pair, with a published table's points (the thesis's Table 7) beside ours.

A point on the diagonal transferred without loss; the distance below it is what the larger
env costs. ``memcores report`` draws it beside its train/test tables.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


@dataclasses.dataclass
class TransferPoint:
    """One core on one (train env, test env) pair: a train and a test score per run."""

    core: str
    train_env: str
    test_env: str
    train: list[float] = dataclasses.field(default_factory=list)
    test: list[float] = dataclasses.field(default_factory=list)
    seeds: list[str] = dataclasses.field(default_factory=list)
    """The seed of each run, in the order of ``train`` and ``test``."""


def reference_point(
    reference: dict[str, Any] | None, core: str, train_env: str, test_env: str
) -> tuple[float, float] | None:
    """The published ``(train, test)`` of ``core`` on the pair (short env names), if any."""
    if not reference:
        return None
    train = (reference.get("train") or {}).get(train_env, {}).get(core)
    test = (reference.get("test") or {}).get(test_env, {}).get(core)
    if train is None or test is None:
        return None
    return float(train), float(test)


def plot_transfer(
    points: Sequence[TransferPoint],
    out: str | Path,
    quantity: str = "return",
    reference: dict[str, Any] | None = None,
    core_order: Sequence[str] = (),
) -> Path:
    """Draw one panel per env pair: train ``quantity`` (x) against test ``quantity`` (y) per
    core, the mean over runs with a +-1 std cross where there are several, the reference's
    points as hollow squares in the core's colour; save the PNG ``out``.

    :raises ValueError: no points.
    """
    if not points:
        raise ValueError("no train/test pairs to plot")
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    pairs = list(dict.fromkeys((p.train_env, p.test_env) for p in points))
    cores = [c for c in core_order if any(p.core == c for p in points)]
    cores += sorted({p.core for p in points} - set(cores))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color_of = {core: colors[i % len(colors)] for i, core in enumerate(cores)}
    cols = min(len(pairs), 3)
    rows = math.ceil(len(pairs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 4.0 * rows), squeeze=False)
    ref_label = (reference or {}).get("label", "reference")
    for ax, (train_env, test_env) in zip(axes.flat, pairs, strict=False):
        values: list[float] = []
        for point in (p for p in points if (p.train_env, p.test_env) == (train_env, test_env)):
            x, y = np.asarray(point.train), np.asarray(point.test)
            sx = x.std(ddof=1) if len(x) > 1 else 0.0
            sy = y.std(ddof=1) if len(y) > 1 else 0.0
            color = color_of[point.core]
            ax.errorbar(x.mean(), y.mean(), xerr=sx, yerr=sy, fmt="o", color=color, capsize=2)
            values += [x.mean() - sx, x.mean() + sx, y.mean() - sy, y.mean() + sy]
            ref = reference_point(reference, point.core, train_env, test_env)
            if ref is not None:
                ax.plot(*ref, "s", mfc="none", mec=color, ms=8)
                values += list(ref)
        low, high = min(0.0, *values), max(1.0, *values)
        ax.plot([low, high], [low, high], ":", color="grey", lw=1)
        ax.set_xlim(low - 0.03, high + 0.03)
        ax.set_ylim(low - 0.03, high + 0.03)
        ax.set_title(f"{train_env} -> {test_env}", fontsize=9)
        ax.set_xlabel(f"train {quantity}")
        ax.set_ylabel(f"test {quantity}")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(pairs) :]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], marker="o", ls="", color=color_of[c], label=c) for c in cores]
    if reference:
        handles.append(
            plt.Line2D([], [], marker="s", ls="", mfc="none", mec="black", label=ref_label)
        )
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), frameon=False)
    fig.suptitle(f"train vs test {quantity} per env pair (mean, ±1 std over seeds)")
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_retention(
    points: Sequence[TransferPoint], cores: Sequence[str], out: str | Path, quantity: str
) -> Path:
    """One panel per env pair: for each of ``cores``, every run's train and test
    ``quantity`` as dots (a line joins the two of one run), the means as bars, and the mean
    retention (test / train per run) written above; save the PNG ``out``.

    :raises ValueError: none of ``cores`` has a point.
    """
    points = [p for p in points if p.core in cores]
    if not points:
        raise ValueError(f"no train/test pairs of {', '.join(cores)} to plot")
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    pairs = list(dict.fromkeys((p.train_env, p.test_env) for p in points))
    cols = min(len(pairs), 2)
    rows = math.ceil(len(pairs) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(1.6 + 1.5 * len(cores) * cols, 3.6 * rows), squeeze=False
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    top = max(1.0, *(v for p in points for v in (*p.train, *p.test)))
    for ax, pair in zip(axes.flat, pairs, strict=False):
        by_core = {p.core: p for p in points if (p.train_env, p.test_env) == pair}
        for i, core in enumerate(c for c in cores if c in by_core):
            point = by_core[core]
            train, test = np.asarray(point.train), np.asarray(point.test)
            x = np.array([i - 0.18, i + 0.18])
            ax.bar(
                x,
                [train.mean(), test.mean()],
                width=0.32,
                color=colors[i % len(colors)],
                alpha=0.35,
                edgecolor=colors[i % len(colors)],
            )
            for r, t in zip(train, test, strict=True):
                ax.plot(x, [r, t], "-o", color=colors[i % len(colors)], ms=3, lw=0.8)
            kept = [t / r for r, t in zip(train, test, strict=True) if r]
            if kept:
                ax.text(i, top * 1.03, f"{np.mean(kept):.2f}", ha="center", fontsize=8)
        names = [c for c in cores if c in by_core]
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_ylim(min(0.0, *(v for p in by_core.values() for v in p.test)), top * 1.12)
        ax.set_ylabel(f"{quantity} (left: train, right: test)", fontsize=8)
        ax.set_title(f"{pair[0]} -> {pair[1]}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(pairs) :]:
        ax.set_visible(False)
    fig.suptitle(f"train and test {quantity} per run (bars: means; above: mean test/train)")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
