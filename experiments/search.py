"""Search spaces of a sweep: the ``search:`` section of a sweep config.

A sweep config may hold, besides the trainer's own sections, a ``search:`` mapping from dotted
config keys to one distribution each::

    search:
      agent.learning_rate: {loguniform: [0.0001, 0.003]}   # log-uniform in [low, high]
      agent.ent_coef: {uniform: [0.0, 0.05]}               # uniform in [low, high]
      agent.n_epochs: {randint: [2, 8]}                    # an integer in [low, high], both in
      core.name: {choice: [lstm, ur_lstm]}                 # one of the values

``memcores sweep --search random|optuna --samples N`` draws N points from it (Tune's random
search or Optuna's TPE); ``--scheduler pbt`` uses it as the initial distribution and the
mutations of Population Based Training. The trainers never see the section
(:data:`SWEEP_KEYS` is removed from a trial's config).

A sampled float is rounded to 4 significant digits before a trial uses it, so the trial's
folder name, its config and its record hold the same value.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

DISTRIBUTIONS = ("uniform", "loguniform", "choice", "randint")
SWEEP_KEYS = ("search",)
"""Config sections that belong to the sweep, not to the trainer."""
SIGNIFICANT = 4
"""Significant digits kept of a sampled float."""


class SearchSpaceError(ValueError):
    """A ``search:`` section that cannot be sampled (named key and valid choices)."""


@dataclasses.dataclass(frozen=True)
class Dist:
    """One key's distribution: ``kind`` in :data:`DISTRIBUTIONS` and its ``args``
    (``(low, high)`` or the choice values)."""

    kind: str
    args: tuple[Any, ...]

    def tune(self) -> Any:
        """The Ray Tune domain of this distribution (randint's ``high`` included); Tune's
        random search samples it, and Optuna's search converts it to its own distribution."""
        from ray import tune

        if self.kind == "choice":
            return tune.choice(list(self.args))
        low, high = self.args
        if self.kind == "randint":
            return tune.randint(int(low), int(high) + 1)  # Tune's high is exclusive
        return (tune.loguniform if self.kind == "loguniform" else tune.uniform)(low, high)


def round_value(value: Any) -> Any:
    """A float kept to :data:`SIGNIFICANT` significant digits; anything else as it is."""
    if isinstance(value, float) and math.isfinite(value) and value != 0.0:
        return float(f"{value:.{SIGNIFICANT}g}")
    return value


def parse_search(section: Any) -> dict[str, Dist]:
    """``{"agent.learning_rate": {"loguniform": [1e-4, 3e-3]}, ...}`` -> ``{key: Dist}``.

    :raises SearchSpaceError: not a mapping, a bad key, an unknown distribution, or bad
        bounds (each message one line naming the key and the valid form).
    """
    if section is None:
        return {}
    if not isinstance(section, Mapping) or not section:
        raise SearchSpaceError(
            "search: must map dotted keys to distributions, e.g. "
            "`agent.learning_rate: {loguniform: [0.0001, 0.003]}`"
        )
    space: dict[str, Dist] = {}
    for key, spec in section.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", key):
            raise SearchSpaceError(f"search: key {key!r} must be a dotted config key (a.b)")
        if key in ("run.dir", "train.seed"):
            raise SearchSpaceError(
                f"search: {key} cannot be sampled; seeds are a grid: --grid train.seed=0,1"
            )
        space[key] = _parse_dist(key, spec)
    return space


def _parse_dist(key: str, spec: Any) -> Dist:
    form = f"valid: {', '.join(f'{{{d}: [...]}}' for d in DISTRIBUTIONS)}"
    if not isinstance(spec, Mapping) or len(spec) != 1:
        raise SearchSpaceError(f"search: {key} must be one distribution; {form}")
    ((kind, args),) = spec.items()
    if kind not in DISTRIBUTIONS:
        raise SearchSpaceError(
            f"search: {key}: unknown distribution {str(kind)[:40]!r}; valid: "
            f"{', '.join(DISTRIBUTIONS)}"
        )
    if not isinstance(args, list) or not args:
        raise SearchSpaceError(f"search: {key}: {kind} takes a list, e.g. {{{kind}: [a, b]}}")
    if kind == "choice":
        if any(isinstance(v, (list, dict)) for v in args) or len(set(map(repr, args))) < len(args):
            raise SearchSpaceError(f"search: {key}: choice takes distinct plain values")
        return Dist(kind, tuple(args))
    numbers = len(args) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in args
    )
    if not numbers:
        raise SearchSpaceError(f"search: {key}: {kind} takes [low, high], two finite numbers")
    low, high = args
    if kind == "randint" and not all(isinstance(v, int) for v in args):
        raise SearchSpaceError(f"search: {key}: randint takes two integers [low, high]")
    if not low < high:
        raise SearchSpaceError(f"search: {key}: {kind} needs low < high, got [{low}, {high}]")
    if kind == "loguniform" and low <= 0:
        raise SearchSpaceError(f"search: {key}: loguniform needs 0 < low, got {low}")
    return Dist(kind, (low, high))


def trial_name(assignment: dict[str, str]) -> str:
    """``{"core.name": "lstm", "train.seed": "0"}`` -> ``name=lstm,seed=0`` (file-system safe;
    the full key where two keys share their last part)."""
    last = [k.rsplit(".", 1)[-1] for k in assignment]
    parts = []
    for key, short in zip(assignment, last, strict=True):
        text = str(assignment[key])
        value = re.sub(r"[^\w.+-]+", "-", text).strip("-")
        value = ("-" if text.startswith("-") else "") + value or "_"  # -1 stays -1, not 1
        parts.append(f"{short if last.count(short) == 1 else key}={value}")
    return ",".join(parts) or "trial"


def override_text(value: Any) -> str:
    """A sampled value as the text of a dotted override that parses back to it: ``None`` as
    ``null`` (``str`` would give the text "None"), booleans as ``true``/``false``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def point_name(values: Mapping[str, Any]) -> str:
    """The folder name of a sampled point: ``learning_rate=0.0012,ent_coef=0.03``."""
    return trial_name({k: _text(v) for k, v in values.items()})


def _text(value: Any) -> str:
    return f"{value:.{SIGNIFICANT}g}" if isinstance(value, float) else str(value)


def round_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """A point's sampled values as the trials use them (floats rounded, see
    :func:`round_value`)."""
    return {key: round_value(value) for key, value in params.items()}


def space_corners(space: Mapping[str, Dist]) -> list[dict[str, Any]]:
    """Points that hold every end of every range and every choice, each key in turn with
    the others at their first value: what to validate before sampling."""
    ends = {key: list(dist.args) for key, dist in space.items()}
    base = {key: values[0] for key, values in ends.items()}
    corners = [base] if base else []
    for key, values in ends.items():
        corners += [{**base, key: value} for value in values[1:]]
    return corners
