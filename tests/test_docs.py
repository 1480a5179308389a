"""The documentation describes the product: no development-log words, no dead repository paths.

Checked text: README.md, docs/**/*.md, results/'s README.md and REPORT.md files,
constraints.txt, and the source and config files of cores/, agents/, envs/ and experiments/.
Binary files (figures) are not read.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CODE_DIRS = ("cores", "agents", "envs", "experiments")
CODE_SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".txt", ".md"}

# Words that belong to how the project was built, not to what it is, and paths into material
# that is not part of the repository (papers are cited by authors, title and arXiv id instead).
# A CPU vendor is a machine's nickname ("the AMD box") unless it starts the CPU model a record
# names ("2-core AMD EPYC CPU").
PROCESS_WORDS = re.compile(
    r"session [0-9]|sessions [0-9]|\bVM\b|\b(?:AMD|Intel)\b(?! (?:EPYC|Xeon|Core|Ryzen)\b)"
    r"|my shell|\blent\b|can_start_another"
    r"|\bthe issue\b|engineer|this machine|papers/[a-z_]+\.md|shared/papers|the digest",
    re.IGNORECASE,
)

# A repository path: starts at a top-level folder of the repository and ends in a file name with
# a known extension. Placeholders (NAME, $task, {a,b}, *, my_core) never match or are skipped.
TOP_DIRS = ("docs", "experiments", "cores", "agents", "envs", "tests", "results")
_TOP = "|".join(TOP_DIRS)
REPO_PATH = re.compile(
    rf"(?<![\w./$-])((?:{_TOP})/[\w./-]*\.(?:md|py|yaml|yml|png|csv|json|txt|toml))(?![\w/])"
)
# Markdown links and images relative to the document: [text](target#anchor) / ![alt](target)
MD_LINK = re.compile(r"\]\(([^)\s#]*)(?:#([^)\s]*))?\)")
PLACEHOLDER = re.compile(r"my_|NAME|\bRUN\b")


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file (code blocks skipped)."""
    found, in_code = set(), False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(r"#{1,6} ", line):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def doc_files() -> list[Path]:
    """README.md, docs/ and the write-ups under results/ (its README and REPORT.md files)."""
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    files += [REPO / "results" / "README.md", *sorted((REPO / "results").rglob("REPORT.md"))]
    return [f for f in files if f.is_file()]


def code_files() -> list[Path]:
    files = [REPO / "constraints.txt"]
    for top in CODE_DIRS:
        files += sorted(
            p for p in (REPO / top).rglob("*") if p.is_file() and p.suffix in CODE_SUFFIXES
        )
    return [f for f in files if "__pycache__" not in f.parts]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def process_words(text: str) -> list[str]:
    """Every process word or non-repository path in ``text``, with its line number."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [f"line {number}: {m.group(0)!r}" for m in PROCESS_WORDS.finditer(line)]
    return found


def dead_paths(doc: Path) -> list[str]:
    """Repository paths and relative links in ``doc`` that name no file or folder."""
    text = doc.read_text(encoding="utf-8")
    missing = []
    for match in REPO_PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if PLACEHOLDER.search(path):
            continue
        if not (REPO / path).exists() and not (doc.parent / path).exists():
            missing.append(path)
    for match in MD_LINK.finditer(text):
        target, anchor = match.group(1), match.group(2)
        if "://" in target or target.startswith("mailto:") or PLACEHOLDER.search(target):
            continue
        linked = doc.parent / target if target else doc
        if not linked.exists():
            missing.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            missing.append(f"{target}#{anchor}")
    return missing


@pytest.mark.parametrize("path", doc_files() + code_files(), ids=rel)
def test_no_process_words(path: Path) -> None:
    found = process_words(path.read_text(encoding="utf-8"))
    assert not found, f"{rel(path)} describes the development, not the product: {found}"


@pytest.mark.parametrize("doc", doc_files(), ids=rel)
def test_every_path_in_the_docs_exists(doc: Path) -> None:
    missing = dead_paths(doc)
    assert not missing, f"{rel(doc)} names paths that do not exist: {missing}"


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    """The two checks are not vacuous: each flags a planted example and passes a clean one."""
    assert process_words("measured in session 4 on the AMD VM")
    assert process_words("see papers/fast_gate.md and the digest")
    assert not process_words("a 2-core x86 CPU with AVX-512, PyTorch 2.13 CPU build")
    assert not process_words("on a 2-core AMD EPYC CPU, torch 2.13.0, 2026-11-27")
    assert process_words("measured on the Intel machine")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "run `memcores train experiments/configs/no_such.yaml` and see ![x](img/gone.png);\n"
        "`experiments/configs/memory_s7.yaml` exists, `cores/my_core.py` is a placeholder,\n"
        "[a site](https://example.org/a.md) is not a repository path.\n"
        "## A `Heading`, with >= 0.9 in it\n"
        "[here](#a-heading-with--09-in-it) and [there](#no-such-heading).\n"
    )
    assert dead_paths(doc) == [
        "experiments/configs/no_such.yaml",
        "img/gone.png",
        "#no-such-heading",
    ]


def test_readme_keeps_the_two_setup_commands_and_stays_short() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "make test" in readme and "make demo" in readme
    assert "## Results" in readme
    assert len(readme.splitlines()) <= 170


def readme_python_blocks() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)


def test_readme_core_snippet_runs() -> None:
    namespace: dict = {}
    exec(readme_python_blocks()[0], namespace)  # the quickstart's core example, as printed
    assert tuple(namespace["y"].shape) == (50, 32, 128)


def test_readme_trainer_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The RL quickstart from Python, with the run folder moved to tmp and one rollout."""
    block = next(b for b in readme_python_blocks() if "memcores.train(" in b)
    assert '"runs/ms7_py"' in block and "train.total_steps=4096" in block
    block = block.replace('"runs/ms7_py"', repr(str(tmp_path / "ms7_py")))
    block = block.replace("train.total_steps=4096", "train.total_steps=1024")
    block = block.replace('"core.name=ur_lstm"', '"core.name=ur_lstm", "train.progress=false"')
    monkeypatch.chdir(REPO)
    namespace: dict = {}
    exec(block, namespace)
    assert namespace["result"].global_step == 1024
    assert (tmp_path / "ms7_py" / "progress.csv").is_file()
