"""The order of a sweep's results and PBT's bounds, against values written out by hand: a
test of the set of results cannot catch a best point named wrongly."""

from __future__ import annotations

import json
import math

import pytest

from memcores.experiments.search import Dist
from memcores.experiments.sweep import SweepOptions, _write_point_outcomes
from memcores.experiments.trials import TrialResult
from memcores.experiments.tune_engine import KeepInRange


def _points(*values: float | None) -> dict[str, TrialResult]:
    return {f"p{i}": TrialResult(f"p{i}", "ok", value=v) for i, v in enumerate(values)}


@pytest.mark.parametrize(
    ("mode", "order"),
    [
        ("max", ["p2", "p4", "p0", "p5", "p1", "p3"]),
        ("min", ["p5", "p0", "p4", "p2", "p1", "p3"]),
    ],
)
def test_points_come_best_first_and_points_without_a_value_last(tmp_path, mode, order):
    """Values 0.2, none, 0.9, NaN, 0.5, -1.0: best first by --mode, a point without a
    finite value after every point with one (in the order they ran), never named best."""
    lines: list[str] = []
    ran = _points(0.2, None, 0.9, math.nan, 0.5, -1.0)
    options = SweepOptions(search="random", metric="eval/loss", mode=mode)
    ranked = _write_point_outcomes(ran, tmp_path, {"spec": {}}, options, lines.append)
    assert [r.name for r in ranked] == order
    sweep = json.loads((tmp_path / "sweep.json").read_text())
    assert list(sweep["results"]) == order and sweep["best"] == order[0]
    best = {"max": "0.9", "min": "-1"}[mode]
    assert lines == [f"best point: {order[0]} (eval/loss = {best}, mean over its seeds)"]
    assert sweep["metric"] == "eval/loss" and sweep["mode"] == mode
    assert sweep["state"] == "done"


def test_a_search_where_no_point_has_a_value_names_no_best(tmp_path):
    lines: list[str] = []
    options = SweepOptions(search="random", metric="eval/loss", mode="min")
    ranked = _write_point_outcomes(_points(None, math.nan), tmp_path, {}, options, lines.append)
    assert [r.name for r in ranked] == ["p0", "p1"] and lines == []
    assert json.loads((tmp_path / "sweep.json").read_text())["best"] is None


def test_pbt_puts_a_value_past_its_range_back_at_the_end_it_passed():
    space = {
        "agent.gae_lambda": Dist("uniform", (0.9, 1.0)),
        "agent.learning_rate": Dist("loguniform", (0.0001, 0.001)),
        "agent.n_epochs": Dist("randint", (2, 8)),
        "agent.ent_coef": Dist("choice", (0.0, 0.01)),
    }
    keep = KeepInRange(space)
    config = {
        "params": {
            "agent.gae_lambda": 1.2,  # x1.2 of the high end
            "agent.learning_rate": 0.00008,  # x0.8 of the low end
            "agent.n_epochs": 10,
            "agent.ent_coef": 0.012,  # a choice: left as it is (it comes from the list)
        },
        "other": 1,
    }
    out = keep(config)
    assert out["params"] == {
        "agent.gae_lambda": 1.0,
        "agent.learning_rate": 0.0001,
        "agent.n_epochs": 8,
        "agent.ent_coef": 0.012,
    }
    assert isinstance(out["params"]["agent.n_epochs"], int) and out["other"] == 1
    inside = {"params": {"agent.gae_lambda": 0.95, "agent.n_epochs": 2}}
    assert keep(inside)["params"] == {"agent.gae_lambda": 0.95, "agent.n_epochs": 2}
    assert keep({"params": {}}) == {"params": {}} and keep({}) == {}
