"""``bench gpu`` compiles a part's kernels ahead in worker processes
(:mod:`experiments.bench.warm`): each launch runs once in a spawned worker, failures come back
by name, the deadline ends the workers, and the launches are the ones the parts time."""

from __future__ import annotations

import os

import pytest
import torch

from cores import CORES
from experiments.bench import gpu, split_probe, warm
from experiments.bench.warm import Launch

TINY = (4, 2, 3, 4)


def test_each_launch_runs_once_in_a_worker_and_a_failure_comes_back_by_name():
    launches = [Launch("min_gru", TINY), Launch("min_gru", TINY), Launch("no_such_core", TINY)]
    warmed = warm.warm(launches, torch.device("cpu"), seconds=300.0, processes=2)
    assert warmed["launches"] == 2 and warmed["done"] == 2 and warmed["processes"] == 2
    assert list(warmed["failed"]) == ["no_such_core (4, 2, 3, 4)"]
    assert "no_such_core" in warmed["failed"]["no_such_core (4, 2, 3, 4)"]


def test_the_deadline_ends_the_workers_with_what_is_left():
    warmed = warm.warm([Launch("min_gru", TINY)], torch.device("cpu"), seconds=0.0, processes=1)
    assert warmed["launches"] == 1 and warmed["done"] == 0 and warmed["failed"] == {}


def test_a_part_compiles_ahead_only_on_cuda():
    """Triton's interpreter compiles nothing, so off CUDA a part starts no workers."""
    assert warm.warm_part([Launch("min_gru", TINY)], torch.device("cpu"), 60.0) is None


def test_a_launch_runs_under_its_split_options_and_split_switch(monkeypatch):
    """The options and the switch reach the kernels' settings (a bad option is refused as
    the part would refuse it) and the switch is restored after the launch."""
    from cores import triton_gates

    monkeypatch.delenv(triton_gates.SPLIT_ENV, raising=False)
    bad = Launch("ur_lstm", TINY, (("barrier", "bogus"),))
    assert warm.compile_launch(bad, "cpu").startswith("ValueError: barrier")
    seen = []
    monkeypatch.setattr(
        gpu, "core_runner", lambda *a, **k: lambda: seen.append(os.environ[triton_gates.SPLIT_ENV])
    )
    assert warm.compile_launch(Launch("ur_lstm", TINY, unsplit=True), "cpu") is None
    assert seen == ["0"] and triton_gates.SPLIT_ENV not in os.environ


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_cores_part_compiles_ahead_every_core_and_on_cuda_the_unsplit_ones(device):
    launches = gpu.cores_launches(torch.device(device), gpu.Sizes())
    assert len(set(launches)) == len(launches)
    assert {x.name for x in launches if not x.unsplit} == set(CORES)
    unsplit = {x.name for x in launches if x.unsplit}
    assert unsplit == (set(gpu.SPLIT_CORES) if device == "cuda" else set())
    assert {x.shape for x in launches} == {gpu.Sizes().cores}


def test_the_probe_compiles_ahead_each_shape_core_and_variant_it_times():
    shapes = gpu.Sizes().probe_shapes
    launches = split_probe.probe_launches(shapes)
    assert len(set(launches)) == len(shapes) * len(split_probe.PROBE_CORES) * len(
        split_probe.VARIANTS
    )
    for changes in split_probe.VARIANTS.values():
        assert Launch("slstm", tuple(shapes[-1]), tuple(changes.items())) in launches


def test_the_report_says_how_many_launches_were_compiled_ahead_and_which_failed():
    line = warm.markdown(
        dict(launches=48, done=47, failed={"slstm (1, 2, 3, 4)": "E: x"}, processes=15, seconds=9.5)
    )
    assert line == [
        "",
        "Kernels compiled ahead in 15 worker processes: 47 of 48 forward+backward launches in "
        "9.5 s; failed: slstm (1, 2, 3, 4) (E: x).",
    ]
    assert warm.markdown(None) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton compiles only on a GPU here")
def test_a_fresh_process_loads_what_the_workers_compiled_from_the_cache_on_cuda(
    tmp_path, monkeypatch
):
    """What the parts rely on: a process that runs a launch the workers ran compiles nothing
    (Triton's on-disk cache holds every kernel of it, as that launch specialises them)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    launches = [Launch("ur_lstm", (16, 4, 24, 48)), Launch("slstm", (16, 4, 24, 48))]
    cuda = torch.device("cuda")
    assert warm.warm(launches, cuda, seconds=300.0, processes=2)["done"] == 2
    compiled = sorted(tmp_path.rglob("*"))
    assert any(path.suffix == ".cubin" for path in compiled)
    again = warm.warm(launches, cuda, seconds=300.0, processes=1)
    assert again["done"] == 2 and again["failed"] == {}
    assert sorted(tmp_path.rglob("*")) == compiled
