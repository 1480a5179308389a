"""Shipped configs by name (``memcores train memory_s7``), ``memcores list configs``, and
record folders wherever a run folder is taken."""

from __future__ import annotations

from pathlib import Path

import pytest

from memcores.agents.rl_config import RLConfig
from memcores.experiments import config as config_module
from memcores.experiments.cli import main
from memcores.experiments.config import (
    ConfigError,
    config_path,
    load_config,
    shipped_configs,
    shipped_name,
)

REPO = Path(__file__).resolve().parents[1]


def test_every_yaml_in_experiments_configs_is_shipped_by_name():
    names = shipped_configs()
    files = sorted((REPO / "experiments" / "configs").rglob("*.yaml"))
    assert sorted(names.values()) == files
    assert names["memory_s7"] == REPO / "experiments/configs/memory_s7.yaml"
    assert names["references/thesis_table7"].name == "thesis_table7.yaml"


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ("memory_s7", "memory_s7"),
        ("memory_s7.yaml", "memory_s7"),
        ("experiments/configs/memory_s7.yaml", "memory_s7"),
        ("references/thesis_table7", "references/thesis_table7"),
        ("memory_s8", None),
        ("runs/memory_s7.yaml", None),
        ("experiments/configs", None),
        ("/abs/memory_s7.yaml", None),
    ],
)
def test_shipped_name(given, name):
    assert shipped_name(given) == name


@pytest.mark.parametrize(
    "given", ["memory_s7", "memory_s7.yaml", "experiments/configs/memory_s7.yaml"]
)
def test_a_shipped_config_loads_by_name_from_an_empty_folder(given, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = load_config(RLConfig, given, ["train.total_steps=2048"])
    assert config.env.id == "MiniGrid-MemoryS7-v0" and config.train.total_steps == 2048
    assert capsys.readouterr().err == ""  # nothing to say: no file of that name here


def test_a_users_file_of_the_same_name_wins_and_the_command_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(config_module, "_NOTED", set())
    (tmp_path / "memory_s7.yaml").write_text("env: {id: MiniGrid-DoorKey-5x5-v0}\n")
    assert load_config(RLConfig, "memory_s7.yaml").env.id == "MiniGrid-DoorKey-5x5-v0"
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "reading memory_s7.yaml (a file here), not the shipped config 'memory_s7'" in err
    assert str(REPO / "experiments/configs/memory_s7.yaml") in err
    load_config(RLConfig, "memory_s7.yaml")
    assert capsys.readouterr().err == ""  # said once per file
    # the bare name is not the user's file: the shipped config, silently
    assert load_config(RLConfig, "memory_s7").env.id == "MiniGrid-MemoryS7-v0"
    assert capsys.readouterr().err == ""


def test_the_documented_path_inside_the_checkout_is_the_shipped_file(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert config_path("experiments/configs/memory_s7.yaml") == Path(
        "experiments/configs/memory_s7.yaml"
    )
    assert capsys.readouterr().err == ""  # the same file: nothing to say


def test_an_unknown_name_points_at_the_list(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"not found: memory_s8 \(shipped configs by name"):
        load_config(RLConfig, "memory_s8")
    assert main(["train", "memory_s8"]) == 2
    err = capsys.readouterr().err
    assert "memcores list configs" in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_list_configs_gives_each_its_command_and_a_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["list", "configs"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}
    assert set(rows) == set(shipped_configs())
    assert rows["memory_s7"][0] == "train" and rows["copy"][0] == "supervised"
    assert rows["sweep_popgym_150k"][0] == "sweep"
    assert rows["references/thesis_table7"][0] == "report"
    assert " ".join(rows["memory_s7"][1:]).startswith("MiniGrid-MemoryS7: remember the object")
    assert all(len(" ".join(words)) < 130 for words in rows.values())


def test_train_by_name_from_an_empty_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    tiny = ["train.total_steps=64", "env.n_envs=2", "agent.n_steps=32", "agent.minibatch_size=32"]
    code = main(["train", "demo_rl", *tiny])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "runs" / "demo_rl" / "checkpoints" / "last.pt").is_file()


def test_diagnose_takes_a_shipped_config_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "lag.png"
    code = main(["diagnose", "lag_profile", "--cores", "lstm", "--batch", "4", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert out.is_file() and out.with_suffix(".csv").is_file()


RECORD = REPO / "results/table7/seed=0,name=lstm,suite=memory/MemoryS7"


def test_evaluate_and_visualize_take_a_record_folder(tmp_path, capsys):
    assert main(["evaluate", str(RECORD), "--episodes", "2"]) == 0
    assert "MiniGrid-MemoryS7-v0: 2 episodes" in capsys.readouterr().out
    gif = tmp_path / "a.gif"
    assert main(["visualize", str(RECORD), "--gif", str(gif), "--episodes", "1"]) == 0
    assert gif.is_file() and gif.stat().st_size > 0


def test_a_folder_with_neither_checkpoint_names_both(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "checkpoints/last.pt" in err and "policy.pt" in err and err.count("\n") == 1
