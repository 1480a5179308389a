"""``make mutate``'s bookkeeping (tests/mutate.py): mutant names, scores and bad input."""

from __future__ import annotations

import json

import mutate
import pytest

TARGET = mutate.Target("cores/lru.py", ("tests/test_lru.py",), ("_lambda", "LRULayer.scan"))


def test_mutmut_names_of_functions_and_methods():
    assert TARGET.mangled("_lambda") == "cores.lru.x__lambda"
    assert TARGET.mangled("LRULayer.scan") == "cores.lru.xǁLRULayerǁscan"
    assert TARGET.globs() == ["cores.lru.x__lambda*", "cores.lru.xǁLRULayerǁscan*"]
    assert TARGET.selects("cores.lru.xǁLRULayerǁscan__mutmut_12")
    assert not TARGET.selects("cores.lru.xǁLRULayerǁscan_more__mutmut_1")  # a glob's extra
    assert mutate.Target("cores/scan.py", ()).selects("cores.scan.x_anything__mutmut_1")


def test_score_leaves_out_equivalent_and_unrun_mutants(monkeypatch):
    statuses = {
        "cores.lru.x__lambda__mutmut_1": mutate.KILLED,
        "cores.lru.x__lambda__mutmut_2": mutate.TIMEOUT,
        "cores.lru.x__lambda__mutmut_3": mutate.SURVIVED,
        "cores.lru.x__lambda__mutmut_4": mutate.NO_TESTS,
        "cores.lru.x__lambda__mutmut_5": mutate.SURVIVED,
        "cores.lru.x__lambda__mutmut_6": mutate.NOT_RUN,
    }
    monkeypatch.setattr(mutate, "EQUIVALENT", {"cores.lru.x__lambda__mutmut_5": "same value"})
    diffs = {name: "-a\n+b" for name in statuses}
    row = mutate.row(TARGET, statuses, diffs, wall=3.0)
    assert (row["mutants"], row["equivalent"], row["killed"], row["timeout"]) == (5, 1, 1, 1)
    assert (row["survived"], row["no_tests"]) == (1, 1)
    assert row["score"] == pytest.approx(2 / 4)
    assert sorted(row["surviving"]) == [
        "cores.lru.x__lambda__mutmut_3",
        "cores.lru.x__lambda__mutmut_4",
    ]
    assert row["equivalent_mutants"]["cores.lru.x__lambda__mutmut_5"]["reason"] == "same value"
    text = mutate.readme(
        {
            "command": "make mutate",
            "tool": "mutmut",
            "hardware": "cpu",
            "modules": [row | {"command": "c"}],
        }
    )
    assert "| `cores/lru.py` | 2 named | 5 (+1 not run) | 1 | 2 | 1 | 1 | 50.0% | 3 |" in text


def test_every_target_names_existing_tests_and_functions():
    root = mutate.REPO
    for target in mutate.TARGETS:
        source = (root / target.path).read_text()
        for test in target.tests:
            assert (root / test.split("::")[0]).is_file(), test
        for function in target.functions:
            assert f"def {function.rpartition('.')[2]}(" in source, function


def test_unknown_target_is_refused(capsys):
    assert mutate.main(["--targets", "cores/nope.py"]) == 2
    err = capsys.readouterr().err
    assert "unknown target 'cores/nope.py'; valid: agents/ppo.py" in err


def test_refresh_applies_the_current_equivalent_list(tmp_path, monkeypatch):
    summary = tmp_path / "summary.json"
    monkeypatch.setattr(mutate, "RECORD_DIR", tmp_path)
    monkeypatch.setattr(mutate, "SUMMARY", summary)
    monkeypatch.setattr(mutate, "TARGETS", (TARGET,))
    name = "cores.lru.x__lambda__mutmut_1"
    old = mutate.row(TARGET, {name: mutate.SURVIVED}, {name: "-a\n+b"}, wall=1.0)
    summary.write_text(json.dumps({"modules": [old | {"command": "c"}]}))
    monkeypatch.setattr(mutate, "EQUIVALENT", {name: "same value"})
    assert mutate.main(["--refresh"]) == 0
    (fresh,) = json.loads(summary.read_text())["modules"]
    assert (fresh["equivalent"], fresh["survived"], fresh["score"]) == (1, 0, None)
    assert "same value" in (tmp_path / "README.md").read_text()
