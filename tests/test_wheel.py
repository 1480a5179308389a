"""memcores as users install it: a wheel built from the checkout, installed into a fresh venv,
used from an empty folder, beside a package named ``envs`` and inside a project that has its
own ``envs/``, ``agents/`` and ``experiments/`` packages.

The venv sees the suite's packages (torch, gymnasium, ...) through a ``.pth`` file, so the
wheel installs with ``--no-deps`` and nothing is downloaded but the build backend.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "memcores", "cores", "agents", "envs")
BUILD_INPUTS += ("experiments",)


def _run(argv: list[str], cwd: Path, env: dict[str, str], check: bool = True):
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done


def _stand_in_wheel(folder: Path, name: str) -> Path:
    """A wheel of a package called ``name`` (as the registry's ``envs`` 1.4 is), written by
    hand: ``name/__init__.py`` that says who it is."""
    wheel = folder / f"{name}-1.4-py3-none-any.whl"
    info = f"{name}-1.4.dist-info"
    files = {
        f"{name}/__init__.py": f"WHO = {name!r} + ' stand-in'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.4\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``(venv python, env, wheel)``: memcores' wheel and a stand-in ``envs`` installed."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in BUILD_INPUTS:  # a copy: the build writes build/ and *.egg-info beside its input
        src = REPO / name
        (
            shutil.copytree(src, source / name, ignore=ignore)
            if src.is_dir()
            else shutil.copy2(src, source / name)
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "MEMCORES"))}
    env |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    dist = root / "dist"
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--no-deps", "-q", "-w", str(dist), str(source)], root, env)
    (wheel,) = dist.glob("memcores-*.whl")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root, env)
    python = venv / "bin" / "python"
    purelib = _run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root, env
    ).stdout.strip()
    # the suite's packages, not its editable memcores: a path in a .pth is not a site dir, so
    # the editable install's own .pth (and its import finder) is never read from there
    (Path(purelib) / "suite_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    stand_in = _stand_in_wheel(dist, "envs")
    target = ["--python", str(python), "install", "--no-deps", "--no-index", "-q"]
    _run([*pip, *target, str(wheel), str(stand_in)], root, env)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return python, env, wheel


def test_the_wheel_holds_one_package_and_its_configs(installed):
    _, _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"memcores", f"{wheel.name.split('-py3')[0]}.dist-info"}
    for path in (
        "memcores/cores/gated.py",
        "memcores/__main__.py",
        "memcores/experiments/configs/memory_s7.yaml",
    ):
        assert path in names
    assert "memcores/experiments/rllib_cluster.sh" in names
    assert not any(
        n.startswith(("memcores/tests", "memcores/docs", "memcores/results")) for n in names
    )
    meta = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-py3')[0]}.dist-info/METADATA").decode()
    assert "License-Expression: MIT" in meta and "Requires-Python: >=3.10" in meta
    assert "Classifier: Programming Language :: Python :: 3.11" in meta
    assert re.search(r"Provides-Extra: (ray|envpool|torchrl|rllib|dev)", meta)


def test_memcores_and_a_package_named_envs_both_import_and_work(installed, tmp_path):
    python, env, _ = installed
    code = (
        "import envs, memcores, memcores.envs\n"
        "print(envs.WHO)\n"
        "print(memcores.make_env('MiniGrid-Empty-5x5-v0', seed=0).reset()[0]['image'].shape)\n"
        "print(memcores.__file__)\n"
    )
    out = _run([str(python), "-c", code], tmp_path, env).stdout.splitlines()
    assert out[0] == "envs stand-in" and out[1] == "(7, 7, 3)"
    assert str(REPO) not in out[2]  # the wheel's copy, not the checkout's
    listed = _run(["memcores", "list", "envs"], tmp_path, env).stdout
    assert "memcores/PassiveVisualMatch-v0" in listed


def _commands(run: Path) -> list[list[str]]:
    """The README's and docs' commands at tiny budgets (each kind of command, each way of
    naming a config), as ``memcores`` arguments."""
    tiny_rl = ["train.total_steps=256", "env.n_envs=2", "agent.n_steps=64"]
    tiny_rl += ["agent.minibatch_size=64", f"run.dir={run}_dk"]
    tiny_sup = ["train.steps=2", "train.eval_every=2", "train.eval_size=8", "train.batch_size=4"]
    lag = ["--cores", "leaky_rnn,power_rnn", "--batch", "4", "--out", f"{run}_lag.png"]
    return [
        ["list", "cores"],
        ["train", "experiments/configs/doorkey5.yaml", *tiny_rl],
        ["evaluate", str(run), "--episodes", "2"],
        ["visualize", str(run), "--gif", f"{run}.gif", "--episodes", "1"],
        ["supervised", "experiments/configs/copy.yaml", *tiny_sup, f"run.dir={run}_copy"],
        ["supervised", "copy", *tiny_sup, f"run.dir={run}_copy_by_name"],
        ["diagnose", "experiments/configs/lag_profile.yaml", *lag],
        ["sweep", "experiments/configs/sweep_copy.yaml", "--grid", "core.name=lstm,ur_lstm"]
        + ["--dry-run"],
        ["sweep", "pbt_memory_s7", "--scheduler", "pbt", "--grid", "train.seed=0,1"]
        + ["--perturbation-interval", "16384", "--metric", "rollout/ep_rew_mean", "--dry-run"],
        ["plot", str(run), "--out", f"{run}_curve.png"],
        ["record", str(run), "--out", f"{run}_record", "--policy"],
        ["evaluate", f"{run}_record", "--episodes", "1"],
    ]


def test_the_documented_commands_work_from_an_empty_folder(installed, tmp_path):
    """The console script and ``python -m`` for the first commands, then the rest in one
    process (``memcores.experiments.cli.main``: one torch import, not one per command)."""
    python, env, _ = installed
    env = {**env, "MPLBACKEND": "Agg"}
    run = tmp_path / "runs" / "ms7"
    assert _run(["memcores", "--version"], tmp_path, env).stdout.startswith("memcores 0.")
    assert (
        "memory_s7"
        in _run([str(python), "-m", "memcores", "list", "configs"], tmp_path, env).stdout
    )
    _run(
        ["memcores", "train", "memory_s7", "train.total_steps=2048", f"run.dir={run}"],
        tmp_path,
        env,
    )
    _run([str(python), "-m", "memcores.experiments.engines", "cluster", "--help"], tmp_path, env)
    driver = (
        "import sys\nfrom memcores.experiments.cli import main\n"
        f"for argv in {_commands(run)!r}:\n"
        "    code = main(argv)\n"
        "    assert code == 0, (argv, code)\n"
    )
    _run([str(python), "-c", driver], tmp_path, env)
    assert (run / "checkpoints" / "last.pt").is_file()
    assert (tmp_path / "runs" / "ms7_record" / "record.json").is_file()
    assert (tmp_path / "runs" / "ms7_lag.png").is_file()


def test_the_developer_command_says_it_needs_a_checkout(installed, tmp_path):
    _, env, _ = installed
    done = _run(["memcores", "docs", "--list"], tmp_path, env, check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "developer command" in done.stderr


def test_the_readme_snippets_run_in_a_project_with_its_own_envs_agents_experiments(
    installed, tmp_path
):
    """RL projects keep ``envs/``, ``agents/``, ``experiments/`` folders: memcores' names
    live under ``memcores``, so the user's packages shadow nothing."""
    python, env, _ = installed
    for name in ("envs", "agents", "experiments"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"MINE = {name!r}\n")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    snippets = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert len(snippets) >= 2
    script = "import envs, agents, experiments\nassert envs.MINE == 'envs'\n" + "\n".join(snippets)
    (tmp_path / "snippets.py").write_text(script)
    _run([str(python), "snippets.py"], tmp_path, env)
    assert (tmp_path / "runs" / "ms7_py" / "config.yaml").is_file()
