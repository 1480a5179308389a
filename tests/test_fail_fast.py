"""The newest surfaces fail fast: a bad value stops with one line naming it and the valid
choices (exit 2, nothing written) in the sweep's dry run, the env options, the benchmarks,
the docs check and the Python APIs of the batched envs and the engine adapters."""

from __future__ import annotations

from pathlib import Path

import pytest
from memcores.experiments.cli import main

REPO = Path(__file__).parents[1]
DEMO_RL = str(REPO / "experiments" / "configs" / "demo_rl.yaml")
DEMO_COPY = str(REPO / "experiments" / "configs" / "demo_copy.yaml")


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single line a refused command printed on stderr (no traceback)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# --------------------------------------------------------------------------- the sweep's dry run
@pytest.mark.parametrize(
    ("config", "grid", "named"),
    [
        (DEMO_RL, "train.graph_env_step=true,false", "train.graph_env_step=true cannot apply"),
        (DEMO_RL, "train.graph_update=false,true", "train.graph_update=true cannot apply"),
        (DEMO_COPY, "core.impl=triton,fused", "core.impl=triton cannot run here"),
        (DEMO_RL, "train.device=cpu,cuda", "device 'cuda' requested but no CUDA GPU"),
    ],
)
def test_the_dry_run_refuses_what_train_refuses_on_this_machine(
    tmp_path, capsys, monkeypatch, config, grid, named
):
    """Every grid point goes through train's device checks in the dry run, before Ray."""
    import torch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["sweep", config, "--grid", grid, "--out", str(tmp_path / "s"), "--backend", "local"]
    if "train.device" not in grid:
        args.append("train.device=cpu")
    assert main([*args, "--dry-run"]) == 2
    line = one_line(capsys)
    assert named in line and line.startswith("memcores sweep: error: trial ")
    assert not (tmp_path / "s").exists()
