"""Short real Ray Tune sweeps in the default suite: an interrupted sweep resumes, and a
search names its best point with the right value.

One local Ray instance serves the module (its start-up is most of the time); every trial is a
tiny ``memcores supervised`` run of a few seconds. The longer Ray tests are in
``test_sweep_ray.py`` (``-m slow``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from memcores.experiments.cli import main

ray = pytest.importorskip("ray")

REPO = Path(__file__).parents[1]
DEMO_COPY = REPO / "experiments" / "configs" / "demo_copy.yaml"
TINY = [
    "train.eval_size=32",
    "core.hidden_size=8",
    "train.progress=false",
    "run.tensorboard=false",
]


@pytest.fixture(scope="module")
def ray_session():
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.mark.timeout(300)
def test_ctrl_c_leaves_the_running_trial_to_resume(tmp_path, ray_session, capsys):
    """SIGINT while seed=0 trains: Tune ends the sweep, seed=0 gets no record (a record
    marked "stopped early" would make every re-run skip it), and the same command then
    trains it to its whole budget from its checkpoint."""
    out, results = tmp_path / "s", tmp_path / "r"
    args = ["sweep", str(DEMO_COPY), "--grid", "train.seed=0,1", "--out", str(out)]
    args += ["--results", str(results), "--address", ray_session]
    args += ["train.steps=600", "train.eval_every=20", *TINY]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen(
        [sys.executable, "-m", "memcores", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run = out / "seed=0"
    deadline = time.time() + 180
    while not (run / "checkpoints/last.pt").is_file():
        assert time.time() < deadline and driver.poll() is None, driver.communicate()
        time.sleep(0.05)
    driver.send_signal(signal.SIGINT)
    stdout, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 1, stderr[-2000:]
    assert "INTERRUPTED seed=0: interrupted at step" in stdout
    assert not (results / "seed=0").exists()
    trial = json.loads((run / "trial.json").read_text())
    assert trial["status"] == "interrupted"
    assert json.loads((out / "sweep.json").read_text())["state"] == "interrupted"
    assert 0 < trial["step"] < 600
    init = (run / "checkpoints/init.pt").stat().st_mtime_ns

    assert main(args) == 0
    capsys.readouterr()
    assert (run / "checkpoints/init.pt").stat().st_mtime_ns == init  # resumed, not restarted
    for seed in (0, 1):
        record = json.loads((results / f"seed={seed}" / "record.json").read_text())
        assert record["updates"] == 600 and not record.get("stopped_early")
    assert json.loads((out / "sweep.json").read_text())["state"] == "done"


@pytest.mark.timeout(300)
def test_a_random_search_names_the_best_point_and_its_value(tmp_path, ray_session, capsys):
    """Two points of a learning rate, one too small to learn in 60 steps: the point with the
    lower final eval/loss is named best, with that loss, and comes first in sweep.json."""
    config = tmp_path / "search_copy.yaml"
    raw = yaml.safe_load(DEMO_COPY.read_text())
    raw["search"] = {"optim.lr": {"choice": [0.02, 0.000001]}}
    config.write_text(yaml.safe_dump(raw))
    args = ["sweep", str(config), "--search", "random", "--samples", "2", "--search-seed", "3"]
    args += ["--metric", "eval/loss", "--mode", "min", "--address", ray_session]
    args += ["--out", str(tmp_path / "s"), "--results", str(tmp_path / "r")]
    args += ["train.steps=60", "train.eval_every=30", *TINY]
    assert main(args) == 0
    out = capsys.readouterr().out
    losses = {}
    for path in (tmp_path / "r").glob("*/record.json"):
        record = json.loads(path.read_text())
        losses[record["trial"]] = record["final"]["eval/loss"]
    assert set(losses) == {"lr=0.02", "lr=1e-06"}, "the seed must draw both choices"
    assert losses["lr=0.02"] < losses["lr=1e-06"]
    sweep = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert sweep["best"] == "lr=0.02"
    assert list(sweep["results"]) == ["lr=0.02", "lr=1e-06"]  # best first
    assert sweep["results"]["lr=0.02"]["value"] == pytest.approx(losses["lr=0.02"])
    assert f"best point: lr=0.02 (eval/loss = {losses['lr=0.02']:.4g}" in out
