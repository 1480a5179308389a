"""``memcores bench gpu``: every part runs on the CPU at tiny sizes (``--device cpu --quick``),
its results land in JSON and markdown, the budgets cut what does not fit, and without a GPU
the GPU run stops with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from memcores.cores import CORES
from memcores.experiments.bench import gpu
from memcores.experiments.bench.gpu_report import SECTIONS
from memcores.experiments.cli import main


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
    assert "probe" not in err and "tests" not in err  # the CUDA tests run as pytest -m cuda


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

    rl, batched = parts["rl"]["rows"][:7], parts["rl"]["rows"][7:]
    assert [r["setting"].split()[0] for r in rl] == ["MemoryS7"] * 2 + ["POPGym"] * 5
    assert rl[5]["setting"] == "POPGym ur_lstm, eager update"
    assert rl[5]["overrides"][-1] == "train.graph_update=false"
    for row in rl:
        assert "error" not in row, row
        assert row["cpu"]["fps"] > 0 and row["device"]["fps"] > 0
    # the batched-env rows: the device only, each against a row of the same run
    passive = "PassiveVisualMatch lstm, batched, 4 envs, minibatch 128"
    assert [r["setting"] for r in batched] == [
        passive,
        f"{passive}, env step graphed",
        "POPGym min_gru, batched",
    ]
    # the env-step recording is refused off CUDA (its CPU run: the test below)
    assert "train.graph_env_step=true cannot apply" in batched[1]["error"]
    fastest = max(rl, key=lambda r: r["device"]["fps"])
    popgym_min_gru = next(r for r in rl if r["setting"] == "POPGym min_gru")
    for row, other in zip(batched[::2], (fastest, popgym_min_gru), strict=True):
        assert "error" not in row and "cpu" not in row, row
        assert "env.vector=batched" in row["overrides"]
        assert row["against"] == other["setting"]
        assert row["x_against"] == pytest.approx(row["device"]["fps"] / other["device"]["fps"])
    assert "| POPGym min_gru, batched | - | " in md
    plain, eager = rl[0], rl[1]
    # the CPU against itself; no graphs there (their bookkeeping: the test below)
    assert plain["x_cpu"] == 1.0 and plain["device"]["graphs"] == "acting eager; update eager"
    # the eager-update row times the device only, against the plain row's CPU
    assert eager["setting"] == f"{plain['setting']}, eager update"
    assert eager["cpu"] == plain["cpu"]
    assert eager["x_cpu"] == pytest.approx(eager["device"]["fps"] / plain["cpu"]["fps"])
    assert rl[2]["cpu"]["epochs_timed"] == "1/30"  # POPGym's 30 epochs, one timed

    sup = parts["supervised"]
    assert sup["cpu"]["s_per_update"] > 0 and sup["cpu"]["updates"] == gpu.QUICK.supervised_updates

    assert "## CUDA tests" not in md
    assert gpu.markdown(results) == md  # the markdown is its JSON's, read back
    for title in ("Cores, forward+backward", "Cost against T", "Acting step"):
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
            assert row["x_own_loop"] == pytest.approx(row["ms"] / row["ms_graphed"])
            assert row["target"].endswith(">=5x faster than its own loop")
        else:
            assert row["ms_graphed"] is None and row["best_ms"] == row["ms"]
            assert row["x_own_loop"] is None
    assert "| ms, CUDA graph |" in md and "| x own loop |" in md
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


def test_the_committed_record_is_read_at_its_own_shape_only(quick_run, tmp_path):
    """The record column comes from a committed ``bench_gpu.json`` (the H100's by default),
    and only where its cores table has this run's shape: the quick run compares nothing."""
    h100 = gpu.committed_ms(gpu.RECORD, dict(T=256, B=64, D=64, H=128))
    assert h100["janet"] == pytest.approx(13.11, abs=0.01)  # its CUDA graph's time
    assert h100["ur_lstm"] == pytest.approx(6.43, abs=0.01) and "nn.LSTM" in h100
    assert gpu.committed_ms(gpu.RECORD, dict(T=8, B=2, D=8, H=8)) == {}
    assert gpu.committed_ms(tmp_path / "none.json", dict(T=256, B=64, D=64, H=128)) == {}
    results, md = quick_run
    assert results["parts"]["cores"]["against"] is None and "No committed record" in md
    assert all(r["record_ms"] is None for r in results["parts"]["cores"]["rows"])
    row = gpu._core_row("janet", 50.0, 8.0, {"nn.LSTM": 2.0}, {"janet": 10.0})
    assert row["x_record"] == pytest.approx(0.8) and row["x_own_loop"] == pytest.approx(6.25)
    assert row["x_nn_lstm"] == pytest.approx(4.0) and row["target"].startswith("ok")


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


def test_the_targets():
    assert gpu.target("ur_lstm", 1.9, None, None).startswith("ok <=2x nn.LSTM")
    assert gpu.target("ur_lstm", 2.1, None, None).startswith("MISS")
    assert gpu.target("fast_gru", 9.0, 1.5, None) == "ok <=2x nn.GRU"
    assert gpu.target("slstm", 2.9, None, None) == "ok <=3x nn.LSTM"
    assert gpu.target("nru", None, None, 5.0).startswith("ok >=5x")
    assert gpu.target("nru", None, None, 4.9).startswith("MISS >=5x")
    assert gpu.target("min_gru", 0.5, 0.6, None) == ""  # scan cores: the T-scaling target


def test_a_spent_budget_leaves_the_rest_listed_as_not_measured():
    clock = gpu.Clock(0.0)
    result = gpu.part_cores(torch.device("cpu"), gpu.QUICK, clock, gpu.RECORD)
    assert result["rows"] == [] and result["not_measured"][:2] == ["nn.LSTM", "nn.GRU"]
    assert set(CORES) <= set(result["not_measured"])
    scaling = gpu.part_scaling(torch.device("cpu"), gpu.QUICK, clock, gpu.RECORD)
    assert "min_gru T=64" in scaling["not_measured"]
    md = gpu.markdown(
        {
            "command": "memcores bench gpu",
            "hardware": {"device": "cpu", "cpu": "x", "cpu_count": 2, "torch": "t", "triton": None},
            "parts": {"cores": result},
        }
    )
    assert "## Not measured" in md and "cores (time budget): nn.LSTM, nn.GRU" in md


def test_the_acting_step_through_the_acting_graph_replays_with_new_observations(device):
    """The CUDA-graph column of the acting part, through the trainer's acting graph (on the
    CPU its eager recorder): warmed up and recorded before it is returned, then replayed
    with the observations refilled in place and the state carried."""
    import numpy as np

    from memcores.agents.networks import build_policy

    config = gpu._rl_config(gpu.MEMORY_S7, list(gpu.QUICK.rl_overrides))
    torch.manual_seed(0)
    policy = build_policy(config, 7, (7, 7, 3)).to(device).eval()
    obs = {"image": np.zeros((4, 7, 7, 3), np.uint8), "direction": np.zeros(4, np.int64)}
    dev = torch.device(device)
    graphed = gpu.acting_step(policy, obs, dev, graphed=True)
    obs["image"][:] = 3  # new values reach the recording through its input copy
    for _ in range(3):
        actions = graphed()
        assert actions.shape == (4,) and ((actions >= 0) & (actions < 7)).all()
    assert gpu.timed(graphed, dev) > 0


def test_the_env_step_row_acts_and_steps_the_env_through_one_recording(monkeypatch):
    """Where ``train.graph_env_step`` applies (a CUDA learner, faked here: on the CPU the
    recording reruns eagerly), the row primes the recording before the clock and every
    timed rollout step is a replay of the acting and env step."""
    from memcores.agents import rl_trainer

    monkeypatch.setattr(rl_trainer, "graph_obstacles", lambda *args: (None, None))
    label, path, overrides, epochs, against = gpu.batched_settings(gpu.QUICK)[1]
    assert overrides[-1] == gpu.ENV_STEP_GRAPH and label == f"{against}, env step graphed"
    steps = gpu._rl_config(path, overrides).agent.n_steps
    out = gpu.rl_rate(path, overrides, "cpu", epochs)
    acted, _ = out["graphs"].split("; ")
    assert acted == f"acting and env step {steps + 1} steps replayed"  # recording, then all
    assert out["fps"] > 0


def test_the_rl_rows_time_each_eager_update_row_after_its_plain_row():
    settings = gpu.rl_settings(gpu.Sizes())
    labels = [label for label, *_ in settings]
    for plain in gpu.EAGER_ROWS:
        eager = labels[labels.index(plain) + 1]
        assert eager == f"{plain}, eager update"
        assert settings[labels.index(eager)][2][-1] == "train.graph_update=false"
    n_batched = len(gpu.Sizes().batched_envs) + 3  # two env steps graphed, POPGym min_gru
    assert len(labels) == 2 + len(gpu.POPGYM_CORES) + len(gpu.EAGER_ROWS) + n_batched
    assert labels[-n_batched:] == [label for label, *_ in gpu.batched_settings(gpu.Sizes())]


def test_a_plain_rl_row_acts_and_updates_as_the_trainer_does_by_default(monkeypatch):
    """Where ``train.graph_acting`` and ``train.graph_update`` resolve on (a CUDA learner,
    faked here: on the CPU the recordings rerun eagerly), the row acts through the acting
    graph and replays the update's steps, as ``memcores train`` would; with
    ``train.graph_update=false`` it updates eagerly."""
    from memcores.agents import rl_trainer

    monkeypatch.setattr(rl_trainer, "graph_obstacles", lambda *args: (None, None))
    overrides = list(gpu.QUICK.rl_overrides)
    steps = gpu._rl_config(gpu.MEMORY_S7, overrides).agent.n_steps
    out = gpu.rl_rate(gpu.MEMORY_S7, overrides, "cpu", None)
    acted, updated = out["graphs"].split("; ")
    assert acted == f"acting {steps + 1} steps replayed"  # the recording's step, then all
    assert updated.startswith("update ") and updated.endswith(" steps replayed"), updated
    assert int(updated.split()[1]) > 0
    out = gpu.rl_rate(gpu.MEMORY_S7, [*overrides, "train.graph_update=false"], "cpu", None)
    assert out["graphs"] == f"acting {steps + 1} steps replayed; update eager"


def test_the_default_against_record_renders_with_the_current_report():
    """``--against`` reads an older record: its rows may lack columns added since (shown as -)."""
    results = json.loads(Path(gpu.REPO, gpu.RECORD).read_text())
    md = gpu.markdown(results)
    known = results["parts"].keys() & SECTIONS.keys()  # a part since removed is not rendered
    assert known and md.count("\n## ") >= len(known)
