"""The cheap benchmarks whose numbers do not depend on the machine, re-measured against their
committed records (results/bench/): a change to the code that moves one fails here, before
the docs that quote the record go stale.

Memory in bytes is exact: ``bench memory lru`` counts live tensor bytes, ``bench memory rel``
the bytes autograd saves (on the meta device). Times are machine-bound and are not re-run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.bench import memory_lru, memory_rel
from experiments.bench import record as bench_record

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
