"""``memcores bench envs --batched`` and ``memcores bench rl --batched`` run and write their
records."""

from __future__ import annotations

import pytest

from memcores.experiments.bench import envs as bench_envs
from memcores.experiments.bench import rl as bench_rl
from memcores.experiments.bench.record import read_record


def test_bench_envs_batched_writes_its_record(tmp_path, capsys):
    ids = "memcores/ActiveVisualMatch-v0,popgym/CountRecallEasy-v0"
    assert bench_envs.main(["--batched", "--quick", "--envs", ids, "--out", str(tmp_path)]) == 0
    record = read_record(tmp_path)
    rows = record["numbers"]["rows"]
    assert [r["env"] for r in rows] == ids.split(",")
    assert all(r["batched"] > 0 and r["gymnasium"] > 0 for r in rows)
    assert record["command"].startswith("memcores bench envs --batched --quick")
    (table,) = record["tables"]
    assert [row[0] for row in table["rows"]] == ids.split(",")
    assert table["columns"][2] == "64 envs: batched steps/s, ratio"
    batched, ratio = table["rows"][0][2].split(", ")
    assert float(batched.replace(",", "")) > 0 and ratio == f"{rows[0]['ratio']:.1f}x"
    assert "| memcores/ActiveVisualMatch-v0 | " in capsys.readouterr().out
    assert (tmp_path / "REPORT.md").read_text().startswith("# Bench: envs_batched")


def test_a_quick_bench_envs_batched_writes_no_record_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bench_envs.main(["--batched", "--quick", "--envs", "popgym/AutoencodeEasy-v0"]) == 0
    assert not (tmp_path / "results").exists()


def test_bench_envs_batched_refuses_ids_without_a_batched_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_envs.main(["--batched", "--envs", "MiniGrid-MemoryS7-v0"])
    assert exit_info.value.code == 2
    assert "no batched version of MiniGrid-MemoryS7-v0; valid:" in capsys.readouterr().err


def test_bench_rl_batched_records_a_row_per_size(tmp_path):
    assert bench_rl.main(["--batched", "--quick", "--out", str(tmp_path)]) == 0
    record = read_record(tmp_path)
    assert record["command"].startswith("memcores bench rl --batched --quick")
    (table,) = record["tables"]
    assert [row[0] for row in table["rows"]] == ["2"]
    assert all(float(cell.rstrip("x").replace(",", "")) > 0 for cell in table["rows"][0][1:])
