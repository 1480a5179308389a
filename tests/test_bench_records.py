"""The cheap benchmarks whose numbers do not depend on the machine, re-measured against their
committed records (results/bench/): a change to the code that moves one fails here, before
the docs that quote the record go stale.

Memory in bytes is exact: ``bench memory lru`` counts live tensor bytes, ``bench memory rel``
the bytes autograd saves (on the meta device). Times are machine-bound and are not re-run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memcores.experiments.bench import memory_lru, memory_rel
from memcores.experiments.bench import record as bench_record

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "results" / "bench"


def numbers(name: str) -> dict:
    return bench_record.read_record(BENCH / name)["numbers"]


@pytest.mark.parametrize(
    ("name", "batch", "length"),
    [
        # B=8 runs BPTT over 256 steps under the byte counter: minutes, so a slow test
        pytest.param("memory_lru", 8, 256, marks=pytest.mark.slow),
        ("memory_lru_b1", 1, 64),
    ],
)
def test_lru_step_memory_matches_its_record(name: str, batch: int, length: int) -> None:
    """Every method's peak bytes at the record's shortest length (H=128, N=64, 4 layers)."""
    recorded = numbers(name)
    methods = tuple(recorded)
    fresh = memory_lru.run_bench([length], 128, 64, 4, batch, methods, report=lambda _: None)
    for method in methods:
        assert fresh[method][length] == recorded[method][str(length)], method


def test_rel_graph_memory_matches_its_record() -> None:
    """Graph bytes of lstm, rel_lstm and mem_lstm at T=250 (B=16, H=128, D=8, nu=rho=5)."""
    recorded = numbers("memory_rel")
    for name in memory_rel.CORE_NAMES:
        core = memory_rel.build_core(name, 8, 128, 250, 5, 5)
        nbytes = memory_rel.graph_bytes(core, 250, 16, "meta")
        assert nbytes == recorded[f"{name}/250"]["graph_bytes"], name


def test_gtrxl_graph_memory_matches_its_record() -> None:
    """Graph bytes of gtrxl at three memory lengths at T=250 (B=16, H=128, D=8)."""
    recorded = numbers("memory_gtrxl")
    for name in ("gtrxl", "gtrxl:memory_len=16", "gtrxl:memory_len=256"):
        core = memory_rel.build_core(name, 8, 128, 250, 5, 5)
        nbytes = memory_rel.graph_bytes(core, 250, 16, "meta")
        assert nbytes == recorded[f"{name}/250"]["graph_bytes"], name


def test_where_a_bench_writes_its_record() -> None:
    """Default results/bench/<name>; --out elsewhere; none for --no-record or a --quick run
    (a smoke run must never replace a measurement)."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    bench_record.add_record_arguments(parser, "toy")

    def folder(*argv: str) -> Path | None:
        return bench_record.record_folder(parser.parse_args(argv), "toy")

    assert folder() == Path("results/bench/toy")
    assert folder("--out", "x") == Path("x")
    assert folder("--quick") is None
    assert folder("--quick", "--out", "x") == Path("x")
    assert folder("--no-record") is None


def test_every_bench_record_renders_and_names_its_machine() -> None:
    """Each committed bench record reads, names the CPU model and count, and its REPORT.md is
    what the record renders."""
    folders = sorted(p.parent for p in BENCH.glob("*/record.json"))
    assert {f.name for f in folders} >= {"memory_lru", "memory_lru_b1", "memory_rel"}
    for folder in folders:
        record = bench_record.read_record(folder)
        assert record["machine"]["cpu"] and record["machine"]["cpus"] >= 1
        assert record["command"].startswith("memcores bench ")
        report = (folder / bench_record.REPORT).read_text()
        assert report == bench_record.render_report(record), folder.name


def test_cpu_names_lose_their_trademark_signs() -> None:
    from memcores.experiments.bench.record import plain_cpu_name

    assert plain_cpu_name("Intel(R) Xeon(R) Processor") == "Intel Xeon Processor"
    assert plain_cpu_name("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz") == (
        "Intel Core i7-8700 CPU @ 3.20GHz"
    )
    assert plain_cpu_name("AMD EPYC 7B13") == "AMD EPYC 7B13"
