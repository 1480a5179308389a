"""``memcores bench envs --batched`` and ``memcores bench rl --batched`` run and write their
tables."""

from __future__ import annotations

import json

import pytest

from experiments.bench import envs as bench_envs
from experiments.bench import rl as bench_rl


def test_bench_envs_batched_writes_its_table(tmp_path, capsys):
    ids = "memcores/ActiveVisualMatch-v0,popgym/CountRecallEasy-v0"
    assert bench_envs.main(["--batched", "--quick", "--envs", ids, "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench_envs.json").read_text())["rows"]
    assert [r["env"] for r in rows] == ids.split(",")
    assert all(r["batched"] > 0 and r["gymnasium"] > 0 for r in rows)
    table = (tmp_path / "bench_envs.md").read_text()
    assert table.startswith("`memcores bench envs --batched --quick")
    body = table.split("\n\n", 1)[1]
    assert "| memcores/ActiveVisualMatch-v0 | 64 |" in body and body in capsys.readouterr().out


def test_bench_envs_batched_refuses_ids_without_a_batched_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_envs.main(["--batched", "--envs", "MiniGrid-MemoryS7-v0"])
    assert exit_info.value.code == 2
    assert "no batched version of MiniGrid-MemoryS7-v0; valid:" in capsys.readouterr().err


def test_bench_rl_batched_prints_a_row_per_size(tmp_path):
    assert bench_rl.main(["--batched", "--quick", "--out", str(tmp_path)]) == 0
    table = (tmp_path / "bench_rl_batched.md").read_text()
    assert table.startswith("`memcores bench rl --batched --quick") and "\n| 2 | " in table
