"""`memcores evaluate RUN --phases`: memory-match episodes split by cue sighting and outcome."""

from __future__ import annotations

import json

import pytest
from rl_helpers import TINY

from memcores.agents.evaluation import load_policy
from memcores.agents.memory_match_eval import OUTCOMES, phase_breakdown
from memcores.experiments.cli import main

PASSIVE = ["env.id=memcores/PassiveVisualMatch-v0", "env.kwargs.distractor_steps=1"]


@pytest.fixture(scope="module")
def passive_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("pvm") / "run"
    args = ["train", "experiments/configs/demo_rl.yaml", *TINY, *PASSIVE, f"run.dir={run}"]
    assert main([*args, "train.total_steps=64"]) == 0
    return run


def test_passive_cue_always_seen_and_outcomes_add_up(passive_run, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(passive_run), "--phases", "--episodes", "6", "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["groups"]
    assert set(groups) == {"all", "cue seen"}  # the passive cue is in view for all of phase 1
    stats = groups["all"]
    assert stats["episodes"] == 6
    assert sum(stats[o] for o in OUTCOMES) == pytest.approx(1.0)
    assert 1 <= stats["median_choice_steps"] <= 20 - 5 - 1  # max_steps - cue - distractor


def test_active_episodes_classified_by_their_phase_three(passive_run):
    policy, _ = load_policy(passive_run)
    result = phase_breakdown(
        policy,
        "memcores/ActiveVisualMatch-v0",
        episodes=5,
        n_envs=2,
        env_kwargs={"distractor_steps": 1, "max_steps": 20},
    )
    assert len(result.outcomes) == len(result.cue_seen) == len(result.choice_steps) == 5
    budget = 20 - 15 - 1  # active cue phase: 2 * room_size + 1 = 15 actions
    for outcome, steps in zip(result.outcomes, result.choice_steps, strict=True):
        assert outcome in OUTCOMES and 1 <= steps <= budget
        assert (outcome == "timeout") == (steps == budget and outcome != "right")
    assert "cue seen in phase 1" in result.summary()


def test_phases_on_another_env_is_a_one_line_error(passive_run, capsys):
    args = ["evaluate", str(passive_run), "--phases", "--env", "MiniGrid-Empty-5x5-v0"]
    assert main([*args, "--episodes", "1"]) == 2
    assert "--phases needs a memory-match env" in capsys.readouterr().err
