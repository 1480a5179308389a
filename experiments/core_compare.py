"""Cores side by side on every transfer pair: per-seed scores, the difference of means and
Welch's t-test (``memcores report --compare BASE,OTHER[,OTHER...]``), and the paired view
(``--retention``): each run's test score over its own train score.

With three seeds a core's spread on a test env is often as large as the gap between cores, so
a mean alone says little; the tables show every run, whether the two sets of runs separate
(every run of one above every run of the other) and Welch's p (unequal variances). The
retention ratio divides out how well a seed learned the train env, so a core that learned
less but kept what it learned is told apart from one that forgot.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from scipy import stats

from memcores.experiments.transfer_plot import TransferPoint

BLOCKS = ("train", "test")


def parse_compare(text: str) -> tuple[str, ...]:
    """``"lstm,rel_lstm"`` -> ``("lstm", "rel_lstm")``: the baseline core, then the others."""
    names = [name.strip() for name in text.split(",")]
    if len(names) < 2 or not all(names) or len(set(names)) != len(names):
        raise ValueError(
            "--compare takes two or more different core names, BASE,OTHER[,OTHER...] "
            f"(e.g. lstm,rel_lstm); got {text!r}"
        )
    return tuple(names)


def check_cores(points: Sequence[TransferPoint], cores: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the recorded cores if one of ``cores`` has no transfer run."""
    recorded = sorted({p.core for p in points})
    missing = [c for c in cores if c not in recorded]
    if missing:
        raise ValueError(
            f"--compare: no transfer records of {', '.join(missing)}; "
            f"recorded cores: {', '.join(recorded) or 'none'}"
        )


def welch_p(base: Sequence[float], other: Sequence[float]) -> float:
    """Two-sided p of Welch's t-test; NaN with fewer than two runs a side or no spread at all."""
    if len(base) < 2 or len(other) < 2:
        return math.nan
    # The variances come from ``statistics`` (exact on floats): scipy's ttest_ind warns of
    # "precision loss" on a side like [0.99, 0.99], whose float variance is not quite 0.
    var_base = statistics.variance(base) / len(base)
    var_other = statistics.variance(other) / len(other)
    spread = var_base + var_other
    if spread == 0:
        return math.nan
    t = (statistics.fmean(other) - statistics.fmean(base)) / math.sqrt(spread)
    dof = spread**2 / (var_base**2 / (len(base) - 1) + var_other**2 / (len(other) - 1))
    return float(2 * stats.t.sf(abs(t), dof))


def separation(base: Sequence[float], other: Sequence[float]) -> str:
    """``above`` / ``below`` when every run of ``other`` is above / below every run of
    ``base``, else ``overlap``."""
    if min(other) > max(base):
        return "above"
    if max(other) < min(base):
        return "below"
    return "overlap"


def comparison_rows(
    points: Sequence[TransferPoint], base: str, other: str, block: str = "test"
) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the comparison, one row per pair both cores ran: their ``block``
    scores per run (in record order: by seed for a sweep's records), ``other`` minus ``base``
    of the means, :func:`separation` and Welch's p. No rows where the cores share no pair.
    The ``train`` block has one row per train env, however many test envs it was paired with
    (the train scores of its pairs are the same runs)."""
    if block not in BLOCKS:
        raise ValueError(f"unknown block {block!r}; valid: {', '.join(BLOCKS)}")
    by_pair = {(p.core, p.train_env, p.test_env): p for p in points}
    rows, seen = [], set()
    for point in points:
        if point.core != base or (other, point.train_env, point.test_env) not in by_pair:
            continue
        env = point.test_env if block == "test" else point.train_env
        if env in seen:
            continue
        seen.add(env)
        a = getattr(point, block)
        b = getattr(by_pair[(other, point.train_env, point.test_env)], block)
        p = welch_p(a, b)
        rows.append(
            [
                env,
                " / ".join(f"{v:.2f}" for v in a),
                " / ".join(f"{v:.2f}" for v in b),
                f"{statistics.fmean(b) - statistics.fmean(a):+.3f}",
                separation(a, b),
                format_p(p),
            ]
        )
    header = [f"{block} env", f"`{base}` runs", f"`{other}` runs", "difference", "separation"]
    return [*header, "Welch p"], rows


def retention(point: TransferPoint) -> list[float]:
    """Test over train score of each run of ``point`` (NaN where the train score is 0)."""
    return [t / r if r else math.nan for r, t in zip(point.train, point.test, strict=True)]


def retention_rows(
    points: Sequence[TransferPoint], base: str, others: Sequence[str]
) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the retention table: per env pair ``base`` has, one row per core of
    ``base, *others`` that ran it: seeds, train and test score (mean ± std), each run's
    retention ratio (:func:`retention`) and their mean ± std, and Welch's p against ``base``
    on the test score and on the retention ratio (``-`` for the base itself)."""
    by_pair = {(p.core, p.train_env, p.test_env): p for p in points}
    rows = []
    for point in points:
        if point.core != base:
            continue
        base_ratios = _finite(retention(point))
        for core in (base, *others):
            other = by_pair.get((core, point.train_env, point.test_env))
            if other is None:
                continue
            ratios = retention(other)
            p_test = welch_p(point.test, other.test) if core != base else math.nan
            p_ratio = welch_p(base_ratios, _finite(ratios)) if core != base else math.nan
            rows.append(
                [
                    f"{point.train_env} -> {point.test_env}",
                    core,
                    str(len(set(other.seeds)) if other.seeds else len(other.test)),
                    mean_std(other.train),
                    mean_std(other.test),
                    " / ".join("-" if math.isnan(r) else f"{r:.2f}" for r in ratios),
                    mean_std(_finite(ratios)),
                    format_p(p_test),
                    format_p(p_ratio),
                ]
            )
    header = ["env pair", "core", "seeds", "train", "test", "retention per run", "retention"]
    return [*header, f"Welch p test vs `{base}`", f"Welch p retention vs `{base}`"], rows


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


def mean_std(values: Sequence[float]) -> str:
    """``"mean ± sample std"`` to three decimals; the value alone for one, ``-`` for none."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def format_p(value: float) -> str:
    """A p-value to two significant figures (``0.45``, ``0.0053``; below 0.001 ``4.3e-05``),
    never rounded to ``0.00``; ``-`` for NaN."""
    if math.isnan(value):
        return "-"
    return f"{value:#.2g}" if value >= 0.001 else f"{value:.1e}"
