"""``make mutate``'s bookkeeping (tests/mutate.py): mutant names, scores and bad input."""

from __future__ import annotations

import json

import mutate
import pytest

TARGET = mutate.Target("cores/lru.py", ("tests/test_lru.py",), ("_lambda", "LRULayer.scan"))


def test_mutmut_names_of_functions_and_methods():
    # named by the import path (the file's path in the scratch copy's memcores/ folder)
    assert TARGET.mangled("_lambda") == "memcores.cores.lru.x__lambda"
    assert TARGET.mangled("LRULayer.scan") == "memcores.cores.lru.xǁLRULayerǁscan"
    assert TARGET.globs() == [
        "memcores.cores.lru.x__lambda*",
        "memcores.cores.lru.xǁLRULayerǁscan*",
    ]
    assert TARGET.selects("memcores.cores.lru.xǁLRULayerǁscan__mutmut_12")
    assert not TARGET.selects("memcores.cores.lru.xǁLRULayerǁscan_more__mutmut_1")  # a glob's extra
    assert mutate.Target("cores/scan.py", ()).selects("memcores.cores.scan.x_anything__mutmut_1")


def test_score_leaves_out_equivalent_and_unrun_mutants(monkeypatch):
    statuses = {
        "memcores.cores.lru.x__lambda__mutmut_1": mutate.KILLED,
        "memcores.cores.lru.x__lambda__mutmut_2": mutate.TIMEOUT,
        "memcores.cores.lru.x__lambda__mutmut_3": mutate.SURVIVED,
        "memcores.cores.lru.x__lambda__mutmut_4": mutate.NO_TESTS,
        "memcores.cores.lru.x__lambda__mutmut_5": mutate.SURVIVED,
        "memcores.cores.lru.x__lambda__mutmut_6": mutate.NOT_RUN,
    }
    monkeypatch.setattr(
        mutate, "EQUIVALENT", {"memcores.cores.lru.x__lambda__mutmut_5": "same value"}
    )
    diffs = {name: "-a\n+b" for name in statuses}
    row = mutate.row(TARGET, statuses, diffs, wall=3.0)
    assert (row["mutants"], row["equivalent"], row["killed"], row["timeout"]) == (5, 1, 1, 1)
    assert (row["survived"], row["no_tests"]) == (1, 1)
    assert row["score"] == pytest.approx(2 / 4)
    assert sorted(row["surviving"]) == [
        "memcores.cores.lru.x__lambda__mutmut_3",
        "memcores.cores.lru.x__lambda__mutmut_4",
    ]
    assert (
        row["equivalent_mutants"]["memcores.cores.lru.x__lambda__mutmut_5"]["reason"]
        == "same value"
    )
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
    name = "memcores.cores.lru.x__lambda__mutmut_1"
    old = mutate.row(TARGET, {name: mutate.SURVIVED}, {name: "-a\n+b"}, wall=1.0)
    summary.write_text(json.dumps({"modules": [old | {"command": "c"}]}))
    monkeypatch.setattr(mutate, "EQUIVALENT", {name: "same value"})
    assert mutate.main(["--refresh"]) == 0
    (fresh,) = json.loads(summary.read_text())["modules"]
    assert (fresh["equivalent"], fresh["survived"], fresh["score"]) == (1, 0, None)
    assert "same value" in (tmp_path / "README.md").read_text()


def test_the_scratch_copy_spells_each_module_by_its_import_name(tmp_path):
    """mutmut finds a mutant's tests by the name the tests import it under: the copy puts the
    subpackages inside memcores/, where that name is the file's path."""
    mutate.scratch_copy(TARGET, tmp_path)
    assert (tmp_path / "memcores" / "cores" / "lru.py").is_file()
    assert (tmp_path / "memcores" / "__init__.py").is_file()
    assert not (tmp_path / "cores").exists() and (tmp_path / "tests" / "conftest.py").is_file()
    config = (tmp_path / "pyproject.toml").read_text()
    assert 'only_mutate = ["memcores/cores/lru.py"]' in config
    assert 'source_paths = ["memcores"]' in config
    assert all(name.startswith("memcores.") for name in mutate.EQUIVALENT)


def test_rows_of_an_older_record_get_the_import_names():
    old = {"statuses": {"cores.lru.x__lambda__mutmut_1": mutate.KILLED}, "surviving": {}}
    assert mutate.named(old)["statuses"] == {"memcores.cores.lru.x__lambda__mutmut_1": "killed"}
    assert mutate.named(mutate.named(old)) == mutate.named(old)
