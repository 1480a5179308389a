"""The YAML + dotted-override config loader validates keys and values up front."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from memcores.experiments.config import ConfigError, dump_yaml, load_config


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


def test_a_key_given_twice_is_an_error_naming_it_and_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("core:\n  name: lstm\n  hidden_size: 8\n  name: ur_lstm\n")
    with pytest.raises(ConfigError, match=r"line 4.*duplicate key 'name' \(first given on line 2"):
        load_config(Schema, path)
    merged = tmp_path / "merged.yaml"  # a `<<:` merge may repeat a key on purpose
    merged.write_text("base: &b {name: lstm, hidden_size: 8}\ncore:\n  <<: *b\n  name: gru\n")
    with pytest.raises(ConfigError, match="unknown config key 'base'"):  # the merge is fine
        load_config(Schema, merged)


def test_an_alias_bomb_is_refused_fast_with_a_short_message(tmp_path):
    lines = ["core:", "  name: lstm", "  a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")  # under 600 bytes; 10**9 values expanded
    with pytest.raises(ConfigError) as caught:
        load_config(Schema, path)
    message = str(caught.value)
    assert "aliases expand to more than 10,000 values" in message and len(message) < 300
    with pytest.raises(ConfigError, match="aliases expand"):  # the same on the command line
        load_config(
            Schema,
            None,
            [
                "core.x=[&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], "
                + ", ".join(["&b [" + ", ".join(["*a"] * 10) + "]"] + ["*b"] * 200)
                + "]"
            ],
        )


def test_an_alias_that_contains_itself_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("core: &c\n  name: lstm\n  me: *c\n")
    with pytest.raises(ConfigError, match="refers to a value that contains it"):
        load_config(Schema, path)


def test_small_anchors_still_load(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text("tags: &t [a, b]\ncore:\n  name: lstm\n  extra: *t\n")
    assert load_config(Schema, path).core.options == {"extra": ["a", "b"]}


def test_error_messages_cut_long_values():
    long = "x" * 100_000
    with pytest.raises(ConfigError) as caught:
        load_config(Schema, None, [f"agent.algo={long}"])
    assert "'agent.algo'" in str(caught.value) and len(str(caught.value)) < 300
    with pytest.raises(ConfigError) as caught:
        load_config(Schema, None, [f"agent.seq_len=[{', '.join(['1'] * 5_000)}]"])
    assert "'agent.seq_len' must be an integer" in str(caught.value)
    assert len(str(caught.value)) < 300


def test_a_packaged_config_path_loads_from_any_working_directory(tmp_path, monkeypatch) -> None:
    """`experiments/configs/...` (the docs' and benchmarks' paths) resolves to the packaged
    copy outside the repository; a path that exists where it is given wins; a missing one is
    still named as missing."""
    from memcores.agents.rl_config import RLConfig

    monkeypatch.chdir(tmp_path)
    config = load_config(RLConfig, "experiments/configs/memory_s7.yaml")
    assert config.env.id == "MiniGrid-MemoryS7-v0"
    local = tmp_path / "experiments" / "configs"
    local.mkdir(parents=True)
    (local / "memory_s7.yaml").write_text("env: {id: MiniGrid-DoorKey-5x5-v0}\n")
    assert load_config(RLConfig, "experiments/configs/memory_s7.yaml").env.id == (
        "MiniGrid-DoorKey-5x5-v0"
    )
    with pytest.raises(ConfigError, match="not found: experiments/configs/nope.yaml"):
        load_config(RLConfig, "experiments/configs/nope.yaml")
