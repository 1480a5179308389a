"""`memcores train/evaluate/transfer/visualize`: resume, transfer, bad input, corrupt files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from rl_helpers import TINY, tiny_config

from memcores.agents.checkpoint import CheckpointError, save_checkpoint
from memcores.agents.ppo import load_optimizer_state, make_optimizer
from memcores.agents.rl_config import RLConfig
from memcores.agents.rl_trainer import CHECKPOINT_NAME, setup, train
from memcores.experiments.cli import main
from memcores.experiments.config import load_config


def _train_cli(run_dir: Path, *overrides: str, resume: bool = False) -> int:
    args = ["train", "experiments/configs/demo_rl.yaml", *TINY, f"run.dir={run_dir}", *overrides]
    return main([*args, "--resume"] if resume else args)


def test_train_writes_run_folder(tmp_path):
    run = tmp_path / "run"
    assert _train_cli(run, "train.total_steps=64") == 0
    assert {"config.yaml", "progress.csv", "checkpoints"} <= {p.name for p in run.iterdir()}
    assert any(p.name.startswith("events.out.tfevents") for p in run.iterdir())
    assert "MiniGrid-Empty-5x5-v0" in (run / "config.yaml").read_text()


def test_resume_restores_step_optimizer_and_rng(tmp_path):
    first = tmp_path / "first"
    assert _train_cli(first, "train.total_steps=128") == 0  # 2 updates
    ckpt = torch.load(first / CHECKPOINT_NAME, weights_only=True)
    assert ckpt["step"] == 128 and ckpt["updates"] == 2
    adam_steps = {int(v["step"]) for v in ckpt["optimizer"]["state"].values()}

    # two copies resumed from the same checkpoint must continue identically (RNG restored)
    copies = [tmp_path / "a", tmp_path / "b"]
    for c in copies:
        shutil.copytree(first, c)
        assert _train_cli(c, "train.total_steps=192", resume=True) == 0
    a, b = (torch.load(c / CHECKPOINT_NAME, weights_only=True) for c in copies)
    assert a["step"] == 192 and a["updates"] == 3
    # Adam continued from its saved step count: 2 epochs x 2 minibatches more
    assert {int(v["step"]) for v in a["optimizer"]["state"].values()} == {s + 4 for s in adam_steps}
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0)
    assert not torch.equal(a["rng"]["torch"], ckpt["rng"]["torch"])
    # ...and the continuation depends on the saved RNG state: change it and it differs
    other = tmp_path / "other_rng"
    shutil.copytree(first, other)
    changed = torch.load(other / CHECKPOINT_NAME, weights_only=True)
    changed["rng"]["torch"] = torch.Generator().manual_seed(12345).get_state()
    save_checkpoint(other / CHECKPOINT_NAME, changed)
    assert _train_cli(other, "train.total_steps=192", resume=True) == 0
    c = torch.load(other / CHECKPOINT_NAME, weights_only=True)
    assert any(not torch.equal(a["model"][k], c["model"][k]) for k in a["model"])
    # resuming with a different network is a clear error, not a state_dict traceback
    assert _train_cli(copies[0], "train.total_steps=256", "core.hidden_size=8", resume=True) == 2
    steps = [line.split(",")[0] for line in (copies[0] / "progress.csv").read_text().splitlines()]
    assert steps[1:] == ["64", "128", "192"]  # no duplicated rows after resuming


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_resumed_optimizer_keeps_its_kernel(algo):
    """A checkpoint saved by a per-tensor optimiser restores its moments, not its kernel
    (PPO's Adam runs the fused kernel, A2C's RMSprop the multi-tensor one)."""
    agent = tiny_config(f"agent.algo={algo}").agent
    params = [torch.nn.Parameter(torch.randn(3, 2))]
    params[0].grad = torch.ones(3, 2)
    kind = torch.optim.Adam if algo == "ppo" else torch.optim.RMSprop
    old = kind(params, lr=0.1, foreach=False)
    old.step()
    optimizer = make_optimizer(torch.nn.ParameterList(params), agent)
    load_optimizer_state(optimizer, old.state_dict())
    group = optimizer.param_groups[0]
    if algo == "ppo":
        assert group["fused"] is True and not group["foreach"]
    else:
        assert group["foreach"] is True
    assert group["lr"] == 0.1
    saved = next(iter(old.state_dict()["state"].values()))
    restored = next(iter(optimizer.state_dict()["state"].values()))
    assert all(torch.equal(saved[key], restored[key]) for key in saved)


def test_resume_needs_a_checkpoint_and_refuses_to_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train_cli(run, "train.total_steps=64", resume=True) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    assert not run.exists()
    assert _train_cli(run, "train.total_steps=64") == 0
    assert _train_cli(run, "train.total_steps=64") == 2
    assert "--resume" in capsys.readouterr().err


def test_init_from_starts_a_new_run_from_another_runs_weights(tmp_path, capsys):
    source = tmp_path / "source"
    assert _train_cli(source, "train.total_steps=128") == 0
    saved = torch.load(source / CHECKPOINT_NAME, weights_only=True)["model"]
    # the network starts from the source's weights, not from its own seed's initialisation
    for init_from, same in ((source, True), (None, False)):
        overrides = [*TINY, "train.seed=5", f"train.init_from={init_from or 'null'}"]
        s = setup(load_config(RLConfig, "experiments/configs/demo_rl.yaml", overrides))
        s.envs.close()
        now = s.policy.state_dict()
        assert all(torch.equal(now[k], saved[k]) for k in saved) is same
    fork = tmp_path / "fork"
    assert _train_cli(fork, "train.total_steps=64", f"train.init_from={source}") == 0
    forked = torch.load(fork / CHECKPOINT_NAME, weights_only=True)
    assert forked["step"] == 64 and forked["updates"] == 1  # counters start fresh
    # Adam starts fresh: one update of 2 epochs x 2 minibatches
    assert {int(v["step"]) for v in forked["optimizer"]["state"].values()} == {4}
    # a core with the same parameters may load them (lstm -> hdetach_lstm)
    other = tmp_path / "hdetach"
    args = ("train.total_steps=64", f"train.init_from={source}", "core.name=hdetach_lstm")
    assert _train_cli(other, *args) == 0


def test_init_from_loads_the_reconstruction_decoder_only_when_it_reads_the_same_lags(tmp_path):
    source = tmp_path / "source"
    assert _train_cli(source, "agent.recon_coef=0.1", "agent.recon_lags=[0,1]") == 0
    saved = torch.load(source / CHECKPOINT_NAME, weights_only=True)["model"]

    def start(*overrides: str) -> dict[str, torch.Tensor]:
        config = [*TINY, "train.seed=5", f"train.init_from={source}", *overrides]
        s = setup(load_config(RLConfig, "experiments/configs/demo_rl.yaml", config))
        s.envs.close()
        return s.policy.state_dict()

    same = start("agent.recon_coef=0.1", "agent.recon_lags=[0,1]")
    assert all(torch.equal(same[k], saved[k]) for k in saved)
    more_lags = start("agent.recon_coef=0.1", "agent.recon_lags=[0,1,2]")
    assert all(torch.equal(more_lags[k], saved[k]) for k in saved if not k.startswith("decoder."))
    assert not torch.equal(more_lags["decoder.heads.0.weight"], saved["decoder.heads.0.weight"])
    no_decoder = start("agent.recon_coef=0")
    assert not any(k.startswith("decoder.") for k in no_decoder)
    plain = tmp_path / "plain"
    assert _train_cli(plain) == 0
    fork = tmp_path / "fork"  # a decoder the source never had starts fresh
    overrides = ("agent.recon_coef=0.1", f"train.init_from={plain}")
    assert _train_cli(fork, *overrides) == 0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("core.hidden_size=8", "does not fit this one: size mismatch for"),
        ("env.id=MiniGrid-Empty-6x6-v0", None),  # same 7x7 view and actions: loads
        ("agent.mission=mean", "'lstm', hidden_size 16"),  # a mission embedding more
        ("agent.image_encoder=cnn", "does not fit this one"),
    ],
)
def test_init_from_refuses_a_network_that_does_not_fit(tmp_path, capsys, override, message):
    source = tmp_path / "source"
    assert _train_cli(source, "train.total_steps=64") == 0
    capsys.readouterr()
    run = tmp_path / "run"
    code = _train_cli(run, "train.total_steps=64", f"train.init_from={source}", override)
    if message is None:
        assert code == 0
        return
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "train.init_from" in err and "Traceback" not in err
    assert not run.exists()  # refused before anything was written


def test_init_from_a_missing_or_corrupt_source_is_a_one_line_error(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train_cli(run, f"train.init_from={tmp_path / 'nope'}") == 2
    assert "train.init_from: run folder or checkpoint not found" in capsys.readouterr().err
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert _train_cli(run, f"train.init_from={bad}") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.init_from" in err
    assert not run.exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agent.algoo=ppo", "unknown config key 'agent.algoo'"),
        ("agent.algo=dqn", "'ppo', 'a2c'"),
        ("core.name=nope", "unknown core 'nope'; valid cores:"),
        ("core.bogus=1", "unknown option 'bogus' for core 'lstm'"),
        ("core.name=hdetach_lstm", None),
        ("env.id=MiniGrid-Nope-v0", "unknown env id 'MiniGrid-Nope-v0'"),
        ("agent.seq_len=7", "multiple of agent.seq_len"),
        ("train.device=tpu", "invalid value 'tpu' for 'train.device'"),
        pytest.param(
            "train.device=cuda",
            "no CUDA GPU is available",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present"),
        ),
        ("train.total_steps=many", "must be an integer"),
    ],
)
def test_bad_config_stops_before_writing(tmp_path, capsys, override, message):
    run = tmp_path / "run"
    if message is None:  # a valid core option value that the core itself rejects
        override, message = "core.p=2.0", "p must be in [0, 1]"
        rc = _train_cli(run, "core.name=hdetach_lstm", override)
    else:
        rc = _train_cli(run, override)
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not run.exists()


def test_evaluate_on_larger_grid(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config("train.total_steps=64", "agent.image_encoder=cnn"), run)
    assert main(["evaluate", str(run), "--env", "MiniGrid-Empty-8x8-v0", "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert "MiniGrid-Empty-8x8-v0: 3 episodes" in out and "success rate" in out
    assert main(["evaluate", str(run / CHECKPOINT_NAME), "--episodes", "2", "--argmax"]) == 0
    assert "MiniGrid-Empty-5x5-v0: 2 episodes" in capsys.readouterr().out


def test_sampled_evaluation_is_fixed_by_its_seed(tmp_path):
    from memcores.agents.evaluation import evaluate_run

    run = tmp_path / "run"
    train(tiny_config("train.total_steps=64"), run)

    def lengths(seed: int) -> list[int]:  # a 6x6 room: a random walk ends at varied lengths
        return evaluate_run(run, "MiniGrid-Empty-6x6-v0", episodes=8, seed=seed).lengths

    torch.manual_seed(1)
    first = lengths(5)
    after = torch.rand(1)
    torch.manual_seed(2)  # another caller state: the episodes depend on the seed only
    assert lengths(5) == first
    torch.manual_seed(1)
    lengths(5)
    assert torch.equal(torch.rand(1), after)  # the caller's generator is left where it was
    assert any(lengths(s) != first for s in (6, 7, 8))


def test_corrupt_checkpoint_is_a_clear_error(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config("train.total_steps=64"), run)
    path = run / CHECKPOINT_NAME
    path.write_bytes(path.read_bytes()[:100])  # truncated
    assert main(["evaluate", str(run), "--episodes", "1"]) == 2
    assert "corrupt or not a memcores checkpoint" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="corrupt"):
        train(tiny_config("train.total_steps=128"), run, resume=True)


def test_missing_run_is_a_clear_error(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path / "nope"), "--episodes", "1"]) == 2
    assert "not found" in capsys.readouterr().err


def test_visualize_writes_gif(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny_config("train.total_steps=64"), run)
    gif = tmp_path / "agent.gif"
    assert main(["visualize", str(run), "--gif", str(gif), "--episodes", "1"]) == 0
    assert gif.stat().st_size > 1000 and gif.read_bytes()[:3] == b"GIF"


def test_transfer_writes_table(tmp_path, monkeypatch, capsys):
    from memcores.envs import suites

    suite = type(suites.SUITES["doorkey"])  # same record type as the real suites
    tiny = suite(pairs=(("MiniGrid-Empty-5x5-v0", "MiniGrid-Empty-6x6-v0"),), description="t")
    monkeypatch.setitem(suites.SUITES, "tiny-test", tiny)
    monkeypatch.chdir(tmp_path)  # outside the repository: the default --config is packaged
    out = tmp_path / "transfer"
    args = ["transfer", "tiny-test", *TINY, "train.total_steps=64", "--episodes", "2"]
    assert main([*args, "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "| **Train** |" in table and "| Empty-5x5 |" in table and "| Empty-6x6 |" in table
    rows = (out / "table.csv").read_text().splitlines()
    assert rows[0].startswith("train_env,test_env,core") and len(rows) == 2
    # bad suite name: clear error, nothing written
    assert main(["transfer", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown suite 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def _two_pair_suite(monkeypatch) -> None:
    from memcores.envs import suites

    suite = type(suites.SUITES["doorkey"])
    pairs = (
        ("MiniGrid-Empty-5x5-v0", "MiniGrid-Empty-6x6-v0"),
        ("MiniGrid-Empty-6x6-v0", "MiniGrid-Empty-8x8-v0"),
    )
    monkeypatch.setitem(suites.SUITES, "two-test", suite(pairs=pairs, description="t"))


def _transfer_yaml(path: Path, **transfer) -> Path:
    import yaml

    from memcores.experiments.config import parse_override, set_dotted

    raw: dict = {"suite": "two-test", **transfer}
    for item in [*TINY, "train.total_steps=64"]:
        set_dotted(raw, *parse_override(item))
    path.write_text(yaml.safe_dump(raw))
    return path


def test_transfer_pair_overrides_chain_a_curriculum(tmp_path, monkeypatch):
    """A transfer config (a transfer sweep's, with suite/episodes at the top) runs as is;
    ``pair_overrides`` sets keys for one pair, and ``@ENV`` starts it from an earlier pair."""
    import yaml

    from memcores.agents import rl_trainer

    _two_pair_suite(monkeypatch)
    loaded = []
    real = rl_trainer.load_initial_policy
    monkeypatch.setattr(
        rl_trainer,
        "load_initial_policy",
        lambda policy, source, *rest: loaded.append(source) or real(policy, source, *rest),
    )
    overrides = {
        "MiniGrid-Empty-6x6-v0": {
            "train.init_from": "@MiniGrid-Empty-5x5-v0",
            "agent.learning_rate": 0.0005,
        }
    }
    config = _transfer_yaml(tmp_path / "t.yaml", episodes=3, pair_overrides=overrides)
    out = tmp_path / "transfer"
    assert main(["transfer", "two-test", "--config", str(config), "--out", str(out)]) == 0
    assert loaded == [str(out / "Empty-5x5")]  # the second pair only, from the first's run
    first = yaml.safe_load((out / "Empty-5x5" / "config.yaml").read_text())
    second = yaml.safe_load((out / "Empty-6x6" / "config.yaml").read_text())
    assert first["train"]["init_from"] is None
    assert first["agent"]["learning_rate"] == RLConfig().agent.learning_rate
    assert second["train"]["init_from"] == str(out / "Empty-5x5")
    assert second["agent"]["learning_rate"] == 0.0005
    rows = (out / "table.csv").read_text().splitlines()
    assert len(rows) == 3 and all(row.split(",")[9] == "3" for row in rows[1:])  # episodes


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"MiniGrid-Nope-v0": {"agent.learning_rate": 0.1}}, "not a train env of suite"),
        (
            {"MiniGrid-Empty-5x5-v0": {"train.init_from": "@MiniGrid-Empty-6x6-v0"}},
            "valid: none (it is the first pair)",
        ),
        ({"MiniGrid-Empty-6x6-v0": {"agent.nope": 1}}, "agent.nope"),
        (["agent.learning_rate=0.1"], "must map a train env id"),
    ],
)
def test_transfer_pair_overrides_errors(tmp_path, monkeypatch, capsys, overrides, message):
    _two_pair_suite(monkeypatch)
    config = _transfer_yaml(tmp_path / "t.yaml", pair_overrides=overrides)
    out = tmp_path / "never"
    assert main(["transfer", "two-test", "--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_overwrite_starts_over(tmp_path):
    run = tmp_path / "run"
    assert _train_cli(run, "train.total_steps=128") == 0
    assert _train_cli(run, "train.total_steps=64", "run.overwrite=true") == 0
    assert torch.load(run / CHECKPOINT_NAME, weights_only=True)["step"] == 64
    assert len([p for p in run.iterdir() if p.name.startswith("events.out")]) == 1
    assert len((run / "progress.csv").read_text().splitlines()) == 2  # header + 1 update
