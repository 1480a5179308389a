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


# --------------------------------------------------------------------------- env flags
POPGYM = "popgym/RepeatPreviousEasy-v0"


def test_an_env_flag_is_parsed_like_every_bool_key(tmp_path, capsys):
    """``prev_reward=maybe`` is refused; the text ``"false"`` is false (it was a true string)."""
    from memcores.agents.rl_config import RLConfig
    from memcores.experiments.config import load_config

    run = tmp_path / "run"
    args = ["train", DEMO_RL, f"env.id={POPGYM}", f"run.dir={run}"]
    assert main([*args, "env.kwargs.prev_reward=maybe"]) == 2
    line = one_line(capsys)
    assert "'env.kwargs.prev_reward' must be true or false, got 'maybe'" in line
    assert not run.exists()
    for text, value in (('"false"', False), ("no", False), ("true", True), ('"True"', True)):
        config = load_config(
            RLConfig, DEMO_RL, [f"env.id={POPGYM}", f"env.kwargs.prev_reward={text}"]
        )
        assert config.env.kwargs["prev_reward"] is value
    # MiniGrid's own flags are read from its constructors too
    with pytest.raises(ValueError, match="env.kwargs.see_through_walls"):
        load_config(RLConfig, DEMO_RL, ["env.kwargs.see_through_walls=often"])


@pytest.mark.parametrize("value", ["false", "maybe", 1, None])
def test_the_env_builders_take_only_true_or_false_for_a_flag(value):
    from memcores.envs import make_env
    from memcores.envs.batched import make_batched_env

    with pytest.raises(ValueError, match=f"prev_reward of {POPGYM} is a flag: it must be true"):
        make_env(POPGYM, prev_reward=value)
    with pytest.raises(ValueError, match="prev_reward of .* is a flag: it must be true or false"):
        make_batched_env(POPGYM, 2, "cpu", {"prev_reward": value})
    with pytest.raises(ValueError, match="reveal_cue of memcores/PassiveVisualMatch-v0 is a flag"):
        make_batched_env("memcores/PassiveVisualMatch-v0", 2, "cpu", {"reveal_cue": value})
    sizes = [
        make_env(POPGYM, prev_reward=flag).observation_space["vector"].shape
        for flag in (True, False)
    ]
    assert sizes == [(10,), (9,)]  # the previous reward is one more input


# --------------------------------------------------------------------------- search: null
def test_a_search_choice_may_hold_null_where_the_key_takes_it(tmp_path, capsys):
    """``agent.target_kl: {choice: [null, 0.01]}``: null reaches the trial as None (it was
    the text "None", refused as not a number), in a search and in PBT's member overrides."""
    import yaml
    from memcores.experiments.search import override_text
    from memcores.experiments.search_trials import seed_trials
    from memcores.experiments.sweep import make_trials, parse_grid
    from memcores.experiments.trials import trial_config

    search = REPO / "experiments" / "configs" / "search_doorkey5.yaml"
    raw = yaml.safe_load(search.read_text())
    raw["search"] = {"agent.target_kl": {"choice": [None, 0.01]}}
    config = tmp_path / "search.yaml"
    config.write_text(yaml.safe_dump(raw))
    args = ["sweep", str(config), "--search", "random", "--samples", "2", "--grid"]
    args += ["train.seed=0,1", "--out", str(tmp_path / "s"), "--backend", "ray", "--dry-run"]
    assert main(args) == 0, capsys.readouterr().err
    _, trials = make_trials(config, parse_grid(["train.seed=0"]), tmp_path / "s")
    (point,) = seed_trials(trials, {"agent.target_kl": None})
    assert "agent.target_kl=null" in point.overrides
    assert trial_config(point).agent.target_kl is None
    assert [override_text(v) for v in (None, True, 0.01, "lstm")] == [
        "null",
        "true",
        "0.01",
        "lstm",
    ]
