"""`memcores bench rl --quick` runs both sides and prints the ratio (no timing assertions)."""

from __future__ import annotations

from experiments.cli import main


def test_bench_rl_quick(capsys):
    assert main(["bench", "rl", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "memcores PPO (lstm):" in out
    assert "sb3-contrib RecurrentPPO:" in out
    assert "ratio memcores / sb3-contrib:" in out
