"""Learning curves: mean and spread over seeds, one line per core, from runs and records.

Runs and records are found and read by :mod:`experiments.records` (``progress.csv`` of a run
folder, ``curve.csv`` of a committed record); their config says which core, env/task and seed
they used. Runs are grouped by config keys (``core.name`` by default), the runs of one group
(the seeds) are put on a common step grid by linear interpolation over the step range they
all cover, and the plot shows their mean with a min-max or +-1 std band.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from memcores.agents.run import flatten
from memcores.experiments.records import Curve, Run, find_runs
from memcores.experiments.run_groups import label_with_variant, seed_count, variant_names

SPREADS = ("minmax", "std", "none")
SPREAD_NAMES = {"minmax": "min-max", "std": "\u00b11 std", "none": ""}
# Keys that, when they differ between runs, get their own panel instead of sharing axes.
PANEL_KEYS = ("env.id", "task.name", "suite")


@dataclasses.dataclass
class Band:
    """Aggregate of a group's curves on a common grid. Every array is [M]."""

    label: str
    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: int
    seeds: str = ""
    """Distinct seeds among the ``n`` runs (:func:`experiments.run_groups.seed_count`)."""

    @property
    def count(self) -> str:
        """``"seeds=3"``, or ``"seeds=2, runs=3"`` when a seed ran twice."""
        seeds = self.seeds or str(self.n)
        if " " in seeds:
            return f"seeds={seeds.split()[0]}, runs={self.n}"
        return f"seeds={seeds}"


def smooth(values: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard-style exponential moving average; ``weight`` 0 returns ``values``.

    :param values: [N]. NaNs are skipped (they keep the previous average).
    """
    if weight <= 0:
        return values
    out = np.empty_like(values)
    last, debias = 0.0, 0.0
    for i, v in enumerate(values):
        if math.isfinite(v):
            last = weight * last + (1 - weight) * v
            debias = weight * debias + (1 - weight)
        out[i] = last / debias if debias else np.nan
    return out


def aggregate(
    curves: Sequence[Curve],
    label: str,
    spread: str = "minmax",
    points: int = 400,
    seeds: Sequence[object] = (),
) -> Band:
    """Mean and spread of several runs' curves (the seeds of one group).

    The curves are linearly interpolated onto at most ``points`` steps inside the range every
    run covers, so a band never mixes a finished seed with a stopped one. A single run gives a
    band of zero width. ``seeds``: the runs' seeds, for the band's seed count.
    """
    if spread not in SPREADS:
        raise ValueError(f"unknown spread {spread!r}; valid: {', '.join(SPREADS)}")
    curves = [c for c in curves if len(c.steps)]
    if not curves:
        raise ValueError(f"group {label!r} has no data points")
    start = max(int(c.steps[0]) for c in curves)
    stop = min(int(c.steps[-1]) for c in curves)
    if stop < start:  # runs that do not overlap: use the shortest one's range
        shortest = min(curves, key=lambda c: c.steps[-1])
        start, stop = int(shortest.steps[0]), int(shortest.steps[-1])
    steps = np.unique(
        np.concatenate([c.steps[(c.steps >= start) & (c.steps <= stop)] for c in curves])
    )
    if len(steps) > points:
        steps = np.unique(np.linspace(start, stop, points).round().astype(np.int64))
    stack = np.stack([np.interp(steps, c.steps, c.values) for c in curves])  # [runs, M]
    mean, low, high = seed_spread(stack, spread)
    return Band(label, steps, mean, low, high, len(curves), seed_count(seeds) if seeds else "")


def seed_spread(stack: np.ndarray, spread: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, low and high over the seeds (axis 0) of ``stack`` ``[runs, ...]``."""
    mean = stack.mean(axis=0)
    if spread == "minmax":
        return mean, stack.min(axis=0), stack.max(axis=0)
    if spread == "std":
        std = stack.std(axis=0)
        return mean, mean - std, mean + std
    return mean, mean, mean


def group_label(run: Run, keys: Sequence[str]) -> str:
    """``"lstm"`` or ``"lstm, length=200"`` from a run's config; the folder name if none."""
    parts = []
    for i, key in enumerate(keys):
        value = run.get(key)
        if value is None:
            continue
        parts.append(str(value) if i == 0 else f"{key.rsplit('.', 1)[-1]}={value}")
    return ", ".join(parts) or run.path.name


def seed_of(run: Run) -> object:
    """The run's seed; its folder where the config names none."""
    seed = run.get("train.seed")
    return run.path if seed is None else seed


def split_labels(
    runs: Sequence[Run], labels: Sequence[str], ignore: Sequence[str] = ()
) -> list[str]:
    """``labels`` with what sets a run's config apart from the others of its label appended
    (``lstm [agent.n_epochs=4]``), so runs that differ in more than the seed are never drawn
    as one band."""
    variants = variant_names(
        list(range(len(runs))), lambda i: runs[i].config, lambda i: labels[i], ignore
    )
    return [label_with_variant(label, v) for label, v in zip(labels, variants, strict=True)]


def auto_panel_key(runs: Sequence[Run]) -> str | None:
    """The first of ``env.id``, ``task.name``, ``suite`` whose value differs between runs."""
    for key in PANEL_KEYS:
        if len({str(r.get(key)) for r in runs}) > 1:
            return key
    return None


def check_config_keys(runs: Sequence[Run], keys: Iterable[str], option: str) -> None:
    """Refuse a key (``--group-by``, ``--panel-by``) that no run's config has: it would group
    nothing and draw one line per run without a word.

    :raises ValueError: naming the option, the key and the closest keys the configs have.
    """
    known = sorted({k.replace(".options.", ".") for run in runs for k in flatten(run.config)})
    for key in keys:
        if runs and all(run.get(key) is None for run in runs):
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
            hint = f"; close: {', '.join(close)}" if close else ""
            raise ValueError(
                f"{option} {key}: no run's config has this key (e.g. core.name, env.id, "
                f"task.name, train.seed){hint}"
            )


def collect_bands(
    runs: Sequence[Run],
    metric: str,
    group_by: Sequence[str] = ("core.name",),
    panel_by: str | None = None,
    spread: str = "minmax",
    smoothing: float = 0.0,
) -> dict[str, list[Band]]:
    """``{panel value: [Band per group]}`` for ``metric``.

    :raises ValueError: no run logged ``metric`` (the message lists the tags that exist).
    """
    logged: list[tuple[Run, Curve]] = []
    seen_tags: set[str] = set()
    for run in runs:
        scalars = run.curves()
        seen_tags.update(scalars)
        if metric in scalars:
            curve = scalars[metric]
            logged.append((run, Curve(curve.steps, smooth(curve.values, smoothing))))
    if not logged:
        tags = ", ".join(sorted(seen_tags)) or "(none)"
        raise ValueError(f"no run logged the metric {metric!r}; tags found: {tags}")
    found = [run for run, _ in logged]
    check_config_keys(found, group_by, "--group-by")
    check_config_keys(found, [panel_by] if panel_by else [], "--panel-by")
    panel_of = [str(run.get(panel_by)) if panel_by else "" for run in found]
    # the panel is part of the group: runs are compared with those they share a panel with
    keys = [f"{p}\0{group_label(run, group_by)}" for p, run in zip(panel_of, found, strict=True)]
    groups: dict[tuple[str, str], list[tuple[Run, Curve]]] = {}
    for panel, key, item in zip(panel_of, split_labels(found, keys), logged, strict=True):
        groups.setdefault((panel, key.split("\0", 1)[1]), []).append(item)
    panels: dict[str, list[Band]] = {}
    for (panel, label), items in sorted(groups.items()):
        curves = [c for _, c in items]
        seeds = [seed_of(r) for r, _ in items]
        panels.setdefault(panel, []).append(aggregate(curves, label, spread, seeds=seeds))
    return panels


def final_bands(
    runs: Sequence[Run],
    metric: str,
    x_key: str,
    group_by: Sequence[str] = ("core.name",),
    spread: str = "minmax",
) -> list[Band]:
    """The last logged value of ``metric`` against a numeric config key (a delay, a length),
    one :class:`Band` per group whose ``steps`` are the key's values and whose spread is over
    the seeds at each value.

    :raises ValueError: no run logged ``metric`` with a numeric ``x_key`` in its config.
    """
    if spread not in SPREADS:
        raise ValueError(f"unknown spread {spread!r}; valid: {', '.join(SPREADS)}")
    logged: list[tuple[Run, float, float]] = []
    for run in runs:
        curve = run.curves().get(metric)
        x = run.get(x_key)
        if curve is not None and len(curve.values) and isinstance(x, int | float):
            logged.append((run, float(x), float(curve.values[-1])))
    if not logged:
        raise ValueError(f"no run logged {metric!r} with a numeric {x_key!r} in its config")
    found = [run for run, _, _ in logged]
    check_config_keys(found, group_by, "--group-by")
    labels = split_labels(found, [group_label(run, group_by) for run in found], ignore=[x_key])
    points: dict[str, dict[float, list[tuple[float, object]]]] = {}
    for label, (run, x, y) in zip(labels, logged, strict=True):
        points.setdefault(label, {}).setdefault(x, []).append((y, seed_of(run)))
    bands = []
    for label, by_x in sorted(points.items()):
        xs = np.array(sorted(by_x))
        # each key value has its own number of seeds: one spread per value
        stats = [seed_spread(np.array([y for y, _ in by_x[x]]), spread) for x in xs]
        mean, low, high = (np.array(column) for column in zip(*stats, strict=True))
        most = max(by_x.values(), key=len)
        seeds = seed_count([s for _, s in most])
        bands.append(Band(label, xs, mean, low, high, len(most), seeds))
    return bands


def plot_against(
    paths: Iterable[str | Path],
    metric: str,
    x_key: str,
    out: str | Path,
    group_by: Sequence[str] = ("core.name",),
    spread: str = "minmax",
    title: str | None = None,
    log_y: bool = False,
) -> tuple[Path, list[Band]]:
    """Final ``metric`` of the runs under ``paths`` against ``x_key`` (e.g. success against
    the memory delay), one line per group, written to the PNG ``out``."""
    bands = final_bands(find_runs(paths), metric, x_key, group_by, spread)
    name = SPREAD_NAMES[spread]
    title = title or f"final {metric} (mean{', ' + name if name else ''} over seeds)"
    png = plot_bands({"": bands}, metric, out, None, spread, title, log_y, x_label=x_key)
    return png, bands


def plot_bands(
    panels: dict[str, list[Band]],
    metric: str,
    out: str | Path,
    panel_by: str | None = None,
    spread: str = "minmax",
    title: str | None = None,
    log_y: bool = False,
    x_label: str = "step",
) -> Path:
    """Draw one subplot per panel, one line (mean) and band (spread) per group; save a PNG.

    :param log_y: logarithmic y axis (every plotted value must then be positive).
    :param x_label: ``"step"`` for learning curves; another label draws markers at the points.
    """
    if log_y:
        for bands in panels.values():
            for band in bands:
                if band.low.min() <= 0 or band.mean.min() <= 0:
                    raise ValueError(
                        f"--log-y needs positive values; {band.label} reaches "
                        f"{min(band.low.min(), band.mean.min()):.3g} in {metric}"
                    )
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    n = len(panels)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = sorted({b.label for bands in panels.values() for b in bands})
    color_of = {label: colors[i % len(colors)] for i, label in enumerate(labels)}
    band_name = SPREAD_NAMES[spread]
    for ax, (panel, bands) in zip(axes.flat, panels.items(), strict=False):
        for band in bands:
            color = color_of[band.label]
            marker = None if x_label == "step" else "o"
            ax.plot(
                band.steps,
                band.mean,
                color=color,
                marker=marker,
                label=f"{band.label} ({band.count})",
            )
            if spread != "none" and band.n > 1:
                ax.fill_between(band.steps, band.low, band.high, color=color, alpha=0.2, lw=0)
        ax.set_xlabel(x_label)
        ax.set_ylabel(metric)
        if log_y:
            ax.set_yscale("log")
        if panel:
            ax.set_title(f"{panel_by}={panel}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    suffix = f" (mean, {band_name} over seeds)" if band_name else " (mean over seeds)"
    fig.suptitle(title or f"{metric}{suffix}", fontsize=11)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_runs(
    paths: Iterable[str | Path],
    metric: str,
    out: str | Path,
    group_by: Sequence[str] = ("core.name",),
    panel_by: str | None = "auto",
    spread: str = "minmax",
    smoothing: float = 0.0,
    title: str | None = None,
    log_y: bool = False,
) -> tuple[Path, dict[str, list[Band]]]:
    """Find the runs under ``paths``, aggregate ``metric`` and write the PNG ``out``.

    :param panel_by: a config key with one subplot per value, ``"auto"`` (``env.id``/
        ``task.name`` when they vary) or None for a single plot.
    :returns: the PNG path and the bands that were drawn.
    """
    if spread not in SPREADS:
        raise ValueError(f"unknown spread {spread!r}; valid: {', '.join(SPREADS)}")
    if not 0 <= smoothing < 1:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    runs = find_runs(paths)
    if panel_by == "auto":
        panel_by = auto_panel_key(runs)
    panels = collect_bands(runs, metric, group_by, panel_by, spread, smoothing)
    return plot_bands(panels, metric, out, panel_by, spread, title, log_y), panels
