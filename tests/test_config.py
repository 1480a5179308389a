"""The YAML + dotted-override config loader validates keys and values up front."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from experiments.config import ConfigError, dump_yaml, load_config


@dataclass
class CoreSection:
    __extras__ = "options"
    name: str = "lstm"
    hidden_size: int = 64
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentSection:
    algo: Literal["ppo", "a2c"] = "ppo"
    seq_len: int = 32
    lr: float = 3e-4
    anneal: bool = True
    clip: float | None = None

    def validate(self) -> None:
        if self.seq_len <= 0:
            raise ValueError(f"agent.seq_len must be positive, got {self.seq_len}")


@dataclass
class Schema:
    core: CoreSection = field(default_factory=CoreSection)
    agent: AgentSection = field(default_factory=AgentSection)
    tags: list[str] = field(default_factory=list)


def test_defaults_yaml_and_overrides_compose(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("core:\n  name: ur_lstm\nagent:\n  seq_len: 16\n")
    cfg = load_config(Schema, path, ["agent.lr=1e-3", "agent.algo=a2c", "core.hidden_size=128"])
    assert cfg.core.name == "ur_lstm"
    assert cfg.core.hidden_size == 128
    assert cfg.agent.seq_len == 16
    assert cfg.agent.lr == pytest.approx(1e-3)  # YAML reads "1e-3" as a string; coerced
    assert cfg.agent.algo == "a2c"
    assert cfg.agent.anneal is True


def test_unknown_key_names_key_and_valid_choices():
    with pytest.raises(ConfigError, match=r"agent\.seqlen.*valid keys in 'agent'.*seq_len"):
        load_config(Schema, None, ["agent.seqlen=3"])


def test_literal_value_lists_allowed_values():
    with pytest.raises(ConfigError, match=r"'agent\.algo'.*allowed: 'ppo', 'a2c'"):
        load_config(Schema, None, ["agent.algo=dqn"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("agent.seq_len=abc", "must be an integer"),
        ("agent.seq_len=2.5", "must be an integer"),
        ("agent.lr=fast", "must be a number"),
        ("agent.anneal=maybe", "true or false"),
        ("agent.seq_len=0", "must be positive"),
        ("noequals", "key.subkey=value"),
    ],
)
def test_bad_values_are_rejected(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(Schema, None, [override])


def test_extras_collect_free_form_core_options():
    cfg = load_config(Schema, None, ["core.p=0.25", "core.nu=10"])
    assert cfg.core.options == {"p": 0.25, "nu": 10}


def test_optional_int_coercions_and_lists():
    cfg = load_config(Schema, None, ["agent.clip=0.5", "agent.seq_len=1e2", "tags=a,b"])
    assert cfg.agent.clip == 0.5 and cfg.agent.seq_len == 100 and cfg.tags == ["a", "b"]
    assert load_config(Schema, None, ["agent.clip=null"]).agent.clip is None


def test_missing_or_malformed_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(Schema, tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(Schema, bad)


def test_dump_round_trips(tmp_path):
    cfg = load_config(Schema, None, ["core.p=0.5", "agent.algo=a2c"])
    path = tmp_path / "saved.yaml"
    path.write_text(dump_yaml(cfg))
    assert load_config(Schema, path) == cfg
