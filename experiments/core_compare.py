"""Two cores side by side on every transfer pair: per-seed scores, the difference of means and
Welch's t-test (``memcores report --compare BASE,OTHER``).

With three seeds a core's spread on a test env is often as large as the gap between cores, so
a mean alone says little; the table shows every run, whether the two sets of runs separate
(every run of one above every run of the other) and Welch's p (unequal variances).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from scipy import stats

from experiments.transfer_plot import TransferPoint

BLOCKS = ("train", "test")


def parse_compare(text: str) -> tuple[str, str]:
    """``"lstm,rel_lstm"`` -> ``("lstm", "rel_lstm")``: the baseline core, then the other."""
    names = [name.strip() for name in text.split(",")]
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise ValueError(
            f"--compare takes two different core names, BASE,OTHER (e.g. lstm,rel_lstm); "
            f"got {text!r}"
        )
    return names[0], names[1]


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
    if statistics.pvariance(base) == 0 and statistics.pvariance(other) == 0:
        return math.nan
    return float(stats.ttest_ind(other, base, equal_var=False).pvalue)


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
    of the means, :func:`separation` and Welch's p. No rows where the cores share no pair."""
    if block not in BLOCKS:
        raise ValueError(f"unknown block {block!r}; valid: {', '.join(BLOCKS)}")
    by_pair = {(p.core, p.train_env, p.test_env): p for p in points}
    rows = []
    for point in points:
        if point.core != base or (other, point.train_env, point.test_env) not in by_pair:
            continue
        a = getattr(point, block)
        b = getattr(by_pair[(other, point.train_env, point.test_env)], block)
        env = point.test_env if block == "test" else point.train_env
        p = welch_p(a, b)
        rows.append(
            [
                env,
                " / ".join(f"{v:.2f}" for v in a),
                " / ".join(f"{v:.2f}" for v in b),
                f"{statistics.fmean(b) - statistics.fmean(a):+.3f}",
                separation(a, b),
                "-" if math.isnan(p) else f"{p:.2f}",
            ]
        )
    header = [f"{block} env", f"`{base}` runs", f"`{other}` runs", "difference", "separation"]
    return [*header, "Welch p"], rows
