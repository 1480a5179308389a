"""Inputs that used to mislead or crash: each stops with one line naming the problem (exit 2,
nothing written), or does what it says."""

from __future__ import annotations

import errno
import gc
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageSequence
from rl_helpers import TINY, tiny_config

from memcores.agents.files import atomic_write
from memcores.agents.rl_trainer import train
from memcores.agents.supervised_config import SupervisedConfig
from memcores.experiments.cli import main
from memcores.experiments.config import ConfigError, load_config
from memcores.experiments.sweep import trial_name

DEMO_RL = "experiments/configs/demo_rl.yaml"


def _train(run: Path, *overrides: str) -> int:
    return main(["train", DEMO_RL, *TINY, f"run.dir={run}", *overrides])


# --------------------------------------------------------------------------- unavailable inputs
def test_an_unavailable_env_stops_before_the_run_folder_exists(tmp_path, capsys, monkeypatch):
    from memcores.envs import observation, suites

    monkeypatch.setattr(observation, "_wfc_available", lambda: False)
    run = tmp_path / "run"
    assert _train(run, "env.id=MiniGrid-WFC-MazeSimple-v0") == 2
    err = capsys.readouterr().err
    assert "env.id 'MiniGrid-WFC-MazeSimple-v0' is unavailable" in err
    assert "WFC pattern files are not installed" in err
    assert not run.exists()
    rows = dict(suites.list_envs())  # `memcores list envs` says the same
    assert "unavailable: minigrid's WFC pattern files" in rows["MiniGrid-WFC-MazeSimple-v0"]


def test_sweep_dry_run_refuses_a_missing_dataset_file(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = ["sweep", "experiments/configs/digits.yaml", "task.name=smnist"]
    args += [f"task.data_dir={tmp_path / 'data'}", "--grid", "train.seed=0,1"]
    assert main([*args, "--dry-run", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "trial seed=0: task.data_dir: MNIST file train-images-idx3-ubyte" in err
    assert not out.exists()


def test_supervised_config_checks_dataset_files_without_reading_them(tmp_path):
    with pytest.raises(ConfigError, match="task.data_dir: CIFAR-10 file"):
        load_config(SupervisedConfig, None, ["task.name=scifar", f"task.data_dir={tmp_path}"])
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        (tmp_path / name).write_bytes(b"")
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (tmp_path / name).write_bytes(b"")
    config = load_config(SupervisedConfig, None, ["task.name=smnist", f"task.data_dir={tmp_path}"])
    assert config.task.name == "smnist"  # present (if empty) files pass; reading comes later


# --------------------------------------------------------------------------- before the folder
SUPERVISED_TINY = ["train.steps=2", "train.eval_every=1", "train.progress=false"]


@pytest.mark.parametrize(
    ("command", "overrides", "key"),
    [
        ("train", ["core.impl=triton"], "core.impl"),
        ("train", ["core.name=lru", "core.scan=triton"], "core.scan"),
        ("supervised", ["core.impl=triton"], "core.impl"),
        ("supervised", ["core.name=min_gru", "core.scan=triton"], "core.scan"),
    ],
)
def test_triton_kernels_on_a_cpu_are_refused_before_the_run_folder_exists(
    tmp_path, capsys, monkeypatch, command, overrides, key
):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the suite's CPU runs set it
    run = tmp_path / "run"
    if command == "train":
        code = _train(run, "train.device=cpu", *overrides)
    else:
        args = ["supervised", "experiments/configs/digits.yaml", *SUPERVISED_TINY, *overrides]
        code = main([*args, "train.device=cpu", f"run.dir={run}"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{key}=triton cannot run here (the device is cpu" in err[0]
    assert not run.exists()  # no config.yaml, no events, no init.pt: the next run may use it


@pytest.mark.parametrize(
    ("command", "overrides", "named"),
    [
        ("train", ["env.n_envs=100000000"], "env.n_envs=100,000,000 x agent.n_steps=32"),
        ("supervised", ["task.length=100000000"], "task.length=100000000 (100,000,020 steps)"),
        ("supervised", ["task.name=transfer_copy", "task.eval_lengths=[5,100000000]"],
         "task.eval_lengths 100000000 (100,000,020 steps) x train.eval_batch_size=500"),
    ],
)  # fmt: skip
def test_sizes_beyond_the_memory_are_refused_before_anything_is_made(
    tmp_path, capsys, command, overrides, named
):
    run = tmp_path / "run"
    if command == "train":
        code = _train(run, *overrides)
    else:
        args = ["supervised", "experiments/configs/copy.yaml", *SUPERVISED_TINY, *overrides]
        code = main([*args, f"run.dir={run}"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0]
    assert re.search(r"need at least [\d,.]+ GiB of memory, more than the computer's", err[0])
    assert not run.exists()


def test_the_memory_check_counts_every_device_the_tensors_live_on(monkeypatch):
    import memcores.agents.memory_need as memory

    sizes = {"cpu": 2 * memory.GIB, "cuda": memory.GIB}
    monkeypatch.setattr(memory, "memory_of", lambda device: sizes[device.type])
    both = (torch.device("cpu"), torch.device("cuda", 0))
    memory.check_fits(memory.GIB, both, "x", "lower x")  # fits both: no refusal
    memory.check_fits(3 * memory.GIB // 2, both[:1], "x", "lower x")  # the host alone: fits
    with pytest.raises(ValueError) as caught:
        memory.check_fits(3 * memory.GIB // 2, both, "x", "lower x")
    assert str(caught.value) == (
        "x need at least 1.5 GiB of memory, more than the GPU's (cuda:0) 1.0 GiB; lower x"
    )


def test_eval_lengths_beyond_memory_are_refused_before_the_first_evaluation(tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "eval.json"
    args = ["supervised", "experiments/configs/copy.yaml", *SUPERVISED_TINY, "task.length=5"]
    assert main([*args, "core.hidden_size=8", f"run.dir={run}"]) == 0
    capsys.readouterr()
    evaluate = ["supervised", str(run), "--eval-only", "--json", str(out)]
    assert main([*evaluate, "--eval-lengths", "5,100000000"]) == 2
    err = capsys.readouterr()
    assert "--eval-lengths 100000000 (100,000,020 steps) x train.eval_batch_size" in err.err
    assert "T=5" not in err.out and not out.exists()
    assert main([*evaluate, "--eval-lengths", "5,6"]) == 0 and out.exists()


def test_a_link_loop_as_run_dir_is_named_as_such(tmp_path, capsys):
    loop = tmp_path / "a"
    loop.symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(loop)
    assert _train(loop) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"memcores train: error: run folder {loop} is a symbolic link that leads nowhere "
        "(a loop of links or a missing target); give another run.dir"
    ]


def test_a_config_that_is_not_a_regular_file_says_so(capsys):
    assert main(["train", "/dev/null"]) == 2
    assert capsys.readouterr().err.strip() == (
        "memcores train: error: config file /dev/null is not a regular file; give a YAML file"
    )


def test_random_bytes_as_a_checkpoint_are_called_damaged_not_python_objects(tmp_path, capsys):
    import argparse

    noise, objects = tmp_path / "noise.pt", tmp_path / "objects.pt"
    noise.write_bytes(bytes(range(256)) * 8)
    torch.save({"model": argparse.Namespace(layers=2)}, objects)
    for path, why in [
        (noise, "its bytes are not a PyTorch checkpoint's: random or damaged data"),
        (objects, "it holds Python objects other than tensors and plain data"),
    ]:
        assert main(["evaluate", str(path), "--episodes", "1"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"checkpoint {path} is corrupt or not a memcores" in err[0]
        assert why in err[0]


def test_evaluate_says_an_env_is_unavailable(trained_run, capsys, monkeypatch):
    from memcores.envs import observation

    monkeypatch.setattr(observation, "_wfc_available", lambda: False)
    args = ["evaluate", str(trained_run), "--env", "MiniGrid-WFC-MazeSimple-v0"]
    assert main([*args, "--episodes", "1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "memcores evaluate: error: env 'MiniGrid-WFC-MazeSimple-v0' is unavailable: minigrid's "
        "WFC pattern files are not installed (see `memcores list envs`)"
    ]


def test_eval_only_json_into_a_missing_folder_makes_it(tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "new" / "folder" / "eval.json"
    args = ["supervised", "experiments/configs/copy.yaml", *SUPERVISED_TINY, "task.length=5"]
    assert main([*args, "core.hidden_size=8", f"run.dir={run}"]) == 0
    assert main(["supervised", str(run), "--eval-only", "--json", str(out)]) == 0
    assert set(json.loads(out.read_text())) == {"eval"}


# --------------------------------------------------------------------------- ranges
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agent.clip_range=-0.2", "agent.clip_range must be a finite number > 0, got -0.2"),
        ("agent.clip_range=0", "agent.clip_range must be a finite number > 0, got 0"),
        ("agent.clip_range_vf=-1", "agent.clip_range_vf must be a finite number > 0 or null"),
        ("agent.vf_coef=-5", "agent.vf_coef must be a finite number >= 0, got -5"),
        ("agent.target_kl=-0.1", "agent.target_kl must be a finite number > 0 or null"),
        ("agent.ent_coef=-0.01", "agent.ent_coef must be a finite number >= 0"),
        ("agent.max_grad_norm=-1", "agent.max_grad_norm must be a finite number >= 0"),
        ("agent.gamma=1.5", "agent.gamma must be in (0, 1], got 1.5"),
        ("agent.gae_lambda=-0.5", "agent.gae_lambda must be in [0, 1], got -0.5"),
        ("agent.learning_rate=-1e-3", "agent.learning_rate must be a number in (0,"),
        ("train.seed=99999999999999999999", "train.seed must be in 0..4294967295"),
    ],
)
def test_out_of_range_agent_and_seed_values_stop_before_writing(
    tmp_path, capsys, override, message
):
    run = tmp_path / "run"
    assert _train(run, override) == 2
    assert message in capsys.readouterr().err
    assert not run.exists()


def test_valid_edges_of_the_agent_ranges_are_accepted():
    config = tiny_config("agent.clip_range_vf=null", "agent.target_kl=0.01", "agent.vf_coef=0")
    assert config.agent.target_kl == 0.01 and config.agent.clip_range_vf is None
    assert tiny_config("agent.max_grad_norm=0", "agent.gae_lambda=0").agent.max_grad_norm == 0
    assert tiny_config("train.seed=4294967295").train.seed == 2**32 - 1


def test_supervised_seed_names_key_and_range():
    with pytest.raises(ConfigError, match=r"train.seed must be in 0..4294967295, got 1\d{19}"):
        load_config(SupervisedConfig, None, ["train.seed=12345678901234567890"])


def test_a_negative_value_keeps_its_sign_in_the_trial_name(tmp_path, capsys):
    assert trial_name({"core.hidden_size": "-1"}) == "hidden_size=-1"
    assert trial_name({"core.hidden_size": "1"}) == "hidden_size=1"
    args = ["sweep", "experiments/configs/demo_copy.yaml", "--grid", "core.hidden_size=-1,8"]
    assert main([*args, "--dry-run", "--out", str(tmp_path / "sw")]) == 2
    assert "trial hidden_size=-1: core.hidden_size must be >= 1, got -1" in capsys.readouterr().err


def test_every_yaml_file_is_read_by_the_checked_loader():
    """Duplicate keys and alias bombs are refused wherever memcores reads YAML: no module
    parses it but experiments/config.py's ConfigLoader."""
    root = Path(__file__).resolve().parents[1]
    readers = [
        f"{path.relative_to(root)}:{number}"
        for package in ("agents", "cores", "envs", "experiments")
        for path in sorted((root / package).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"yaml\.(safe_load|load|full_load|unsafe_load)\b", line)
    ]
    assert len(readers) == 1 and readers[0].startswith("experiments/config.py:"), readers


# --------------------------------------------------------------------------- messages
def test_a_library_message_that_echoes_a_huge_value_is_cut(tmp_path, capsys):
    kwargs = tmp_path / "kwargs.yaml"
    big = ", ".join(["x"] * 5000)
    kwargs.write_text(f"env:\n  id: MiniGrid-Empty-5x5-v0\n  kwargs:\n    bogus: [{big}]\n")
    assert main(["train", str(kwargs), f"run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "more characters cut" in err
    assert len(err) < 800


def test_diagnose_says_it_takes_supervised_configs_and_runs(tmp_path, capsys):
    out = str(tmp_path / "p.png")
    assert main(["diagnose", DEMO_RL, "--out", out]) == 2
    err = capsys.readouterr().err
    assert "is an RL config (memcores train); memcores diagnose takes supervised" in err
    run = tmp_path / "rl_run"
    run.mkdir()
    (run / "config.yaml").write_text(Path(DEMO_RL).read_text())
    assert main(["diagnose", str(run), "--out", out]) == 2
    assert f"{run} is an RL run (memcores train)" in capsys.readouterr().err
    assert not Path(out).exists()


# --------------------------------------------------------------------------- files
def test_disk_full_names_the_file_and_keeps_the_old_one(tmp_path):
    target = tmp_path / "last.pt"
    target.write_bytes(b"old")

    def torch_save_to_a_full_disk(handle) -> None:
        with open("/dev/full", "wb") as full:  # torch reports the short write as "unexpected pos"
            torch.save({"w": torch.zeros(10_000)}, full)

    def text_to_a_full_disk(handle) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    for write in (torch_save_to_a_full_disk, text_to_a_full_disk):
        with pytest.raises(OSError, match=f"^no space left on device writing {target}$"):
            atomic_write(target, write)
        assert target.read_bytes() == b"old"
        assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_an_unwritable_folder_names_the_file_not_the_temp_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError) as caught:
        atomic_write(blocker / "x.gif", lambda handle: None)
    assert caught.value.filename == str(blocker / "x.gif")


# --------------------------------------------------------------------------- visualize
@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("vis") / "run"
    train(tiny_config("train.total_steps=64"), run)
    return run


def test_visualize_writes_frame_durations_and_counts_the_frames_in_the_file(
    trained_run, tmp_path, capsys
):
    gif = tmp_path / "agent.gif"
    args = ["visualize", str(trained_run), "--gif", str(gif), "--episodes", "2", "--fps", "4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    with Image.open(gif) as image:
        durations = [frame.info["duration"] for frame in ImageSequence.Iterator(image)]
    said = re.search(r": (\d+) frames(?: \((\d+) steps;)?", out)
    assert said is not None and int(said[1]) == len(durations)  # what the file holds
    steps = int(said[2] or said[1])
    assert all(d % 250 == 0 and d > 0 for d in durations)  # 4 fps: 250 ms per step
    assert sum(durations) == 250 * steps  # merged frames keep their time


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_visualize_to_an_unwritable_place_is_one_line(trained_run, capsys):
    args = ["visualize", str(trained_run), "--gif", "/proc/x.gif", "--episodes", "1"]
    assert main(args) == 2
    gc.collect()  # a half-open GIF writer complained when it was collected
    assert capsys.readouterr().err.strip().splitlines() == [
        "memcores visualize: error: No such file or directory: /proc/x.gif"
    ]


# --------------------------------------------------------------------------- pipes
def test_a_closed_pipe_is_a_quiet_normal_end():
    proc = subprocess.Popen(
        [sys.executable, "-m", "memcores", "list", "cores", "--options"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # like `| head -0`: the reader is gone before the first line
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert err == b""


def test_undecodable_csv_bytes_name_the_file(trained_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    (run / "progress.csv").write_bytes(b"step,rollout/ep_rew_mean\n64,\xff\xfe\n")
    assert main(["plot", str(run), "--out", str(tmp_path / "curves.png")]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'progress.csv'} is not a UTF-8 text CSV file" in err


@pytest.mark.parametrize("command", ["evaluate", "visualize", "diagnose"])
def test_a_seed_option_beyond_the_seed_range_names_the_range(command, capsys):
    args = [command, "RUN", "--seed", "99999999999999999999"]
    args += ["--gif", "x.gif"] if command == "visualize" else []
    with pytest.raises(SystemExit) as caught:
        main(args)
    assert caught.value.code == 2
    assert "--seed: must be in 0..4294967295, got 99999999999999999999" in capsys.readouterr().err
