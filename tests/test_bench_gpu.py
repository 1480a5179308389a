"""``memcores bench gpu``: every part runs on the CPU at tiny sizes (``--device cpu --quick``),
its results land in JSON and markdown, the budgets cut what does not fit, and without a GPU
the GPU run stops with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from cores import CORES
from experiments.bench import gpu
from experiments.cli import main


def test_without_a_gpu_it_stops_with_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "bench"
    assert main(["bench", "gpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err and "--device cpu" in err
    assert not out.exists()


def test_an_unknown_part_is_named_with_the_valid_ones(tmp_path, capsys):
    args = ["bench", "gpu", "--device", "cpu", "--quick", "--parts", "cores,speed"]
    assert main([*args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown part(s) speed" in err and "scaling" in err and "supervised" in err
    assert "probe" in err


def test_the_probe_runs_only_when_named_and_compares_each_variant_with_the_default(tmp_path):
    """``--parts probe``: every core, shape and variant of the unit-split kernels timed, each
    variant's values compared with the default's (on the CPU the kernels' options change
    nothing, so the difference is 0); the default run leaves the probe out."""
    from experiments.bench import split_probe

    assert "probe" not in gpu.PARTS and "probe" in gpu.EXTRA_PARTS
    args = ["bench", "gpu", "--device", "cpu", "--quick", "--parts", "probe"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    part = json.loads((tmp_path / "bench_gpu.json").read_text())["parts"]["probe"]
    assert not part["errors"] and not part["not_measured"]
    got = {(r["core"], tuple(r["shape"]), r["variant"]) for r in part["rows"]}
    want = {
        (core, shape, variant)
        for core in split_probe.PROBE_CORES
        for shape in gpu.QUICK.probe_shapes
        for variant in split_probe.VARIANTS
    }
    want |= {(b, s, "default") for b in ("nn.LSTM", "nn.GRU") for s in gpu.QUICK.probe_shapes}
    assert got == want
    cores = [r for r in part["rows"] if r["core"] in split_probe.PROBE_CORES]
    assert all(r["ms"] > 0 and r["diff"] == 0.0 and not r["refused"] for r in cores)
    md = (tmp_path / "bench_gpu.md").read_text()
    assert "## Unit-split kernel variants" in md and "| data barrier, no prefetch |" in md
    assert md.count("| slstm |") == len(gpu.QUICK.probe_shapes)
    assert md.count("x nn.LSTM)") == 2 * len(gpu.QUICK.probe_shapes)  # ur_lstm and slstm
    # the defaults and the cuDNN modules are profiled: their time per kernel (on a CPU, per op)
    for row in part["rows"]:
        profiled = row["variant"] == "default"
        assert bool(row["kernels_us"]) == profiled
        if profiled:
            assert all(us > 0 for us in row["kernels_us"].values())
            assert list(row["kernels_us"].values()) == sorted(row["kernels_us"].values())[::-1]
    assert md.count("- slstm (") == len(gpu.QUICK.probe_shapes) and "wall " in md


def test_a_variant_whose_split_the_gpu_refused_is_marked_in_the_probe_table():
    """A variant the GPU refused the split for (parts of 64 units at 256 units) ran one
    program per batch tile: its cell says so beside its time."""
    from experiments.bench import split_probe

    shape = [1024, 8, 64, 256]
    row = dict(core="ur_lstm", shape=shape, diff=None, kernels_us=None, refused=False)
    rows = [
        dict(row, variant="default", ms=4.0),
        dict(row, variant="64 units per part", ms=12.0, diff=1e-6, refused=True),
        dict(row, variant="32 units per part", ms=3.0, diff=1e-6),
    ]
    md = "\n".join(split_probe.markdown(dict(rows=rows, errors={}, not_measured=[])))
    assert "| 12.00, split refused (3.00x, 1e-06) |" in md
    assert "| 3.00 (0.75x, 1e-06) |" in md and md.count("split refused") == 1


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_gpu")
    assert main(["bench", "gpu", "--device", "cpu", "--quick", "--out", str(out)]) == 0
    return json.loads((out / "bench_gpu.json").read_text()), (out / "bench_gpu.md").read_text()


def test_quick_run_on_cpu_measures_every_part(quick_run):
    results, md = quick_run
    parts = results["parts"]
    assert list(parts) == list(gpu.PARTS)
    assert results["hardware"]["device"] == "cpu"
    assert parts["tests"]["returncode"] == 0 and "collected" in parts["tests"]["summary"]

    cores = {r["core"]: r for r in parts["cores"]["rows"]}
    assert {"nn.LSTM", "nn.GRU"} <= cores.keys()
    assert set(CORES) <= cores.keys() | parts["cores"]["errors"].keys()
    assert cores["nn.LSTM"]["x_nn_lstm"] == 1.0 and cores["nn.GRU"]["x_nn_gru"] == 1.0
    assert all(r["ms"] > 0 for r in cores.values())
    assert cores["lstm"]["target"].endswith("<=2x nn.LSTM")
    assert cores["gru"]["target"].endswith("<=2x nn.GRU")
    assert cores["slstm"]["target"].endswith("<=3x nn.LSTM")

    scaling = {r["core"]: r for r in parts["scaling"]["rows"]}
    lengths = parts["scaling"]["lengths"]
    for name in gpu.SCAN_CORES:
        ms = {int(t): v for t, v in scaling[name]["ms"].items()}
        assert set(ms) == set(lengths)
        assert scaling[name]["growth"] == pytest.approx(ms[lengths[-1]] / ms[lengths[0]])

    assert [r["n_envs"] for r in parts["acting"]["rows"]] == list(gpu.QUICK.acting_envs)
    assert all(r["rule"] == "cpu" and r["us_cpu"] > 0 for r in parts["acting"]["rows"])

    rl = parts["rl"]["rows"]
    assert [r["setting"].split()[0] for r in rl] == ["MemoryS7"] * 2 + ["POPGym"] * 5
    assert rl[5]["setting"] == f"POPGym RepeatPreviousEasy ur_lstm, {gpu.EAGER_UPDATE}"
    assert rl[5]["overrides"][-1] == "train.graph_update=false"
    for row in rl:
        assert "error" not in row, row
        assert row["cpu"]["fps"] > 0 and row["device"]["fps"] > 0
    plain, eager = rl[0], rl[1]
    # the CPU against itself; no graphs there (their bookkeeping: the test below)
    assert plain["x_cpu"] == 1.0 and "graph" not in plain["device"]
    # the eager-update row times the device only, against the plain row's CPU
    assert eager["setting"] == f"{plain['setting']}, {gpu.EAGER_UPDATE}"
    assert eager["cpu"] == plain["cpu"]
    assert eager["x_cpu"] == pytest.approx(eager["device"]["fps"] / plain["cpu"]["fps"])
    assert rl[2]["cpu"]["epochs_timed"] == "1/30"  # POPGym's 30 epochs, one timed

    sup = parts["supervised"]
    assert sup["cpu"]["s_per_update"] > 0 and sup["cpu"]["updates"] == gpu.QUICK.supervised_updates

    for title in ("CUDA tests", "Cores, forward+backward", "Cost against T", "Acting step"):
        assert f"## {title}" in md
    assert "## RL frames/s" in md and "## Supervised copy" in md
    assert "| nn.LSTM | " in md and "| min_gru | " in md


def test_capturable_cores_get_a_cuda_graph_column_and_the_better_time_counts(quick_run):
    results, md = quick_run
    rows = {r["core"]: r for r in results["parts"]["cores"]["rows"]}
    capturable = gpu.graph_safe_cores()
    assert "janet" in capturable and "lstm" not in capturable
    for name, row in rows.items():
        if name in capturable:
            assert row["ms_graphed"] > 0
            assert row["best_ms"] == min(row["ms"], row["ms_graphed"])
        else:
            assert row["ms_graphed"] is None and row["best_ms"] == row["ms"]
    # the H100 baseline covers every core; the 5x target checks the other cores
    assert set(CORES) <= gpu.H100_BASELINE_MS.keys()
    assert rows["janet"]["target"].endswith(">=5x faster than its step loop")
    janet = rows["janet"]
    own = janet["ms"] / janet["best_ms"] if janet["best_ms"] < janet["ms"] else None
    assert janet["x_own_loop"] == (None if own is None else pytest.approx(own))
    assert "| x own loop |" in md
    assert rows["janet"]["x_faster"] == pytest.approx(
        tuple(ms / rows["janet"]["best_ms"] for ms in gpu.H100_BASELINE_MS["janet"])
    )
    assert "| ms, CUDA graph |" in md and "| 79-88 |" in md
    # the unsplit kernels are timed on CUDA only (on a CPU the cores take no Triton path)
    assert "| ms, unsplit |" in md and all(r["ms_unsplit"] is None for r in rows.values())
    assert set(gpu.SPLIT_CORES) <= set(CORES)
    scaling = {r["core"]: r for r in results["parts"]["scaling"]["rows"]}
    for name in gpu.GRAPH_SCALING:
        assert scaling[name]["ms"] and scaling[name + gpu.GRAPHED]["ms"]


def test_the_baselines_are_timed_three_times_and_the_ratios_use_their_median(quick_run):
    results, md = quick_run
    cores = results["parts"]["cores"]
    rows = {r["core"]: r for r in cores["rows"]}
    for name in gpu.BASELINES:
        runs = cores["baseline_runs"][name]
        assert len(runs) == 3 and all(ms > 0 for ms in runs)
        assert rows[name]["ms"] == pytest.approx(sorted(runs)[1])
    lstm_ms = sorted(cores["baseline_runs"]["nn.LSTM"])[1]
    assert rows["janet"]["x_nn_lstm"] == pytest.approx(rows["janet"]["best_ms"] / lstm_ms)
    assert "Baselines timed before, between and after the cores: nn.LSTM " in md


@pytest.mark.parametrize(("seconds", "calls"), [(0.001, 20), (0.0001, 32), (0.05, 1)])
def test_short_calls_are_timed_several_to_a_window(monkeypatch, seconds, calls):
    """A call of ``seconds`` is timed ``calls`` to a window (20 ms, at most 32 calls), after a
    warm-up and a sizing call (which counts as a window when it fills one); the result is the
    time per call."""
    made: list[int] = []

    def run() -> None:
        made.append(1)

    def fake_timed(fn, device) -> float:  # each call of ``run`` takes ``seconds``
        before = len(made)
        fn()
        return seconds * (len(made) - before)

    monkeypatch.setattr(gpu, "timed", fake_timed)
    result = gpu.time_runner(run, torch.device("cpu"), reps=3, clock=gpu.Clock(60.0))
    assert result == pytest.approx(seconds)
    assert len(made) == 2 + (2 if calls == 1 else 3 * calls)
    made.clear()  # no time left for a window: the sizing call stands in
    assert gpu.time_runner(run, torch.device("cpu"), 3, gpu.Clock(0.0)) == pytest.approx(seconds)
    assert len(made) == 2


def test_the_5x_target_against_a_baseline_range():
    low, high = gpu.H100_BASELINE_MS["rel_lstm"]
    assert gpu._target("rel_lstm", None, None, low / 5).startswith("ok")
    assert gpu._target("rel_lstm", None, None, (low + high) / 10).startswith("?")
    assert gpu._target("rel_lstm", None, None, high / 4).startswith("MISS")
    assert gpu._target("min_gru", None, None, 1.0) == ""  # scan cores: the T-scaling target


def test_the_5x_target_reads_the_cores_own_loop_timed_in_the_same_run():
    low, high = gpu.H100_BASELINE_MS["nru"]
    between = (low + high) / 10
    assert gpu._target("nru", None, None, between, loop_ms=5 * between).startswith("ok")
    assert gpu._target("nru", None, None, between, loop_ms=4 * between).startswith("?")
    assert gpu._target("nru", None, None, high / 4, loop_ms=4 * high / 4).startswith("MISS")
    assert gpu._target("nru", None, None, between, loop_ms=between).startswith("?")


def test_a_spent_budget_leaves_the_rest_listed_as_not_measured():
    clock = gpu.Clock(0.0)
    result = gpu.part_cores(torch.device("cpu"), gpu.QUICK, clock, True)
    assert result["rows"] == [] and result["not_measured"][:2] == ["nn.LSTM", "nn.GRU"]
    assert set(CORES) <= set(result["not_measured"])
    scaling = gpu.part_scaling(torch.device("cpu"), gpu.QUICK, clock, True)
    assert "min_gru T=64" in scaling["not_measured"]
    md = gpu.markdown(
        {
            "command": "memcores bench gpu",
            "hardware": {"device": "cpu", "cpu": "x", "cpu_count": 2, "torch": "t", "triton": None},
            "parts": {"cores": result},
        }
    )
    assert "## Not measured" in md and "cores (time budget): nn.LSTM, nn.GRU" in md


def test_graphed_acting_step_needs_cuda_and_replays_there(device):
    """The CUDA-graph column of the acting part, through the trainer's acting graph: refused
    off CUDA with one clear error; replayed with fresh observations and the state carried on
    a GPU (and on the CPU through the eager recorder)."""
    import numpy as np

    from agents.graph_recording import EagerRecorder
    from agents.policy import build_policy

    config = gpu._rl_config(gpu.MEMORY_S7, list(gpu.QUICK.rl_overrides))
    policy = build_policy(config, 7, (7, 7, 3)).to(device).eval()
    obs = {"image": np.zeros((4, 7, 7, 3), np.uint8), "direction": np.zeros(4, np.int64)}
    recorder = None
    if device == "cpu":
        with pytest.raises(ValueError, match="needs a CUDA device"):
            gpu.graphed_acting_step(policy, obs, torch.device(device))
        recorder = EagerRecorder()
    step = gpu.graphed_acting_step(policy, obs, torch.device(device), recorder)
    obs["image"][:] = 3  # new values reach the graph through its input copy
    for _ in range(3):
        actions = step()
        assert actions.shape == (4,) and ((actions >= 0) & (actions < 7)).all()


def test_split_off_sets_and_restores_the_switch(monkeypatch):
    from cores import triton_gates

    monkeypatch.delenv(triton_gates.SPLIT_ENV, raising=False)
    with gpu.split_off(True):
        assert triton_gates.split_plan(1, 2, 16, torch.device("cpu")) is None
        assert os.environ[triton_gates.SPLIT_ENV] == "0"
    assert triton_gates.SPLIT_ENV not in os.environ
    monkeypatch.setenv(triton_gates.SPLIT_ENV, "1")
    with gpu.split_off(True):
        assert os.environ[triton_gates.SPLIT_ENV] == "0"
    assert os.environ[triton_gates.SPLIT_ENV] == "1"
    with gpu.split_off(False):
        assert os.environ[triton_gates.SPLIT_ENV] == "1"


def test_a_tests_part_the_budget_stops_still_says_what_ended(monkeypatch):
    """The CUDA tests run verbosely; when the budget stops them, the part reports how many
    passed and which failed by then."""
    partial = (
        "tests/test_a.py::test_one[cuda] PASSED                 [  1%]\n"
        "tests/test_a.py::test_two[cuda] FAILED                 [  2%]\n"
        "tests/test_b.py::test_three PASSED                     [  3%]\n"
        "[gw1] [  4%] PASSED tests/test_c.py::test_five\n"  # pytest-xdist's order
        "[gw0] node down: Not properly terminated\n"
        "[gw0] [  5%] FAILED tests/test_c.py::test_six[cuda]\n"
        "tests/test_b.py::test_four "
    )

    def stopped(command, **kwargs):
        assert "-v" in command
        raise subprocess.TimeoutExpired(command, 1.0, output=partial.encode())

    monkeypatch.setattr(subprocess, "run", stopped)
    part = gpu.part_tests(torch.device("cpu"), gpu.QUICK, gpu.Clock(1.0), quick=False)
    assert part["returncode"] is None
    assert part["summary"].endswith("(3 passed, 2 failed by then)")
    assert part["failed"] == [
        "FAILED tests/test_a.py::test_two[cuda]",
        "FAILED tests/test_c.py::test_six[cuda]",
    ]


@pytest.mark.parametrize("xdist", [True, False])
@pytest.mark.parametrize("timeout", [True, False])
def test_the_cuda_tests_spread_over_workers_and_stop_a_hung_test(monkeypatch, xdist, timeout):
    """Where pytest-xdist is installed the CUDA tests run over several workers; where
    pytest-timeout is, a test past the limit ends its worker, so a kernel that never returns
    is named instead of taking the part's budget."""
    installed = {"xdist": xdist, "pytest_timeout": timeout}
    monkeypatch.setattr(gpu, "_installed", lambda module: installed[module])
    command = gpu.test_command(quick=False)
    assert command[:3] == [sys.executable, "-m", "pytest"] and "-v" in command
    assert ("-n" in command) == xdist
    if xdist:
        assert 1 <= int(command[command.index("-n") + 1]) <= 8
    assert (f"--timeout={gpu.TEST_TIMEOUT_S:.0f}" in command) == timeout
    assert ("--timeout-method=thread" in command) == timeout
    assert "-n" not in gpu.test_command(quick=True)


def test_a_hung_test_is_reported_by_name_and_the_others_still_run(tmp_path, monkeypatch):
    """The part's command on a real pytest (xdist and pytest-timeout are dev dependencies):
    a test that never returns fails by name after the limit, and the tests beside it pass."""
    (tmp_path / "test_hang.py").write_text(
        "import time\n"
        "def test_cuda_hangs():\n    time.sleep(60)\n"
        "def test_cuda_one():\n    pass\n"
        "def test_triton_kernels_two():\n    pass\n"
    )
    monkeypatch.setattr(gpu, "TEST_TIMEOUT_S", 3.0)
    command = [*gpu.test_command(quick=False), "test_hang.py"]
    assert "-n" in command and "--timeout=3" in command
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    ended = gpu.tests_ended(done.stdout)
    assert ended["FAILED"] == ["test_hang.py::test_cuda_hangs"]
    assert sorted(ended["PASSED"]) == [
        "test_hang.py::test_cuda_one",
        "test_hang.py::test_triton_kernels_two",
    ]


def test_a_part_that_never_returns_stops_the_run_with_what_was_measured(tmp_path):
    """The watchdog names a hung part, keeps the parts written before it, and exits with 3."""
    import time

    hardware = gpu.info(torch.device("cpu"))
    results = {"command": "c", "hardware": hardware, "budgets_s": {}, "parts": {}}
    results["parts"]["tests"] = {
        "command": "pytest",
        "returncode": 0,
        "summary": "3 passed",
        "failed": [],
    }
    stopped = []
    with gpu.watchdog("cores", 0.05, results, tmp_path, stop=stopped.append):
        deadline = time.monotonic() + 5.0
        while not stopped and time.monotonic() < deadline:
            time.sleep(0.01)
    assert stopped == [3]
    saved = json.loads((tmp_path / "bench_gpu.json").read_text())
    assert saved["parts"]["tests"]["summary"] == "3 passed"
    assert "taken for hung" in saved["parts"]["cores"]["hung"]
    md = (tmp_path / "bench_gpu.md").read_text()
    assert "## cores" in md and "taken for hung" in md and "3 passed" in md
    with gpu.watchdog("scaling", 5.0, results, tmp_path, stop=stopped.append):
        pass  # a part that returns in time cancels its watchdog
    time.sleep(0.05)
    assert stopped == [3] and "scaling" not in results["parts"]
    assert gpu.hang_limit(80.0) > 80.0


def test_a_plain_rl_row_acts_and_updates_as_the_trainer_does_by_default(monkeypatch):
    """Where ``train.graph_acting`` and ``train.graph_update`` resolve on (a CUDA learner,
    faked here: on the CPU the recordings rerun eagerly), the plain row acts through the acting
    graph and replays the update's steps, as ``memcores train`` would; the eager-update row's
    ``train.graph_update=false`` updates eagerly."""
    from agents import rl_trainer
    from cores.graphed import cuda_graph_choice

    def update_on(config, *args):
        return cuda_graph_choice(config.train.graph_update) != "false"

    monkeypatch.setattr(rl_trainer, "graph_acting_on", lambda *args: True)
    monkeypatch.setattr(rl_trainer, "graph_update_on", update_on)
    overrides = list(gpu.QUICK.rl_overrides)
    steps = gpu._rl_config(gpu.MEMORY_S7, overrides).agent.n_steps
    out = gpu.rl_rate(gpu.MEMORY_S7, overrides, "cpu", None)
    acted, updated = out["graph"].split("; ")
    assert acted == f"acting {steps} steps replayed"
    assert updated.startswith("update ") and updated.endswith(" steps replayed"), updated
    assert int(updated.split()[1]) > 0
    out = gpu.rl_rate(gpu.MEMORY_S7, [*overrides, "train.graph_update=false"], "cpu", None)
    assert out["graph"] == f"acting {steps} steps replayed; update eager"
