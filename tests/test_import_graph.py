"""The product's import graph: no two files import each other (directly or around a circle),
and dependencies point one way, ``experiments -> agents -> (cores, envs)``."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cores", "envs", "agents", "experiments")


def _modules() -> dict[str, Path]:
    """``memcores.<package>.<module>`` -> its file, for every product module."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(("memcores", *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The product modules ``path`` imports, anywhere in it (``TYPE_CHECKING`` blocks and
    function bodies included: a circle through them is still two files that need each other)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            # a package's __init__ is what importing any of its modules runs first: not an edge
            if target and target != name and modules[target].name != "__init__.py":
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def test_no_two_product_files_import_each_other():
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as err:
        pytest.fail(f"an import circle: {' -> '.join(err.args[1])}")


def test_the_checker_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}}
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(graph).prepare()


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("cores", ("envs", "agents", "experiments")), ("envs", ("agents", "experiments"))]
    + [("agents", ("experiments",))],
)
def test_dependencies_point_one_way(package, forbidden):
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in import_graph().items()
        if name.split(".")[1] == package
        for target in targets
        if target.split(".")[1] in forbidden
    )
    assert not wrong, wrong
