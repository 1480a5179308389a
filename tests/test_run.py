"""The run life cycle both trainers share (agents/run.py): what a resume may change, file
permissions, checkpoints that load onto the CPU, and the deprecated keys of the shared config."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from rl_helpers import TINY, tiny_config

from memcores.agents import supervised
from memcores.agents.checkpoint import CheckpointError, load_checkpoint, rng_state, set_rng_state
from memcores.agents.files import write_text_atomic
from memcores.agents.rl_trainer import CHECKPOINT_NAME, train
from memcores.agents.run import RESUME_ALLOWED_CHANGES, RunSession, check_resume_config
from memcores.agents.supervised_config import SupervisedConfig
from memcores.experiments.cli import main
from memcores.experiments.config import load_config

SUPERVISED = [
    "task.name=copy",
    "task.length=5",
    "task.n_tokens=3",
    "task.alphabet=3",
    "core.name=lstm",
    "core.hidden_size=8",
    "train.batch_size=16",
    "train.eval_size=32",
    "train.threads=1",
    "train.progress=false",
    "run.tensorboard=false",
]


def _supervised(run: Path, *overrides: str) -> SupervisedConfig:
    return load_config(SupervisedConfig, None, [*SUPERVISED, f"run.dir={run}", *overrides])


def _files(run: Path) -> dict[str, bytes]:
    """Every file of a run folder and its bytes (what a refused resume must not touch)."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------- resume
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("env.id=MiniGrid-Empty-6x6-v0", "env.id"),
        ("agent.learning_rate=0.01", "agent.learning_rate"),
        ("train.total_steps=64", "train.total_steps"),  # shorter than the checkpoint's run
        ("core.options.p=0.5", "core.options.p"),
    ],
)
def test_rl_resume_refuses_a_changed_key_and_writes_nothing(tmp_path, capsys, override, key):
    run = tmp_path / "run"
    core = ["core.name=hdetach_lstm"] if key.startswith("core.options") else []
    args = ["train", "experiments/configs/demo_rl.yaml", *TINY, f"run.dir={run}", *core]
    assert main(args) == 0
    before = _files(run)
    assert main([*args, override, "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot resume" in err and key in err, err
    assert _files(run) == before


def test_rl_resume_with_a_longer_budget_continues(tmp_path):
    run = tmp_path / "run"
    train(tiny_config(), run)
    result = train(tiny_config("train.total_steps=256", "train.threads=0"), run, resume=True)
    assert result.global_step == 256
    assert "total_steps: 256" in (run / "config.yaml").read_text()


def test_allow_changes_lets_a_caller_resume_with_a_new_learning_rate(tmp_path):
    """Population Based Training restores a checkpoint under mutated hyperparameters."""
    run = tmp_path / "run"
    train(tiny_config(), run)
    mutated = tiny_config("train.total_steps=256", "agent.learning_rate=0.01", "agent.ent_coef=0")
    with pytest.raises(ValueError, match="cannot resume: agent.ent_coef"):
        train(mutated, run, resume=True)
    allowed = ("agent.learning_rate", "agent.ent_coef")
    result = train(mutated, run, resume=True, allow_changes=allowed)
    assert result.global_step == 256
    # annealed from the new rate: update 5 of 8 (0-based 4) runs at 0.01 * (1 - 4/8)
    assert result.history[0]["train/learning_rate"] == pytest.approx(0.005)
    assert "train.total_steps" in RESUME_ALLOWED_CHANGES
    assert "agent.learning_rate" not in RESUME_ALLOWED_CHANGES


def test_supervised_resume_refuses_a_new_learning_rate_unless_allowed(tmp_path):
    run = tmp_path / "run"
    supervised.train(_supervised(run, "train.steps=2", "train.eval_every=2"))
    before = _files(run)
    changed = _supervised(run, "train.steps=4", "train.eval_every=2", "optim.lr=0.01")
    with pytest.raises(ValueError, match="cannot resume: optim.lr is 0.01"):
        supervised.train(changed, resume=True)
    assert _files(run) == before
    with pytest.raises(ValueError, match="train.steps=1 is shorter"):
        supervised.train(_supervised(run, "train.steps=1"), resume=True)
    results = supervised.train(changed, resume=True, allow_changes=["optim.lr"])
    assert results["step"] == 4


def test_saved_configs_of_earlier_releases_compare_after_renaming():
    """A checkpoint's config written with run.progress_bar / threads null is the same run."""
    config = _supervised(Path("x"), "train.threads=0", "train.progress=false")
    saved = {
        "task": {"name": "copy", "options": dict(config.task.options)},
        "core": {"name": "lstm", "hidden_size": 8, "options": {}},
        "train": {"threads": None, "batch_size": 16, "eval_size": 32},
        "run": {"dir": "x", "tensorboard": False, "progress_bar": False},
    }
    check_resume_config(saved, config, "train.steps")  # no error


# ---------------------------------------------------------------------------- permissions
@pytest.fixture
def umask():
    """Set the process umask for one test and restore it after."""
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_run_files_follow_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    run = tmp_path / "run"
    train(tiny_config("train.total_steps=64"), run)
    for name in ("config.yaml", CHECKPOINT_NAME, "progress.csv"):
        assert stat.S_IMODE((run / name).stat().st_mode) == mode, name
    assert stat.S_IMODE(write_text_atomic(tmp_path / "record.json", "{}").stat().st_mode) == mode


# ---------------------------------------------------------------------------- devices
@pytest.mark.filterwarnings("ignore:.*to a meta parameter")  # torch: copies to meta are no-ops
def test_a_resume_restores_a_model_that_lives_off_the_cpu(tmp_path):
    """Loading a checkpoint onto the model's device breaks the RNG restore (the GPU crash:
    ``can't convert cuda:0 device type tensor to numpy``); the ``meta`` device reproduces it
    on a CPU. Checkpoints load onto the CPU, so the same resume works."""
    run = tmp_path / "run"
    config = _supervised(run, "train.steps=2", "train.eval_every=2")
    supervised.train(config)
    on_meta = torch.load(run / supervised.CHECKPOINT, map_location="meta", weights_only=True)
    with pytest.raises(TypeError, match="meta"):
        set_rng_state(on_meta["rng"])  # the failure class

    saved_rng = load_checkpoint(run / supervised.CHECKPOINT)["rng"]
    torch.manual_seed(123)  # anything but the saved state
    prep = supervised.prepare(_supervised(run, "train.steps=4", "train.eval_every=2"))
    model = prep.model.to("meta")
    optimizer = torch.optim.Adam(model.parameters())
    with RunSession(supervised.LAYOUT, run, prep.config, resume=True) as session:
        assert all(t.device.type == "cpu" for t in session.payload["model"].values())
        assert session.restore(model, optimizer) == 2
        assert torch.equal(torch.get_rng_state(), saved_rng["torch"])
        assert rng_state()["numpy"]["pos"] == saved_rng["numpy"]["pos"]
    assert all(p.device.type == "meta" for p in model.parameters())


# ---------------------------------------------------------------------------- config
def test_deprecated_keys_still_load_with_one_line_each(capsys):
    config = load_config(SupervisedConfig, None, ["run.progress_bar=false", "train.threads=null"])
    assert config.train.progress is False and config.train.threads == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "run.progress_bar" in err[0] and "train.threads" in err[1]
    rl = tiny_config('run.dir=""')
    assert rl.run.dir is None
    assert "run.dir" in capsys.readouterr().err


# ---------------------------------------------------------------------------- layouts
REPO = Path(__file__).resolve().parents[1]


def test_a_policy_of_the_earlier_format_re_evaluates_to_its_record(tmp_path, capsys):
    """A ``memcores-rl/1`` policy (weights under ``policy``, frames under ``global_step``)
    loads in every release, silently, and acts as the record says."""
    from memcores.agents.evaluation import evaluate_run

    record_dir = REPO / "results/table7/seed=0,name=lstm,suite=memory/MemoryS7"
    payload = torch.load(record_dir / "policy.pt", weights_only=True)
    assert payload["format"] == "memcores/2"
    old = {k: v for k, v in payload.items() if k not in ("format", "trainer", "model", "step")}
    old |= {"format": "memcores-rl/1", "policy": payload["model"], "global_step": payload["step"]}
    torch.save(old, tmp_path / "policy.pt")
    expected = json.loads((record_dir / "record.json").read_text())["eval"]
    result = evaluate_run(tmp_path / "policy.pt", "MiniGrid-MemoryS7-v0", episodes=100)
    want = expected["MiniGrid-MemoryS7-v0"]
    assert (result.mean_return, result.success_rate) == (want["return"], want["success"])
    assert capsys.readouterr().err == ""


def test_every_committed_policy_loads_in_the_current_format():
    """Each ``results/**/policy.pt`` is a ``memcores/2`` RL checkpoint that builds its policy:
    the evidence stays loadable with no deprecation in the way."""
    from memcores.agents.checkpoint import CHECKPOINT_FORMAT, policy_from_checkpoint

    policies = sorted(REPO.glob("results/**/policy.pt"))
    assert len(policies) > 100
    for path in policies:
        payload = load_checkpoint(path)
        assert (payload["format"], payload["trainer"]) == (CHECKPOINT_FORMAT, "rl"), path
        policy_from_checkpoint(payload)


def test_a_supervised_run_of_the_earlier_layout_resumes_into_the_new_one(tmp_path, capsys):
    """``checkpoint.pt`` / ``init.pt`` at the top of the folder, format
    ``memcores-supervised-v1``: a resume reads them and continues in ``checkpoints/``."""
    run = tmp_path / "run"
    supervised.train(_supervised(run, "train.steps=2", "train.eval_every=2"))
    for name, old in (("last.pt", "checkpoint.pt"), ("init.pt", "init.pt")):
        payload = torch.load(run / "checkpoints" / name, weights_only=True)
        payload["format"] = "memcores-supervised-v1"
        del payload["trainer"]
        torch.save(payload, run / old)
    shutil.rmtree(run / "checkpoints")
    results = supervised.train(_supervised(run, "train.steps=4", "train.eval_every=2"), True)
    assert results["step"] == 4 and "deprecated" not in capsys.readouterr().err
    assert not (run / "checkpoint.pt").exists()
    assert load_checkpoint(run / CHECKPOINT_NAME)["trainer"] == "supervised"


def test_one_layout_and_format_for_both_trainers(tmp_path):
    rl, sup = tmp_path / "rl", tmp_path / "sup"
    train(tiny_config("train.total_steps=64"), rl)
    supervised.train(_supervised(sup, "train.steps=2", "train.eval_every=2"))
    tags = [load_checkpoint(run / CHECKPOINT_NAME) for run in (rl, sup)]
    assert [(p["format"], p["trainer"]) for p in tags] == [
        ("memcores/2", "rl"),
        ("memcores/2", "supervised"),
    ]
    assert all({"config", "model", "optimizer", "step", "rng"} <= set(p) for p in tags)
    with pytest.raises(CheckpointError, match="not a memcores RL checkpoint"):
        train(tiny_config("train.total_steps=64", f"run.dir={sup}"), sup, resume=True)
