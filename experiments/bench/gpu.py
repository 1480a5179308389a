"""``memcores bench gpu --out DIR``: everything GPU-side, measured in one prepared run.

On a machine with a CUDA GPU, in one run of a few minutes (each part has a time budget,
360 s in all; what a part cannot fit is listed as not measured):

1. ``tests``: the CUDA cases of the test suite (``pytest -k "cuda or triton_kernels"``:
   every test on the ``device`` fixture, the kernel tests that name CUDA, and the fused-kernel
   tests, which run compiled on CUDA; over several workers with ``pytest-xdist``, each test
   stopped after 120 s with ``pytest-timeout``, :func:`test_command`).
2. ``cores``: forward+backward of every core at T=256, B=64, input 64, hidden 128, beside
   cuDNN's ``nn.LSTM`` and ``nn.GRU`` timed three times in the same run (before the cores,
   between and after; the ratios divide by the median); every ``graph_safe`` core
   twice, eagerly and through :class:`cores.graphed.GraphedCore` (CUDA graphs), the better
   of the two counting; on CUDA the fused kernels' cores (:data:`SPLIT_CORES`) also with
   their unit split off. The targets (gated LSTM presets at most 2x ``nn.LSTM``, GRU presets
   at most 2x ``nn.GRU``, ``slstm`` at most 3x ``nn.LSTM``, every other core at least 5x
   faster than its step loop: its eager loop in the same run, or the step loops' H100
   baseline, :data:`H100_BASELINE_MS`) marked ok or MISS. On CUDA the cells' kernels are
   first compiled side by side in worker processes (:mod:`experiments.bench.warm`).
3. ``scaling``: forward+backward against the sequence length (B=16, hidden 128; T = 256, 1024,
   4096, 16384 for the scan cores, to 4096 for the step-loop cores, of which
   :data:`GRAPH_SCALING` also through CUDA graphs); target: a scan core's time at T=16384 at
   most 8x its time at T=256.
4. ``acting``: one acting step of the MemoryS7 policy (observations from NumPy, T=1 forward,
   sampled actions back to NumPy) on the CPU, on the GPU, and on the GPU through the
   trainer's acting graph (:func:`graphed_acting_step`) per ``n_envs``, beside the rule the
   trainer applies
   (:func:`agents.device.acting_device`), and where CPU and GPU cross.
5. ``rl``: PPO frames/s on the GPU against the same machine's CPU: MemoryS7
   (``experiments/configs/memory_s7.yaml``) at 8 and 64 envs, and POPGym's settings
   (``experiments/configs/sweep_popgym.yaml``) for ``gru``, ``lstm``, ``ur_lstm`` and
   ``min_gru``. One rollout is collected and timed; the update is timed over ``E`` of its
   epochs (all 8 of MemoryS7's, 1 of POPGym's 30; on the GPU after a warm-up epoch) and
   scaled to the whole update: frames/s = frames / (collection + update). Each side runs
   with the config's own ``train.threads``, and acts and updates as ``memcores train`` does
   by default (on a GPU through acting graphs and update graphs, ``train.graph_acting`` and
   ``train.graph_update`` ``auto``, timed after their warm-up and recording). Each MemoryS7
   row is followed by one that updates eagerly (``train.graph_update=false``), timed on the
   GPU only, and so is POPGym's ``ur_lstm`` row.
6. ``supervised``: the copy task (``experiments/configs/copy.yaml``, T=200) at hidden 128 and
   batch 256, seconds per update on the GPU against the CPU.
7. ``probe``, only when ``--parts`` names it: the unit-split kernels' variants timed side by
   side (:mod:`experiments.bench.split_probe`), their kernels compiled ahead as the cores'.

The results go to ``DIR/bench_gpu.json`` and ``DIR/bench_gpu.md`` (rewritten after each
part, so a run cut short keeps what it measured; a part that has not returned after
:func:`hang_limit` of its budget is named as hung and the run stops there with exit code 3,
:func:`watchdog`). Without a GPU it stops with exit code 2;
``--device cpu --quick`` runs every part at tiny sizes on the CPU (a check that the script
works, as the tests do; its numbers mean nothing). Timings on a GPU wait for the queued
kernels before reading the clock; each time is the median of a few windows, a window holding
as many calls as fill 20 ms (:func:`time_runner`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.device import acting_device, describe_acting, info, resolve_device, sync
from cores import presets_of
from experiments.bench.warm import Launch, warm_part
from experiments.bench.warm import markdown as warm_markdown

REPO = Path(__file__).resolve().parents[2]
MEMORY_S7 = "experiments/configs/memory_s7.yaml"
POPGYM = "experiments/configs/sweep_popgym.yaml"
COPY = "experiments/configs/copy.yaml"
POPGYM_CORES = ("gru", "lstm", "ur_lstm", "min_gru")
POPGYM_EAGER_UPDATE_CORES = ("ur_lstm",)
"""The POPGym rows timed again with an eager update (``lstm`` runs the same kernel)."""
EAGER_UPDATE = "eager update"
"""The label of the RL rows timed with ``train.graph_update=false``."""
SCAN_CORES = ("lru", "min_gru", "min_lstm", "mlstm")
LOOP_CORES = ("lstm", "gru", "ur_lstm", "slstm")
GRAPH_SCALING = ("janet",)
"""Capturable step-loop cores timed against T both eagerly and through CUDA graphs (after
the other cores' cells, so they never take the scan cores' time)."""
BASELINES = ("nn.LSTM", "nn.GRU")
"""cuDNN's cells, the reference of the ratios: timed before the cores, after the eager ones and
at the end of the cores part; the ratios divide by the median of those times."""
GRAPHED = " (CUDA graph)"
"""Suffix of a scaling row timed through :class:`cores.graphed.GraphedCore`."""
SPLIT_CORES = (
    "fast_lstm", "fast2_lstm", "softsign_lstm", "tied_lstm", "uf_lstm", "ur_lstm", "r_lstm",
    "hdetach_lstm", "power_lstm", "fast_gru", "ur_gru", "power_gru", "slstm",
)  # fmt: skip
"""Cores whose fused Triton kernels split a step's units over programs: on CUDA the cores
part also times them with the split off (``MEMCORES_TRITON_SPLIT=0``), after every other
cell."""
OTHER_SPEEDUP = 5.0
"""The target for the cores without a fused kernel or a scan: at least this many times
faster than :data:`H100_BASELINE_MS`."""


def _same(ms: float, *names: str) -> dict[str, tuple[float, float]]:
    return {name: (ms, ms) for name in names}


def _range(low: float, high: float, *names: str) -> dict[str, tuple[float, float]]:
    return {name: (low, high) for name in names}


H100_BASELINE_MS: dict[str, tuple[float, float]] = {
    **_same(42.5, "c_lstm"),
    **_same(46.8, "lstm"),
    **_same(47.0, "tied_lstm"),
    **_range(
        56, 65, "fast_lstm", "fast2_lstm", "r_lstm", "ur_lstm", "hdetach_lstm", "uf_lstm", "u_lstm"
    ),
    **_range(79, 88, "softsign_lstm", "janet", "leaky_rnn", "power_rnn"),
    **_same(140, "gru"),
    **_same(237, "fast_gru"),
    **_same(282, "ur_gru"),
    **_same(287, "power_gru"),
    **_range(224, 396, "o_lstm", "or_lstm", "um_lstm", "om_lstm", "power_lstm"),
    **_range(
        283, 657, "slstm", "rel_lstm", "mem_lstm", "nru", "rel_rnn", "block_gru", "linear_rnn"
    ),
    **_same(19.5, "lru"),
    **_same(23.8, "mlstm"),
    **_same(24.0, "min_lstm"),
    **_same(26.2, "min_gru"),
}
"""The plain step loops' forward+backward on one H100 (PyTorch 2.11, CUDA 13; T=256, B=64,
input 64, hidden 128), ms per core as ``(low, high)``, as recorded in issue 53: one number for
some cores, one range for a group of others. The reference of :data:`OTHER_SPEEDUP`."""
LSTM_PRESETS = frozenset(presets_of("cores.gated:GatedLSTM"))
"""Every gated LSTM preset: the target at most 2x ``nn.LSTM``."""
GRU_PRESETS = frozenset(presets_of("cores.gru:GatedGRU"))
"""Every gated GRU preset: the target at most 2x ``nn.GRU``."""
PARTS: dict[str, float] = {
    "tests": 160.0,  # 240 s on an H100 in one worker, 90 of them in tuned cases since cut
    "cores": 80.0,  # 79 s on an H100, every cell measured
    "scaling": 30.0,  # 22 s on an H100
    "acting": 5.0,  # 2.2 s on an H100
    "rl": 65.0,  # 54 s on an H100, three rows with and without the update graph included
    "supervised": 20.0,  # 13 s on an H100
}
"""Each part's time budget in seconds (360 in all); time a part leaves goes to the next. A
part checks its clock between measurements, so one measurement can overrun it by its own
length (the longest: one POPGym update epoch on the CPU)."""
EXTRA_PARTS: dict[str, float] = {"probe": 150.0}  # 9 variants x 3 cores x 2 shapes
"""Parts that run only when ``--parts`` names them, with their budgets: ``probe``, the
unit-split kernels' variants (:mod:`experiments.bench.split_probe`)."""


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The shapes of one run: the documented ones, or tiny ones with ``--quick``."""

    cores: tuple[int, int, int, int] = (256, 64, 64, 128)  # T, B, D, H
    scaling_b_h: tuple[int, int] = (16, 128)
    scan_lengths: tuple[int, ...] = (256, 1024, 4096, 16384)
    loop_lengths: tuple[int, ...] = (256, 1024, 4096)
    reps: int = 3
    acting_envs: tuple[int, ...] = (8, 64, 256, 1024)
    acting_steps: int = 50
    rl_overrides: tuple[str, ...] = ()
    popgym_overrides: tuple[str, ...] = ()
    supervised_overrides: tuple[str, ...] = ("core.hidden_size=128", "train.batch_size=256")
    supervised_updates: int = 20
    probe_shapes: tuple[tuple[int, int, int, int], ...] = ((256, 64, 64, 128), (1024, 8, 64, 256))


QUICK = Sizes(
    cores=(8, 2, 8, 8),
    scaling_b_h=(2, 8),
    scan_lengths=(16, 64),
    loop_lengths=(16,),
    reps=1,
    acting_envs=(2, 4),
    acting_steps=3,
    rl_overrides=(
        "agent.n_steps=16",
        "agent.seq_len=16",
        "agent.minibatch_size=32",
        "core.hidden_size=8",
    ),
    popgym_overrides=(
        "env.n_envs=2",
        "agent.n_steps=16",
        "agent.seq_len=16",
        "agent.minibatch_size=16",
        "core.hidden_size=8",
    ),
    supervised_overrides=(
        "task.length=10",
        "core.hidden_size=8",
        "train.batch_size=8",
        "train.eval_size=8",
    ),
    supervised_updates=2,
    probe_shapes=((8, 2, 8, 8), (16, 2, 8, 16)),
)


class Clock:
    """A part's deadline (``time.perf_counter`` seconds)."""

    def __init__(self, seconds: float) -> None:
        self.budget = seconds
        self.start = time.perf_counter()

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def spent(self) -> float:
        return time.perf_counter() - self.start


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call of ``fn``, to the end of the kernels it queued on ``device``."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def fwd_bwd(module: torch.nn.Module, x: torch.Tensor, call: Callable) -> Callable[[], None]:
    """One forward+backward of ``call(x)`` through ``module`` (gradients reset first)."""
    params = [p for p in module.parameters() if p.requires_grad]

    def run() -> None:
        for p in params:
            p.grad = None
        call(x).float().sum().backward()

    return run


def core_runner(
    name: str, T: int, B: int, D: int, H: int, device: torch.device, graph: bool = False
) -> Callable:
    """Forward+backward of core ``name`` (or ``nn.LSTM``/``nn.GRU``) on a fixed ``[T, B, D]``
    input drawn on the CPU with seed 0 (every device sees the same values); with ``graph``,
    through :class:`cores.graphed.GraphedCore` (the first call records the graphs)."""
    from cores import make_core
    from cores.graphed import GraphedCore

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, D, generator=gen).to(device)
    torch.manual_seed(0)
    if name in ("nn.LSTM", "nn.GRU"):
        rnn = (torch.nn.LSTM if name == "nn.LSTM" else torch.nn.GRU)(D, H).to(device)
        return fwd_bwd(rnn, x, lambda xs: rnn(xs)[0])
    core = make_core(name, D, H).to(device).train()
    if not graph:
        return fwd_bwd(core, x, lambda xs: core(xs, core.initial_state(xs.shape[1], xs.device))[0])
    wrapped = GraphedCore(core)

    def call(xs: torch.Tensor) -> torch.Tensor:
        y = wrapped(xs, wrapped.initial_state(xs.shape[1], xs.device))[0]
        if wrapped.capture_error is not None:  # it fell back to eager: not a graph's time
            raise RuntimeError(wrapped.capture_error)
        return y

    return fwd_bwd(wrapped, x, call)


WINDOW_S = 0.02
"""Calls shorter than this are timed several to a window, so that one late launch or one
GPU clock step weighs on a millisecond-scale time as little as on a long one."""
MAX_CALLS_PER_WINDOW = 32


def time_runner(run: Callable[[], None], device: torch.device, reps: int, clock: Clock) -> float:
    """Median seconds per call of ``run`` over ``reps`` windows, after a warm-up call
    (compilation, allocator); a window holds as many calls as fill :data:`WINDOW_S` (sized by
    the second call); fewer windows when one would not fit the part's time left."""
    timed(run, device)  # warm-up
    second = timed(run, device)
    calls = max(1, min(MAX_CALLS_PER_WINDOW, int(WINDOW_S / max(second, 1e-9))))

    def window() -> None:
        for _ in range(calls):
            run()

    times = [second] if calls == 1 else []  # a call that fills a window is a window
    while len(times) < reps and clock.left() >= 2 * calls * second:
        times.append(timed(window, device) / calls)
    return statistics.median(times) if times else second  # no window fitted: the sizing call


# ------------------------------------------------------------------------------ parts
TEST_TIMEOUT_S = 120.0
"""A CUDA test running longer is stopped and reported failed by name (``pytest-timeout``): a
kernel whose programs never meet at their barrier would otherwise take the whole budget."""


def test_command(quick: bool) -> list[str]:
    """The ``pytest`` command of the ``tests`` part: the CUDA-named cases and the fused-kernel
    tests (which run compiled on CUDA), verbose, so a run the budget stops still says what
    passed; over several workers where ``pytest-xdist`` is installed (the kernels' compiles,
    most of the part's time, run side by side), and each test under :data:`TEST_TIMEOUT_S`
    where ``pytest-timeout`` is (its worker is ended and the test reported; another worker
    takes the rest). ``quick``: only collect ``tests/test_devices.py``'s cases."""
    command = [sys.executable, "-m", "pytest", "-v", "--tb=line", "-k", "cuda or triton_kernels"]
    command += ["-p", "no:cacheprovider"]
    if quick:  # the subprocess and the parsing, in seconds
        return [*command, "--collect-only", "tests/test_devices.py"]
    if _installed("xdist"):
        command += ["-n", str(max(1, min(8, os.cpu_count() or 1)))]
    if _installed("pytest_timeout"):
        # "thread" ends a hung test's process: a GPU kernel cannot be interrupted otherwise
        command += [f"--timeout={TEST_TIMEOUT_S:.0f}", "--timeout-method=thread"]
    return command


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def part_tests(device: torch.device, sizes: Sizes, clock: Clock, quick: bool) -> dict:
    """Run the CUDA cases of the test suite in a subprocess (:func:`test_command`)."""
    command = test_command(quick)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("TRITON_INTERPRET", None)  # the GPU cases run the compiled kernels
    try:
        done = subprocess.run(
            command,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=max(clock.left(), 5.0),
        )
        output, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as err:
        text = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        ended = tests_ended(text)
        counts = ", ".join(f"{len(v)} {k.lower()}" for k, v in ended.items() if v)
        return {
            "command": " ".join(command[2:]),
            "returncode": None,
            "summary": f"stopped by the time budget after {clock.budget:.0f} s"
            + (f" ({counts} by then)" if counts else ""),
            "failed": [
                f"{outcome} {name}" for outcome in ("FAILED", "ERROR") for name in ended[outcome]
            ],
        }
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return {
        "command": " ".join(command[2:]),
        "returncode": rc,
        "summary": lines[-1].strip("= ") if lines else "",
        "failed": [line for line in lines if line.startswith(("FAILED", "ERROR"))],
        "output_tail": lines[-80:],  # the failures' one-line tracebacks, for the JSON
    }


def tests_ended(verbose_output: str) -> dict[str, list[str]]:
    """The tests a ``pytest -v`` output says have ended, by outcome (``PASSED``, ``FAILED``,
    ``ERROR``, ``SKIPPED``): ``tests/x.py::name[id] PASSED  [ 5%]`` lines, or with
    ``pytest-xdist`` ``[gw0] [  5%] PASSED tests/x.py::name[id]``."""
    ended: dict[str, list[str]] = {k: [] for k in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    for line in verbose_output.splitlines():
        words = line.split()
        outcome = next((w for w in words if w in ended), None)
        name = next((w for w in words if "::" in w), None)
        if outcome is not None and name is not None and not line.startswith(outcome):
            ended[outcome].append(name)
    return ended


def _target(
    name: str, x_lstm: float | None, x_gru: float | None, ms: float, loop_ms: float | None = None
) -> str:
    """The target for core ``name`` at its best time ``ms`` (ratios to cuDNN
    ``x_lstm``/``x_gru``), marked ``ok`` or ``MISS``. A core without a fused kernel or a scan
    must be 5x faster than its step loop: ``loop_ms``, the eager loop timed in the same run
    (where the better time is another path's), or the recorded H100 baseline. Against a
    baseline range, without a same-run loop that settles it, the mark is ``ok`` only below
    the range's low end over 5 and ``MISS`` only above its high end over 5, ``?`` between."""
    if name in LSTM_PRESETS and x_lstm is not None:
        return f"{'ok' if x_lstm <= 2 else 'MISS'} <=2x nn.LSTM"
    if name in GRU_PRESETS and x_gru is not None:
        return f"{'ok' if x_gru <= 2 else 'MISS'} <=2x nn.GRU"
    if name == "slstm" and x_lstm is not None:
        return f"{'ok' if x_lstm <= 3 else 'MISS'} <=3x nn.LSTM"
    if name in H100_BASELINE_MS and name not in (*GRU_PRESETS, *SCAN_CORES):
        low, high = H100_BASELINE_MS[name]
        own = loop_ms / ms if loop_ms is not None and loop_ms > ms else 0.0
        if own >= OTHER_SPEEDUP or ms <= low / OTHER_SPEEDUP:
            verdict = "ok"
        elif ms > high / OTHER_SPEEDUP:
            verdict = "MISS"
        else:
            verdict = "?"
        return f"{verdict} >={OTHER_SPEEDUP:.0f}x faster than its step loop"
    return ""


def _baseline(name: str) -> str:
    if name not in H100_BASELINE_MS:
        return "-"
    low, high = H100_BASELINE_MS[name]
    return f"{low:g}" if low == high else f"{low:g}-{high:g}"


def graph_safe_cores() -> list[str]:
    """The registered cores that declare ``graph_safe`` (timed with and without graphs)."""
    from cores import CORES, make_core

    return sorted(name for name in CORES if make_core(name, 4, 4).graph_safe)


def part_cores(device: torch.device, sizes: Sizes, clock: Clock, quick: bool) -> dict:
    """Forward+backward ms of every core beside ``nn.LSTM`` and ``nn.GRU``; the ``graph_safe``
    cores also through CUDA graphs (``ms_graphed``), the better time (``best_ms``) counting
    for the ratios and targets."""
    from cores import CORES

    T, B, D, H = sizes.cores
    capturable = set(graph_safe_cores())
    warmed = warm_part(cores_launches(device, sizes), device, clock.left())
    ms: dict[str, float] = {}
    ms_graphed: dict[str, float] = {}
    errors: dict[str, str] = {}
    not_measured = []
    ms_unsplit: dict[str, float] = {}
    baseline_runs: dict[str, list[float]] = {name: [] for name in BASELINES}
    again = [(name, "") for name in BASELINES]  # the baselines, re-timed to show drift
    cells = [*again, *[(name, "") for name in sorted(CORES)], *again]
    cells += [(name, GRAPHED) for name in sorted(capturable)]  # after every eager time
    if device.type == "cuda":
        cells += [(name, UNSPLIT) for name in SPLIT_CORES if name in CORES]
    cells += again
    for name, variant in cells:
        label = name + variant
        if clock.left() <= 0:
            if label not in not_measured:
                not_measured.append(label)
            continue
        try:
            with split_off(variant == UNSPLIT):
                run = core_runner(name, T, B, D, H, device, variant == GRAPHED)
                seconds = time_runner(run, device, sizes.reps, clock)
            value = 1e3 * seconds
            if name in baseline_runs:  # a baseline's row is the median of its timings so far
                baseline_runs[name].append(value)
                value = statistics.median(baseline_runs[name])
            {"": ms, GRAPHED: ms_graphed, UNSPLIT: ms_unsplit}[variant][name] = value
        except Exception as err:  # one broken core must not stop the run
            errors[label] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
        finally:
            run = None
            if device.type == "cuda":
                torch.cuda.empty_cache()  # the graphs' memory pools
    rows = []
    for name, value in ms.items():
        best = min(value, ms_graphed.get(name, math.inf))
        x_lstm = best / ms["nn.LSTM"] if "nn.LSTM" in ms else None
        x_gru = best / ms["nn.GRU"] if "nn.GRU" in ms else None
        low_high = H100_BASELINE_MS.get(name)
        rows.append(
            {
                "core": name,
                "ms": value,
                "ms_graphed": ms_graphed.get(name),
                "ms_unsplit": ms_unsplit.get(name),
                "best_ms": best,
                "x_nn_lstm": x_lstm,
                "x_nn_gru": x_gru,
                "h100_baseline_ms": low_high,
                "x_faster": None if low_high is None else (low_high[0] / best, low_high[1] / best),
                "x_own_loop": value / best if best < value else None,
                "target": _target(name, x_lstm, x_gru, best, value),
            }
        )
    return {
        "shape": dict(T=T, B=B, D=D, H=H),
        "rows": rows,
        "baseline_runs": baseline_runs,
        "errors": errors,
        "not_measured": not_measured,
        "tile_cuts": _tile_cuts(),
        "warm": warmed,
    }


def cores_launches(device: torch.device, sizes: Sizes) -> list[Launch]:
    """The forward+backward launches of the cores part's cells: every core at the table's
    shape, and on CUDA the split cores with their unit split off (the CUDA-graph cells launch
    the eager cells' kernels)."""
    from cores import CORES

    launches = [Launch(name, sizes.cores) for name in sorted(CORES)]
    if device.type == "cuda":
        launches += [Launch(name, sizes.cores, unsplit=True) for name in SPLIT_CORES]
    return launches


UNSPLIT = " (unsplit)"
"""Suffix of a cores cell timed with the fused kernels' unit split off."""


@contextlib.contextmanager
def split_off(off: bool) -> Iterator[None]:
    """Within the block, with ``off``, the fused kernels run one program per batch tile."""
    from cores import triton_gates

    before = os.environ.get(triton_gates.SPLIT_ENV)
    if off:
        os.environ[triton_gates.SPLIT_ENV] = "0"
    try:
        yield
    finally:
        if off:
            if before is None:
                os.environ.pop(triton_gates.SPLIT_ENV, None)
            else:
                os.environ[triton_gates.SPLIT_ENV] = before


def _tile_cuts() -> list[dict[str, Any]]:
    """The tile cut the tuner kept for each fused kernel and shape (cores/triton_tune.py)."""
    from cores import triton_tune

    return [
        {"kernel": key[0], "int_args": [a for a in key[2] if isinstance(a, int)], **cut}
        for key, cut in triton_tune.chosen().items()
    ]


def part_scaling(device: torch.device, sizes: Sizes, clock: Clock, quick: bool) -> dict:
    """Forward+backward ms against T; cells in order of T, so the budget cuts the longest."""
    B, H = sizes.scaling_b_h
    graphed = [name + GRAPHED for name in GRAPH_SCALING]
    names = ["nn.LSTM", *SCAN_CORES, *LOOP_CORES, *GRAPH_SCALING, *graphed]
    lengths = {name: sizes.loop_lengths for name in names}
    lengths.update({name: sizes.scan_lengths for name in (*SCAN_CORES, "nn.LSTM")})
    last = {*GRAPH_SCALING, *graphed}
    cells = sorted((T, name) for name in names if name not in last for T in lengths[name])
    cells += sorted((T, name) for name in last for T in lengths[name])
    ms: dict[str, dict[int, float]] = {name: {} for name in names}
    errors: dict[str, str] = {}
    not_measured = []
    for T, name in cells:
        if name in errors:
            continue
        if clock.left() <= 0:
            not_measured.append(f"{name} T={T}")
            continue
        try:
            core, graph = name.removesuffix(GRAPHED), name.endswith(GRAPHED)
            run = core_runner(core, T, B, 64 if not quick else 8, H, device, graph)
            ms[name][T] = 1e3 * time_runner(run, device, max(1, sizes.reps - 1), clock)
        except Exception as err:
            errors[name] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
        finally:
            run = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    first, last = sizes.scan_lengths[0], sizes.scan_lengths[-1]
    rows = []
    for name in names:
        growth = ms[name][last] / ms[name][first] if {first, last} <= ms[name].keys() else None
        target = ""
        if name in SCAN_CORES and growth is not None:
            target = f"{'ok' if growth <= 8 else 'MISS'} <=8x"
        rows.append({"core": name, "ms": ms[name], "growth": growth, "target": target})
    return {
        "B": B,
        "H": H,
        "lengths": list(sizes.scan_lengths),
        "rows": rows,
        "errors": errors,
        "not_measured": not_measured,
    }


def _rl_config(path: str, overrides: list[str]) -> Any:
    from agents.rl_config import RLConfig
    from experiments.config import load_config

    fixed = ["train.progress=false", "train.histogram_every=0", "run.tensorboard=false"]
    return load_config(RLConfig, path, [*overrides, *fixed])


def part_acting(device: torch.device, sizes: Sizes, clock: Clock, quick: bool) -> dict:
    """Microseconds per acting step of the MemoryS7 policy on the CPU and on ``device``, with
    the config's torch threads (as the trainer acts)."""
    config = _rl_config(MEMORY_S7, list(sizes.rl_overrides))
    threads = torch.get_num_threads()
    if config.train.threads > 0:
        torch.set_num_threads(config.train.threads)
    try:
        return _acting_rows(device, sizes, clock, config)
    finally:
        torch.set_num_threads(threads)


def graphed_acting_step(
    policy: torch.nn.Module,
    obs: dict[str, np.ndarray],
    device: torch.device,
    recorder: Any = None,
) -> Callable[[], np.ndarray]:
    """One acting step of ``policy`` on ``device`` as ``train.graph_acting`` takes it
    (:class:`agents.acting_graph.ActingGraph`): the observations from NumPy, the replay of
    the forward, the action sampling and the state update, the actions back to NumPy. Warmed
    up and recorded before it is returned; each call reads the arrays of ``obs`` (refill them
    in place) and carries the state.

    :param recorder: CUDA graphs (default), or the tests' eager recorder on any device.
    :raises ValueError: ``device`` is not a CUDA device and no recorder is given.
    """
    from agents.acting_graph import ActingGraph
    from agents.graph_recording import CudaRecorder
    from agents.policy import obs_to_tensors

    if recorder is None:
        if device.type != "cuda":
            raise ValueError(f"a CUDA graph needs a CUDA device, got {device}")
        recorder = CudaRecorder()
    n = len(next(iter(obs.values())))
    acting = ActingGraph(policy, recorder)
    state = tuple(s.clone() for s in policy.initial_state(n, device))
    starts = torch.zeros(n, dtype=torch.bool, device=device)

    def step() -> np.ndarray:
        """Read ``obs`` (the same dict, refilled by the caller), act: actions ``[n]``."""
        out = acting(obs_to_tensors(obs, device), state, starts)
        for s, new in zip(state, out.state, strict=True):
            s.copy_(new)
        return out.actions.cpu().numpy()

    for _ in range(acting.warmup_calls + 1):  # the warm-up steps and the recording
        step()
    if acting.failure is not None:
        raise RuntimeError(acting.failure)
    return step


def _acting_rows(device: torch.device, sizes: Sizes, clock: Clock, config: Any) -> dict:
    from agents.policy import build_policy, obs_to_tensors, sample_actions

    rows, not_measured = [], []
    torch.manual_seed(0)  # MemoryS7: 7 actions, a 7x7x3 view (its mission is not read)
    cpu_policy = build_policy(config, 7, (7, 7, 3)).eval()
    policies = {"cpu": cpu_policy}
    if device.type != "cpu":
        policies[str(device)] = build_policy(config, 7, (7, 7, 3)).to(device).eval()
    rng = np.random.default_rng(0)
    for n in sizes.acting_envs:
        if clock.left() <= 0:
            not_measured.append(n)
            continue
        obs = {
            "image": rng.integers(0, 6, (n, 7, 7, 3), dtype=np.uint8),
            "direction": rng.integers(0, 4, n),
        }
        row: dict[str, Any] = {"n_envs": n}
        for where, policy in policies.items():
            dev = torch.device(where)
            state = policy.initial_state(n, dev)
            starts = torch.zeros(1, n, dtype=torch.bool, device=dev)

            def step(policy=policy, dev=dev, state=state, starts=starts, obs=obs) -> None:
                with torch.no_grad():
                    out = policy(obs_to_tensors(obs, dev), state, starts)
                    sample_actions(out.logits[0])[0].cpu().numpy()

            step()  # warm-up
            start = time.perf_counter()
            for _ in range(sizes.acting_steps):
                step()
            row[f"us_{'cpu' if where == 'cpu' else 'device'}"] = (
                1e6 * (time.perf_counter() - start) / sizes.acting_steps
            )
        if device.type == "cuda":  # the same step on the GPU as one CUDA graph replay
            try:
                step = graphed_acting_step(policies[str(device)], obs, device)
                step()
                start = time.perf_counter()
                for _ in range(sizes.acting_steps):
                    step()
                row["us_graphed"] = 1e6 * (time.perf_counter() - start) / sizes.acting_steps
            except Exception as err:  # a step that cannot be captured is a result too
                row["graphed_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
        row["rule"] = str(acting_device(device, n))
        if "us_device" in row:
            row["faster"] = "cpu" if row["us_cpu"] <= row["us_device"] else str(device)
        rows.append(row)
    crossover = next((r["n_envs"] for r in rows if r.get("faster", "cpu") != "cpu"), None)
    return {"rows": rows, "crossover_n_envs": crossover, "not_measured": not_measured}


def rl_rate(path: str, overrides: list[str], device: str, epochs: int | None) -> dict[str, Any]:
    """Frames/s of ``path``'s PPO recipe on ``device``: one timed rollout, the update timed over
    ``epochs`` of its epochs (after a warm-up epoch off the CPU) and scaled to all of them.

    It acts and updates as the trainer does with the config: through an acting graph where
    ``train.graph_acting`` resolves on, and replaying the update's minibatch steps from an
    update graph where ``train.graph_update`` does (on a GPU by default), each warmed up and
    recorded (and the update's recording checked) before the timing; CUDA graphs on a GPU,
    and where the tests turn them on on a CPU, which has none, the same bookkeeping run
    eagerly."""
    from agents.acting_graph import ActingGraph
    from agents.graph_recording import CudaRecorder, EagerRecorder
    from agents.policy import obs_to_tensors
    from agents.ppo import update
    from agents.rl_trainer import (
        acting_policy,
        collect_with_returns,
        obs_shapes,
        setup,
        start_rollouts,
    )
    from agents.rollout import RolloutBuffer
    from agents.update_graph import UpdateGraph

    s = setup(_rl_config(path, [*overrides, f"train.device={device}"]))
    cfg, agent = s.config, s.config.agent
    n_envs, n_steps = cfg.env.n_envs, agent.n_steps
    cuda = s.device.type == "cuda"
    try:
        act_graphed = s.graph_acting
        acting = acting_policy(s.policy, s.device, n_envs=n_envs, graphed=act_graphed)
        act_device = next(acting.parameters()).device
        buffer = RolloutBuffer(
            obs_shapes(s.envs.single_observation_space),
            n_steps,
            n_envs,
            agent.seq_len,
            acting.initial_state(n_envs, act_device),
            act_device,
        )
        carry = start_rollouts(acting, s.envs, cfg.train.seed, act_device)
        acting_graph = update_graph = None
        if s.graph_update:
            update_graph = UpdateGraph(CudaRecorder() if cuda else EagerRecorder())
        if act_graphed:
            acting_graph = ActingGraph(acting, CudaRecorder() if cuda else EagerRecorder())
            obs = obs_to_tensors(carry.obs, act_device)
            for _ in range(acting_graph.warmup_calls + 1):  # warm-up steps and the recording
                acting_graph(obs, carry.state, carry.starts)
        acted = 0 if acting_graph is None else acting_graph.replays
        collect = timed(
            lambda: collect_with_returns(acting, s.envs, buffer, carry, agent, None, acting_graph),
            s.device,
        )
        timed_epochs = agent.n_epochs if epochs is None else min(epochs, agent.n_epochs)
        if cuda or update_graph is not None:  # compiling, autotuning, recording, its check
            warm_epochs = (
                1 if update_graph is None else _epochs_to_record(agent, n_envs, update_graph)
            )
            warm = dataclasses.replace(agent, n_epochs=warm_epochs)
            timed(lambda: update(s.policy, s.optimizer, buffer, warm, graph=update_graph), s.device)
        part = dataclasses.replace(agent, n_epochs=timed_epochs)
        replays = 0 if update_graph is None else update_graph.replays
        upd = timed(
            lambda: update(s.policy, s.optimizer, buffer, part, graph=update_graph), s.device
        )
        upd *= agent.n_epochs / timed_epochs
    finally:
        s.envs.close()
    frames = n_envs * n_steps
    out = {
        "fps": frames / (collect + upd),
        "collect_s": collect,
        "update_s": upd,
        "epochs_timed": f"{timed_epochs}/{agent.n_epochs}",
        "acting": describe_acting(s.device, n_envs, graphed=act_graphed),
        "threads": torch.get_num_threads(),
    }
    if acting_graph is not None or update_graph is not None:
        acted = None if acting_graph is None else acting_graph.replays - acted
        updated = None if update_graph is None else update_graph.replays - replays
        out["graph"] = _graph_summary(acting_graph, acted, update_graph, updated)
    return out


def _epochs_to_record(agent: Any, n_envs: int, graph: Any) -> int:
    """Update epochs that take ``graph``'s warm-up steps and its recording."""
    chunks = n_envs * agent.n_steps // agent.seq_len
    per_minibatch = max(1, agent.minibatch_size // agent.seq_len)
    full_minibatches = max(1, chunks // per_minibatch)  # a smaller last one is not recorded
    return math.ceil((graph.warmup_steps + 1) / full_minibatches)


def _graph_summary(acting: Any, acted: int | None, update: Any, replays: int | None) -> str:
    """How the timed rollout and update ran with their graphs (``acted`` and ``replays``:
    the steps they replayed; ``acting`` or ``update`` None: run eagerly)."""
    if acting is None:
        acted_line = "acting eager"
    elif acting.failure is not None:
        acted_line = f"acting eager (recording failed: {acting.failure})"
    else:
        acted_line = f"acting {acted} steps replayed"
    if update is None:
        updated = "update eager"
    elif update.failure is not None:
        updated = f"update eager ({update.failure})"
    elif update.refused is not None:
        updated = f"update eager ({update.refused})"
    else:
        updated = f"update {replays} steps replayed"
    return f"{acted_line}; {updated}"


def part_rl(device: torch.device, sizes: Sizes, clock: Clock, quick: bool) -> dict:
    """RL frames/s on ``device`` against the CPU, per setting, each acting and updating as the
    trainer does by default. The ``eager update`` rows (``train.graph_update=false``) time the
    device only: their CPU side is the row above theirs."""
    envs = (8, 64) if not quick else (2,)
    # (label, config, overrides, epochs timed, followed by an eager-update row)
    plain = [
        (
            f"MemoryS7 lstm, {n} envs",
            MEMORY_S7,
            [f"env.n_envs={n}", *sizes.rl_overrides],
            None,
            True,
        )
        for n in envs
    ]
    plain += [
        (
            f"POPGym RepeatPreviousEasy {core}",
            POPGYM,
            [f"core.name={core}", *sizes.popgym_overrides],
            1,
            core in POPGYM_EAGER_UPDATE_CORES,
        )
        for core in POPGYM_CORES
    ]
    settings: list[tuple[str, str, list[str], int | None, bool]] = []
    for label, path, overrides, epochs, eager_row in plain:
        settings += [(label, path, overrides, epochs, False)]
        if eager_row:
            eager = [*overrides, "train.graph_update=false"]
            settings += [(f"{label}, {EAGER_UPDATE}", path, eager, epochs, True)]
    rows, not_measured = [], []
    threads = torch.get_num_threads()
    for label, path, overrides, epochs, device_only in settings:
        if clock.left() <= 0:
            not_measured.append(label)
            continue
        row: dict[str, Any] = {"setting": label, "config": path, "overrides": overrides}
        try:
            if device_only:  # the row above measured this CPU
                row["cpu"] = rows[-1]["cpu"]
                row["device"] = rl_rate(path, overrides, str(device), epochs)
            else:
                row["cpu"] = rl_rate(path, overrides, "cpu", epochs)
                on_device = device.type != "cpu"
                row["device"] = (
                    rl_rate(path, overrides, str(device), epochs) if on_device else row["cpu"]
                )
            row["x_cpu"] = row["device"]["fps"] / row["cpu"]["fps"]
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        finally:
            torch.set_num_threads(threads)  # setup() applies each config's train.threads
        rows.append(row)
    return {"rows": rows, "not_measured": not_measured}


def supervised_rate(overrides: list[str], device: str, updates: int, clock: Clock) -> dict:
    """Seconds per update of the copy task on ``device`` (after two warm-up updates)."""
    from agents.supervised import TaskData, prepare, train_step
    from agents.supervised_config import SupervisedConfig
    from experiments.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(
            SupervisedConfig, COPY, [*overrides, f"train.device={device}", f"run.dir={tmp}"]
        )
        prep = prepare(config)
        data = TaskData(prep.task, config.train.batch_size, config.train.seed)
        lr = config.optim.lr

        def one(step: int) -> None:
            train_step(prep, data.train_batch(step), lr, math.inf)

        for step in range(2):
            one(step)
        done, start = 0, time.perf_counter()
        sync(prep.device)
        while done < updates and (done == 0 or clock.left() > 0):
            one(2 + done)
            done += 1
        sync(prep.device)
        seconds = (time.perf_counter() - start) / done
    return {
        "s_per_update": seconds,
        "updates": done,
        "core": config.core.name,
        "threads": torch.get_num_threads(),
    }


def part_supervised(device: torch.device, sizes: Sizes, clock: Clock, quick: bool) -> dict:
    """Copy T=200, hidden 128, batch 256: seconds per update on the CPU and on ``device``."""
    overrides = list(sizes.supervised_overrides)
    threads = torch.get_num_threads()
    try:
        half = Clock(max(clock.left() / 2, 1.0))
        cpu = supervised_rate(overrides, "cpu", sizes.supervised_updates, half)
        dev = (
            cpu
            if device.type == "cpu"
            else supervised_rate(overrides, str(device), sizes.supervised_updates, clock)
        )
    finally:
        torch.set_num_threads(threads)
    return {
        "config": COPY,
        "overrides": overrides,
        "cpu": cpu,
        "device": dev,
        "x_cpu": cpu["s_per_update"] / dev["s_per_update"],
    }


def part_probe(device: torch.device, sizes: Sizes, clock: Clock, quick: bool) -> dict:
    """The unit-split kernels' variants (:func:`experiments.bench.split_probe.part_probe`)."""
    from experiments.bench import split_probe

    return split_probe.part_probe(device, sizes, clock, quick)


RUNNERS: dict[str, Callable[[torch.device, Sizes, Clock, bool], dict]] = {
    "tests": part_tests,
    "cores": part_cores,
    "scaling": part_scaling,
    "acting": part_acting,
    "rl": part_rl,
    "supervised": part_supervised,
    "probe": part_probe,
}


# ------------------------------------------------------------------------------ output
def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _md_header(results: dict[str, Any]) -> list[str]:
    """The title, the hardware and the command."""
    hw = results["hardware"]
    return [
        "# memcores bench gpu",
        "",
        f"Device {hw['device']}"
        + (f" ({hw['gpu']}, CUDA {hw['cuda']})" if "gpu" in hw else "")
        + f"; CPU {hw['cpu']} x {hw['cpu_count']}; torch {hw['torch']}; triton {hw['triton']}.",
        f"Command: `{results['command']}`.",
    ]


def _md_tests(t: dict[str, Any]) -> list[str]:
    """The CUDA tests part: the command, its summary and any failures."""
    lines = ["", "## CUDA tests", "", f"`{t['command']}`: {t['summary']}"]
    lines += [f"- {line}" for line in t["failed"]]
    return lines


def _md_cores(c: dict[str, Any]) -> list[str]:
    """The cores part: one row per core, forward+backward."""
    shape = c["shape"]
    lines = [
        "",
        f"## Cores, forward+backward, T={shape['T']} B={shape['B']} input {shape['D']} "
        f"hidden {shape['H']}",
        "",
        "Capturable cores also through CUDA graphs; ratios and targets use the better "
        "time. The fused Triton kernels also with their unit split off "
        "(MEMCORES_TRITON_SPLIT=0). The 5x target is read against the core's eager step "
        "loop in this run (x own loop, where a CUDA graph is faster) and against the step "
        "loops' H100 baseline (PyTorch 2.11, CUDA 13; where it is a group's range, so is "
        "the x faster column).",
        "",
        *_baseline_spread(c.get("baseline_runs", {})),
        "| core | ms | ms, CUDA graph | ms, unsplit | x nn.LSTM | x nn.GRU | H100 baseline ms "
        "| x faster | x own loop | target |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in c["rows"]:
        graphed = "-" if r.get("ms_graphed") is None else f"{r['ms_graphed']:.2f}"
        unsplit = "-" if r.get("ms_unsplit") is None else f"{r['ms_unsplit']:.2f}"
        faster = r.get("x_faster")
        speedup = (
            "-"
            if faster is None
            else f"{faster[0]:.1f}x"
            if faster[0] == faster[1]
            else f"{faster[0]:.1f}-{faster[1]:.1f}x"
        )
        lines.append(
            f"| {r['core']} | {r['ms']:.2f} | {graphed} | {unsplit} | {_x(r['x_nn_lstm'])} "
            f"| {_x(r['x_nn_gru'])} | {_baseline(r['core'])} | {speedup} "
            f"| {_x(r.get('x_own_loop'))} | {r['target']} |"
        )
    return lines + warm_markdown(c.get("warm"))


def _baseline_spread(runs: dict[str, list[float]]) -> list[str]:
    """One line naming each baseline's timings across the part (their median is the row)."""
    timings = [
        f"{name} " + " / ".join(f"{ms:.2f}" for ms in values) + " ms"
        for name, values in runs.items()
        if values
    ]
    if not timings:
        return []
    return [f"Baselines timed before, between and after the cores: {'; '.join(timings)}.", ""]


def _md_scaling(s: dict[str, Any]) -> list[str]:
    """The scaling part: each core's cost at each sequence length."""
    head = " | ".join(f"T={T}" for T in s["lengths"])
    lines = [
        "",
        f"## Cost against T, forward+backward ms, B={s['B']} hidden {s['H']}",
        "",
        f"| core | {head} | T={s['lengths'][-1]} / T={s['lengths'][0]} | target |",
        "|---|" + "---|" * (len(s["lengths"]) + 2),
    ]
    for r in s["rows"]:
        cells = " | ".join(f"{r['ms'][T]:.2f}" if T in r["ms"] else "-" for T in s["lengths"])
        lines.append(f"| {r['core']} | {cells} | {_x(r['growth'])} | {r['target']} |")
    return lines


def _md_acting(a: dict[str, Any]) -> list[str]:
    """The acting part: one row per n_envs, then the crossover."""
    lines = [
        "",
        "## Acting step (MemoryS7 policy), microseconds",
        "",
        "| n_envs | CPU | device | device, CUDA graph | faster | trainer's rule |",
        "|---|---|---|---|---|---|",
    ]
    for r in a["rows"]:
        dev = f"{r['us_device']:.0f}" if "us_device" in r else "-"
        graphed = f"{r['us_graphed']:.0f}" if "us_graphed" in r else "-"
        if "graphed_error" in r:
            graphed = f"not captured ({r['graphed_error']})"
        lines.append(
            f"| {r['n_envs']} | {r['us_cpu']:.0f} | {dev} | {graphed} "
            f"| {r.get('faster', '-')} | {r['rule']} |"
        )
    lines.append(f"\nFirst n_envs where the device is faster: {a['crossover_n_envs']}.")
    return lines


def _md_rl(rl: dict[str, Any]) -> list[str]:
    """The RL part: frames/s per setting, device against CPU."""
    lines = [
        "",
        "## RL frames/s, device against the same machine's CPU",
        "",
        "| setting | CPU frames/s | device frames/s | x CPU | device: collect s / update s "
        "| epochs timed | acting |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rl["rows"]:
        if "error" in r:
            lines.append(f"| {r['setting']} | error: {r['error']} | | | | | |")
            continue
        d = r["device"]
        acting = d["acting"] + (f"; {d['graph']}" if "graph" in d else "")
        lines.append(
            f"| {r['setting']} | {r['cpu']['fps']:.0f} | {d['fps']:.0f} | {_x(r['x_cpu'])} "
            f"| {d['collect_s']:.2f} / {d['update_s']:.2f} | {d['epochs_timed']} "
            f"| {acting} |"
        )
    return lines


def _md_supervised(s: dict[str, Any]) -> list[str]:
    """The supervised part: seconds per update, device against CPU."""
    return [
        "",
        f"## Supervised copy ({s['config']} {' '.join(s['overrides'])}), core {s['cpu']['core']}",
        "",
        "| | s per update | updates timed |",
        "|---|---|---|",
        f"| CPU ({s['cpu']['threads']} threads) | {s['cpu']['s_per_update']:.3f} "
        f"| {s['cpu']['updates']} |",
        f"| device | {s['device']['s_per_update']:.3f} | {s['device']['updates']} |",
        f"\nDevice against CPU: {_x(s['x_cpu'])}.",
    ]


def _md_not_measured(parts: dict[str, Any]) -> list[str]:
    """What the time budget skipped and what failed, if anything."""
    skipped = {k: v["not_measured"] for k, v in parts.items() if v.get("not_measured")}
    errors = {k: v["errors"] for k, v in parts.items() if v.get("errors")}
    if not (skipped or errors):
        return []
    lines = ["", "## Not measured", ""]
    lines += [f"- {k} (time budget): {', '.join(map(str, v))}" for k, v in skipped.items()]
    lines += [f"- {k}: {n}: {e}" for k, v in errors.items() for n, e in v.items()]
    return lines


def _md_probe(part: dict[str, Any]) -> list[str]:
    from experiments.bench import split_probe

    return split_probe.markdown(part)


# Each report part's renderer, in the order the parts appear in the report.
_MD_PARTS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "tests": _md_tests,
    "cores": _md_cores,
    "scaling": _md_scaling,
    "acting": _md_acting,
    "rl": _md_rl,
    "supervised": _md_supervised,
    "probe": _md_probe,
}


def markdown(results: dict[str, Any]) -> str:
    """The results as markdown: the hardware, then one section per part that ran."""
    lines = _md_header(results)
    parts = results["parts"]
    for name, render in _MD_PARTS.items():
        if name in parts and "hung" in parts[name]:  # :func:`watchdog` stopped the run here
            lines += ["", f"## {name}", "", parts[name]["hung"]]
        elif name in parts:
            lines += render(parts[name])
    lines += _md_not_measured(parts)
    return "\n".join(lines) + "\n"


def hang_limit(budget: float) -> float:
    """Seconds after which a part that has not returned is taken for hung: twice its budget
    and a minute (a part checks its clock between measurements, so one measurement may
    overrun the budget by its own length, but not by this much)."""
    return 2.0 * budget + 60.0


def _write(results: dict[str, Any], out: Path) -> None:
    (out / "bench_gpu.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "bench_gpu.md").write_text(markdown(results))


@contextlib.contextmanager
def watchdog(
    name: str, seconds: float, results: dict[str, Any], out: Path,
    stop: Callable[[int], Any] = os._exit,
) -> Iterator[None]:  # fmt: skip
    """Stop the run if part ``name`` has not returned after ``seconds``: its entry says so,
    the results written so far stay written, and the process exits with code 3 (``stop``).

    A GPU kernel that never returns (e.g. programs that never meet at their barrier) cannot
    be interrupted from Python, and would hold the machine until the caller's own limit; this
    way the run ends early with what it measured and the hung part named."""

    def give_up() -> None:
        hung = f"did not return within {seconds:.0f} s (taken for hung); the run stopped here"
        print(f"  {name}: {hung}", flush=True)
        try:
            results["parts"][name] = {"hung": hung, "seconds": seconds}
            _write(results, out)
        finally:
            stop(3)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@contextlib.contextmanager
def _quiet_warnings() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="memcores bench gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/bench_gpu", help="folder for the JSON and markdown")
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N (default cuda)")
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (a check that every part runs)"
    )
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated parts to run (default: {','.join(PARTS)}; also: "
        f"{','.join(EXTRA_PARTS)})",
    )
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    budgets = {**PARTS, **EXTRA_PARTS}
    unknown = [p for p in parts if p not in budgets]
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(unknown)}; valid: {', '.join(budgets)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            "bench gpu needs a CUDA GPU and none is available "
            "(--device cpu --quick checks the script on the CPU)"
        )
    device = resolve_device(args.device)
    sizes = QUICK if args.quick else Sizes()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "command": "memcores bench gpu " + " ".join(argv),
        "hardware": info(device),
        "budgets_s": {p: budgets[p] for p in parts},
        "parts": {},
    }
    print(f"bench gpu: device {device}, parts {', '.join(parts)}; writing {out}", flush=True)
    carry = 0.0
    with _quiet_warnings():
        for name in parts:
            clock = Clock(budgets[name] + carry)
            with watchdog(name, hang_limit(clock.budget), results, out):
                result = RUNNERS[name](device, sizes, clock, args.quick)
            result["seconds"] = clock.spent()
            carry = max(clock.left(), 0.0)
            results["parts"][name] = result
            _write(results, out)
            print(f"  {name}: {result['seconds']:.1f} s", flush=True)
    print()
    print(markdown(results))
    print(f"wrote {out / 'bench_gpu.json'} and {out / 'bench_gpu.md'}")
    tests = results["parts"].get("tests")
    # pytest's 5: no test selected (a machine where no test names CUDA)
    return 1 if tests and tests.get("returncode") not in (0, 5, None) else 0
