"""``memcores bench gpu --out DIR``: the GPU's speed, measured in one run and written as a record.

Parts, each with a time budget (:data:`PARTS`; what does not fit is listed as not measured):
``cores`` (forward+backward of every core at T=256, B=64, D=64, H=128 beside cuDNN's
``nn.LSTM``/``nn.GRU``, the ``graph_safe`` ones also through CUDA graphs, against the committed
record ``--against``), ``scaling`` (time against T), ``acting`` (a MemoryS7 acting step on the
CPU, the GPU and its acting graph), ``rl`` (PPO frames/s, GPU against CPU; with batched envs,
against the other rows) and ``supervised``
(copy task, seconds per update). ``DIR/bench_gpu.json`` and ``.md`` are rewritten after each
part. Without a GPU it exits with code 2 (``--device cpu --quick``: the script at tiny sizes).
The CUDA tests run as ``pytest -m cuda``, not from here.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memcores.agents.device import acting_device, describe_acting, info, resolve_device, sync
from memcores.cores import presets_of
from memcores.experiments.bench.gpu_report import markdown

REPO = Path(__file__).resolve().parents[2]
MEMORY_S7 = "experiments/configs/memory_s7.yaml"
POPGYM = "experiments/configs/sweep_popgym.yaml"
PASSIVE = "experiments/configs/passive_visual_match.yaml"
COPY = "experiments/configs/copy.yaml"
RECORD = "results/bench_gpu/h100/bench_gpu.json"  # the default --against
POPGYM_CORES = ("gru", "lstm", "ur_lstm", "min_gru")
ENV_STEP_GRAPH = "train.graph_env_step=true"  # agents.rollout_graph (off by default)
# the RL rows timed again on the GPU with train.graph_update=false
EAGER_ROWS = ("MemoryS7 lstm, 8 envs", "MemoryS7 lstm, 64 envs", "POPGym ur_lstm")
SCAN_CORES = ("lru", "min_gru", "min_lstm", "mlstm")
LOOP_CORES = ("lstm", "gru", "ur_lstm", "slstm")
GRAPH_SCALING = ("janet",)  # step-loop cores timed against T eagerly and through graphs
BASELINES = ("nn.LSTM", "nn.GRU")
GRAPHED = " (CUDA graph)"  # suffix of a row timed through GraphedCore
OWN_LOOP_SPEEDUP = 5.0  # target of a step-loop core through graphs against its eager loop
LSTM_PRESETS = frozenset(presets_of("memcores.cores.gated:GatedLSTM"))
GRU_PRESETS = frozenset(presets_of("memcores.cores.gru:GatedGRU"))
PARTS: dict[str, float] = dict(cores=90.0, scaling=30.0, acting=5.0, rl=120.0, supervised=20.0)
"""Each part's time budget in seconds (checked between measurements); what a part leaves
goes to the next."""


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The shapes of one run (tiny ones with ``--quick``)."""

    cores: tuple[int, int, int, int] = (256, 64, 64, 128)  # T, B, D, H
    scaling_b_h: tuple[int, int] = (16, 128)
    scan_lengths: tuple[int, ...] = (256, 1024, 4096, 16384)
    loop_lengths: tuple[int, ...] = (256, 1024, 4096)
    reps: int = 3
    window_s: float = 0.02  # calls shorter than this are timed several to a window
    acting_envs: tuple[int, ...] = (8, 64, 256, 1024)
    acting_steps: int = 50
    rl_envs: tuple[int, ...] = (8, 64)
    rl_overrides: tuple[str, ...] = ()
    popgym_overrides: tuple[str, ...] = ()
    # Passive Visual Match with env.vector=batched: (envs, minibatch); 64 x 256 learns on a CPU
    # (results/batched_envs/pvm_recon_d30_batched_n64_mb256_s0), the others keep 4 minibatches
    batched_envs: tuple[tuple[int, int], ...] = ((64, 256), (1024, 32768), (4096, 131072))
    batched_overrides: tuple[str, ...] = ()
    supervised_overrides: tuple[str, ...] = ("core.hidden_size=128", "train.batch_size=256")
    supervised_updates: int = 20


_TINY_RL = ("agent.n_steps=16", "agent.seq_len=16", "core.hidden_size=8")
QUICK = Sizes(
    cores=(8, 2, 8, 8), scaling_b_h=(2, 8), scan_lengths=(16, 64), loop_lengths=(16,), reps=1,
    window_s=0.0, acting_envs=(2, 4), acting_steps=3, rl_envs=(8,),
    rl_overrides=(*_TINY_RL, "agent.minibatch_size=32"),
    popgym_overrides=(*_TINY_RL, "env.n_envs=2", "agent.minibatch_size=16"),
    batched_envs=((4, 128),),
    batched_overrides=(  # a sequence at least the room's memory horizon (32 steps) long
        "agent.n_steps=64", "agent.seq_len=64", "core.hidden_size=8", "agent.n_epochs=1",
    ),
    supervised_overrides=("task.length=10", "core.hidden_size=8", "train.batch_size=8"),
    supervised_updates=2,
)  # fmt: skip


@dataclasses.dataclass
class Clock:
    """A part's deadline: ``budget`` seconds from when it is made."""

    budget: float
    start: float = dataclasses.field(default_factory=time.perf_counter)

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)


def _error(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds of one call of ``fn``, to the end of the kernels it queued on ``device``."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def time_runner(
    run: Callable[[], None], device: torch.device, reps: int, clock: Clock, window_s: float = 0.02
) -> float:
    """Median seconds per call of ``run`` over ``reps`` windows after a warm-up call; a window
    holds as many calls as fill ``window_s``, so one late launch weighs little on a short
    time. Fewer windows where the part's time ends."""
    timed(run, device)  # warm-up
    second = timed(run, device)
    calls = max(1, min(32, int(window_s / max(second, 1e-9))))
    times = [second] if calls == 1 else []  # a call that fills a window is a window
    while len(times) < reps and clock.left() >= 2 * calls * second:
        times.append(timed(lambda: [run() for _ in range(calls)], device) / calls)
    return statistics.median(times) if times else second


def core_runner(
    name: str, T: int, B: int, D: int, H: int, device: torch.device, graph: bool = False
) -> Callable[[], None]:
    """Forward+backward of core ``name`` (or ``nn.LSTM``/``nn.GRU``) on a seeded ``[T, B, D]``
    input; with ``graph``, through ``GraphedCore`` (an error where its recording fails)."""
    from memcores.cores import make_core
    from memcores.cores.graphed import GraphedCore
    from memcores.experiments.bench.cores import _runner

    x = torch.randn(T, B, D, generator=torch.Generator().manual_seed(0)).to(device)
    torch.manual_seed(0)
    if name in BASELINES:
        rnn = (torch.nn.LSTM if name == "nn.LSTM" else torch.nn.GRU)(D, H).to(device)
        return _runner(rnn, x, lambda x: rnn(x)[0])
    core = make_core(name, D, H).to(device).train()
    module = GraphedCore(core) if graph else core
    run = _runner(module, x, lambda x: module(x, module.initial_state(B, device))[0])

    def checked() -> None:
        run()
        if graph and module.capture_error is not None:  # eager, not a graph's time
            raise RuntimeError(module.capture_error)

    return checked


def _time_cell(
    name: str, shape: tuple[int, ...], device: torch.device, graph: bool, sizes: Sizes, clock: Clock
) -> float:
    """Milliseconds of :func:`core_runner`'s call, its CUDA memory given back after."""
    run = core_runner(name, *shape, device, graph)
    try:
        return 1e3 * time_runner(run, device, sizes.reps, clock, sizes.window_s)
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the graphs' memory pools


def graph_safe_cores() -> list[str]:
    """The registered cores that declare ``graph_safe``."""
    from memcores.cores import CORES, make_core

    return sorted(name for name in CORES if make_core(name, 4, 4).graph_safe)


def committed_ms(path: str | Path, shape: dict[str, int]) -> dict[str, float]:
    """Each core's best ms in a committed ``bench_gpu.json`` at ``shape`` (``{}``: missing)."""
    file = Path(path) if Path(path).is_file() else REPO / path  # from here, or the repo's
    if not file.is_file():
        return {}
    part = json.loads(file.read_text()).get("parts", {}).get("cores", {})
    if part.get("shape") != shape:
        return {}
    return {r["core"]: r.get("best_ms", r["ms"]) for r in part["rows"] if r.get("ms") is not None}


def target(name: str, x_lstm: float | None, x_gru: float | None, x_loop: float | None) -> str:
    """Core ``name``'s target marked ``ok`` or ``MISS``: gated LSTM/GRU presets <=2x their cuDNN
    module, ``slstm`` <=3x ``nn.LSTM``, a graphed loop >=5x its eager loop (``x_loop``)."""
    if name in LSTM_PRESETS and x_lstm is not None:
        return f"{'ok' if x_lstm <= 2 else 'MISS'} <=2x nn.LSTM"
    if name in GRU_PRESETS and x_gru is not None:
        return f"{'ok' if x_gru <= 2 else 'MISS'} <=2x nn.GRU"
    if name == "slstm" and x_lstm is not None:
        return f"{'ok' if x_lstm <= 3 else 'MISS'} <=3x nn.LSTM"
    if x_loop is not None:
        verdict = "ok" if x_loop >= OWN_LOOP_SPEEDUP else "MISS"
        return f"{verdict} >={OWN_LOOP_SPEEDUP:.0f}x faster than its own loop"
    return ""


def part_cores(device: torch.device, sizes: Sizes, clock: Clock, against: str) -> dict:
    """Forward+backward ms of every core beside cuDNN (timed before, between and after; the
    median counts), the ``graph_safe`` cores also through CUDA graphs (the better counts)."""
    from memcores.cores import CORES

    eager: dict[str, float] = {}
    graphed: dict[str, float] = {}
    runs: dict[str, list[float]] = {name: [] for name in BASELINES}
    errors: dict[str, str] = {}
    not_measured: list[str] = []
    again = [(name, False) for name in BASELINES]  # re-timed to show drift
    cells = [*again, *((n, False) for n in sorted(CORES)), *again]
    cells += [(n, True) for n in graph_safe_cores()] + again
    for name, graph in cells:
        label = name + (GRAPHED if graph else "")
        if clock.left() <= 0:
            if label not in not_measured:  # the baselines come up three times
                not_measured.append(label)
            continue
        try:
            ms = _time_cell(name, sizes.cores, device, graph, sizes, clock)
        except Exception as err:  # one broken core must not stop the run
            errors[label] = _error(err)
            continue
        if name in runs:  # a baseline's row is the median of its timings so far
            runs[name].append(ms)
            ms = statistics.median(runs[name])
        (graphed if graph else eager)[name] = ms
    T, B, D, H = sizes.cores
    shape = dict(T=T, B=B, D=D, H=H)
    record = committed_ms(against, shape)
    rows = [_core_row(n, ms, graphed.get(n), eager, record) for n, ms in eager.items()]
    against = against if record else None
    return dict(
        shape=shape, against=against, rows=rows, baseline_runs=runs, errors=errors,
        not_measured=not_measured,
    )  # fmt: skip


def _core_row(
    name: str, ms: float, ms_graphed: float | None, eager: dict[str, float], record: dict
) -> dict[str, Any]:
    best = min(ms, ms_graphed if ms_graphed is not None else math.inf)
    x_lstm = best / eager["nn.LSTM"] if "nn.LSTM" in eager else None
    x_gru = best / eager["nn.GRU"] if "nn.GRU" in eager else None
    x_loop = ms / ms_graphed if ms_graphed is not None else None
    committed = record.get(name)
    x_record = best / committed if committed else None
    return dict(
        core=name, ms=ms, ms_graphed=ms_graphed, best_ms=best, x_nn_lstm=x_lstm, x_nn_gru=x_gru,
        x_own_loop=x_loop, record_ms=committed, x_record=x_record,
        target=target(name, x_lstm, x_gru, x_loop),
    )  # fmt: skip


def part_scaling(device: torch.device, sizes: Sizes, clock: Clock, against: str) -> dict:
    """Forward+backward ms against T (in order of T, so the budget cuts the longest); target:
    a scan core at the longest T at most 8x its time at the shortest."""
    B, H = sizes.scaling_b_h
    D = sizes.cores[2]
    lengths = {n: sizes.scan_lengths for n in ("nn.LSTM", *SCAN_CORES)}
    lengths.update({n: sizes.loop_lengths for n in (*LOOP_CORES, *GRAPH_SCALING)})
    cells = sorted((T, n, False) for n in lengths for T in lengths[n] if n not in GRAPH_SCALING)
    cells += [(T, n, g) for n in GRAPH_SCALING for g in (False, True) for T in lengths[n]]
    ms: dict[str, dict[int, float]] = {}
    errors: dict[str, str] = {}
    not_measured = []
    fewer = dataclasses.replace(sizes, reps=max(1, sizes.reps - 1))
    for T, name, graph in cells:
        label = name + (GRAPHED if graph else "")
        if label in errors:
            continue
        if clock.left() <= 0:
            not_measured.append(f"{label} T={T}")
            continue
        try:
            shape = (T, B, D, H)
            ms.setdefault(label, {})[T] = _time_cell(name, shape, device, graph, fewer, clock)
        except Exception as err:
            errors[label] = _error(err)
    first, last = sizes.scan_lengths[0], sizes.scan_lengths[-1]
    rows = []
    for name, times in ms.items():
        growth = times[last] / times[first] if {first, last} <= times.keys() else None
        mark = "" if growth is None or name not in SCAN_CORES else "ok" if growth <= 8 else "MISS"
        rows.append(dict(core=name, ms=times, growth=growth, target=mark and f"{mark} <=8x"))
    lengths = list(sizes.scan_lengths)
    return dict(B=B, H=H, lengths=lengths, rows=rows, errors=errors, not_measured=not_measured)


def _rl_config(path: str, overrides: list[str]) -> Any:
    from memcores.agents.rl_config import RLConfig
    from memcores.experiments.config import load_config

    fixed = ["train.progress=false", "train.histogram_every=0", "run.tensorboard=false"]
    return load_config(RLConfig, path, [*overrides, *fixed])


def _recorder(device: torch.device) -> Any:
    from memcores.cores.graphed import CudaRecorder, EagerRecorder

    return CudaRecorder() if device.type == "cuda" else EagerRecorder()


def acting_step(
    policy: torch.nn.Module, obs: dict[str, np.ndarray], device: torch.device, graphed: bool
) -> Callable[[], np.ndarray]:
    """One acting step as the trainer takes it: observations from NumPy, the forward (through
    ``ActingGraph`` where ``graphed``, recorded first: a failed recording raises), sampling,
    actions back to NumPy."""
    from memcores.agents.acting import act
    from memcores.agents.acting_graph import ActingGraph
    from memcores.agents.policy import obs_to_tensors

    n = len(next(iter(obs.values())))
    state = tuple(s.clone() for s in policy.initial_state(n, device))
    starts = torch.zeros(n, dtype=torch.bool, device=device)
    graph = ActingGraph(policy, _recorder(device)) if graphed else None

    def step() -> np.ndarray:
        inputs = (obs_to_tensors(obs, device), state, starts)
        out = graph(*inputs) if graph is not None else act(policy, *inputs)
        for s, new in zip(state, out.state, strict=True):
            s.copy_(new)
        return out.actions.cpu().numpy()

    for _ in range(graph.warmup_calls + 1 if graph is not None else 1):
        step()  # compiles, allocates; the warm-up steps and the recording
    if graph is not None and graph.failure is not None:
        raise RuntimeError(graph.failure)
    return step


def part_acting(device: torch.device, sizes: Sizes, clock: Clock, against: str) -> dict:
    """Microseconds per MemoryS7 acting step on the CPU, ``device`` and its acting graph."""
    from memcores.agents.networks import build_policy

    config = _rl_config(MEMORY_S7, list(sizes.rl_overrides))
    torch.set_num_threads(config.train.threads or torch.get_num_threads())  # main restores it
    torch.manual_seed(0)  # MemoryS7: 7 actions, a 7x7x3 view (its mission is not read)
    policies = {"cpu": build_policy(config, 7, (7, 7, 3)).eval()}
    if device.type != "cpu":
        policies["device"] = build_policy(config, 7, (7, 7, 3)).to(device).eval()
    if device.type == "cuda":
        policies["graphed"] = policies["device"]
    rng = np.random.default_rng(0)
    rows, not_measured = [], []
    for n in sizes.acting_envs:
        if clock.left() <= 0:
            not_measured.append(n)
            continue
        obs = {"image": rng.integers(0, 6, (n, 7, 7, 3), dtype=np.uint8)}
        obs["direction"] = rng.integers(0, 4, n)
        row: dict[str, Any] = {"n_envs": n, "rule": str(acting_device(device, n))}
        for where, policy in policies.items():
            dev = torch.device("cpu") if where == "cpu" else device
            try:
                step = acting_step(policy, obs, dev, graphed=where == "graphed")
                steps = lambda s=step: [s() for _ in range(sizes.acting_steps)]  # noqa: E731
                row[f"us_{where}"] = 1e6 * timed(steps, dev) / sizes.acting_steps
            except Exception as err:  # a step that cannot be recorded is a result too
                row[f"{where}_error"] = _error(err)
        if "us_device" in row:
            row["faster"] = "cpu" if row["us_cpu"] <= row["us_device"] else str(device)
        rows.append(row)
    crossover = next((r["n_envs"] for r in rows if r.get("faster", "cpu") != "cpu"), None)
    return {"rows": rows, "crossover_n_envs": crossover, "not_measured": not_measured}


def rl_rate(path: str, overrides: list[str], device: str, epochs: int | None) -> dict[str, Any]:
    """Frames/s of ``path``'s PPO recipe on ``device`` as ``memcores train`` runs it: one
    rollout and ``epochs`` update epochs (None: all) timed after a warm-up, scaled to all."""
    from memcores.agents.acting_graph import ActingGraph
    from memcores.agents.policy import obs_to_tensors
    from memcores.agents.ppo import update
    from memcores.agents.rl_trainer import acting_policy, setup
    from memcores.agents.rollout import (
        RolloutBuffer,
        collect_with_returns,
        obs_shapes,
        start_rollouts,
    )
    from memcores.agents.rollout_graph import RolloutGraph
    from memcores.agents.update_graph import UpdateGraph
    from memcores.envs.batched import BatchedEnv

    s = setup(_rl_config(path, [*overrides, f"train.device={device}"]))
    agent, n_envs = s.config.agent, s.config.env.n_envs
    try:
        acting = acting_policy(s.policy, s.device, n_envs=n_envs, graphed=s.graph_acting)
        act_device = next(acting.parameters()).device
        if isinstance(s.envs, BatchedEnv):
            s.envs.to(act_device)  # as the trainer: batched envs step where the policy acts
        space = obs_shapes(s.envs.single_observation_space)
        state = acting.initial_state(n_envs, act_device)
        buffer = RolloutBuffer(space, agent.n_steps, n_envs, agent.seq_len, state, act_device)
        carry = start_rollouts(acting, s.envs, s.config.train.seed, act_device)
        step = env_step = None  # each one's warm-up steps and recording, before the clock
        if s.graph_env_step:
            env_step = RolloutGraph(acting, s.envs, _recorder(act_device))
            carry = env_step.prime(carry)
        elif s.graph_acting:
            step = ActingGraph(acting, _recorder(act_device))
            for _ in range(step.warmup_calls + 1):
                step(obs_to_tensors(carry.obs, act_device), carry.state, carry.starts)
        graph = UpdateGraph(_recorder(s.device)) if s.graph_update else None
        collect = timed(
            lambda: collect_with_returns(
                acting, s.envs, buffer, carry, agent, None, step, env_step
            ),
            s.device,
        )
        timed_epochs = min(epochs or agent.n_epochs, agent.n_epochs)
        if s.device.type != "cpu" or graph is not None:  # enough for the graph's warm-up
            chunks_per_mb = max(1, agent.minibatch_size // agent.seq_len)
            full = max(1, n_envs * agent.n_steps // agent.seq_len // chunks_per_mb)
            warm_epochs = 1 if graph is None else math.ceil((graph.warmup_steps + 1) / full)
            warm = dataclasses.replace(agent, n_epochs=warm_epochs)
            update(s.policy, s.optimizer, buffer, warm, graph=graph)
        part = dataclasses.replace(agent, n_epochs=timed_epochs)
        upd = timed(lambda: update(s.policy, s.optimizer, buffer, part, graph=graph), s.device)
        upd *= agent.n_epochs / timed_epochs
    finally:
        s.envs.close()
    acted = ("acting and env step", env_step) if env_step is not None else ("acting", step)
    graphs = [
        f"{what} {'eager' if g is None else g.failure or f'{g.replays} steps replayed'}"
        for what, g in (acted, ("update", graph))
    ]
    return dict(
        fps=n_envs * agent.n_steps / (collect + upd), collect_s=collect, update_s=upd,
        epochs_timed=f"{timed_epochs}/{agent.n_epochs}",
        acting=describe_acting(s.device, n_envs, graphed=s.graph_acting),
        graphs="; ".join(graphs), threads=torch.get_num_threads(),
    )  # fmt: skip


def rl_settings(sizes: Sizes) -> list[tuple[str, str, list[str], int | None]]:
    """``(label, config, overrides, epochs timed)`` rows, each of :data:`EAGER_ROWS`
    followed by its eager-update row, then the batched-env rows (:func:`batched_settings`)."""
    memory = [
        (f"MemoryS7 lstm, {n} envs", MEMORY_S7, [f"env.n_envs={n}"], None) for n in sizes.rl_envs
    ]
    popgym = [(f"POPGym {core}", POPGYM, [f"core.name={core}"], 1) for core in POPGYM_CORES]
    settings = []
    for label, path, overrides, epochs in memory + popgym:
        overrides += sizes.rl_overrides if path == MEMORY_S7 else sizes.popgym_overrides
        settings.append((label, path, overrides, epochs))
        if label in EAGER_ROWS:
            eager = [*overrides, "train.graph_update=false"]
            settings.append((f"{label}, eager update", path, eager, epochs))
    return settings + [(label, path, o, e) for label, path, o, e, _ in batched_settings(sizes)]


def batched_settings(sizes: Sizes) -> list[tuple[str, str, list[str], int | None, str]]:
    """The rows with batched envs (``env.vector=batched``), timed on the device only, each
    with the row of this run it is compared with (``"best"``: the fastest row without
    batched envs): Passive Visual Match at each ``(envs, minibatch)`` of ``sizes``, the first
    and the last again with ``train.graph_env_step``, and POPGym ``min_gru``."""
    batched = ["env.vector=batched"]
    rows = [
        (f"PassiveVisualMatch lstm, batched, {n} envs, minibatch {mb}", PASSIVE,
         [*batched, f"env.n_envs={n}", f"agent.minibatch_size={mb}",
          *sizes.batched_overrides], None, "best")
        for n, mb in sizes.batched_envs
    ]  # fmt: skip
    # the fewest and the most envs again with the acting and env step in one recording,
    # each against itself without
    ends = [rows[0], rows[-1]] if len(rows) > 1 else rows
    graphed = [
        (f"{label}, env step graphed", path, [*overrides, ENV_STEP_GRAPH], epochs, label)
        for label, path, overrides, epochs, _ in ends
    ]
    popgym = [*batched, "core.name=min_gru", *sizes.popgym_overrides]
    return [*rows, *graphed, ("POPGym min_gru, batched", POPGYM, popgym, 1, "POPGym min_gru")]


def part_rl(device: torch.device, sizes: Sizes, clock: Clock, against: str) -> dict:
    """RL frames/s on ``device`` against the CPU (an eager-update row reuses the CPU above);
    a batched-env row is timed on ``device`` only, against a row of this run."""
    rows: list[dict[str, Any]] = []
    not_measured, threads = [], torch.get_num_threads()
    compared = {label: other for label, *_, other in batched_settings(sizes)}
    for label, path, overrides, epochs in rl_settings(sizes):
        if clock.left() <= 0:
            not_measured.append(label)
            continue
        row: dict[str, Any] = {"setting": label, "config": path, "overrides": overrides}
        try:
            if label in compared:
                row["device"] = rl_rate(path, overrides, str(device), epochs)
                row.update(_against(row["device"]["fps"], compared[label], rows))
            else:
                eager_row = label.endswith("eager update")
                cpu = rows[-1].get("cpu") if eager_row else rl_rate(path, overrides, "cpu", epochs)
                row["cpu"] = cpu
                on_device = device.type != "cpu"
                row["device"] = rl_rate(path, overrides, str(device), epochs) if on_device else cpu
                row["x_cpu"] = row["device"]["fps"] / cpu["fps"]
        except Exception as err:
            row["error"] = _error(err)
        finally:
            torch.set_num_threads(threads)  # setup() applies each config's train.threads
        rows.append(row)
    return {"rows": rows, "not_measured": not_measured}


def _against(fps: float, other: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"against": label, "x_against": ratio}``: ``fps`` against row ``other`` of ``rows``
    (``"best"``: the fastest device row there); empty where that row was not measured."""
    if other == "best":
        candidates = [r for r in rows if "x_cpu" in r]  # the rows timed against the CPU
    else:
        candidates = [r for r in rows if r["setting"] == other and "device" in r]
    if not candidates:
        return {}
    best = max(candidates, key=lambda r: r["device"]["fps"])
    return {"against": best["setting"], "x_against": fps / best["device"]["fps"]}


def supervised_rate(overrides: list[str], device: str, updates: int, clock: Clock) -> dict:
    """Seconds per copy-task update on ``device`` (after two warm-up updates)."""
    from memcores.agents.supervised import TaskData, prepare, train_step
    from memcores.agents.supervised_config import SupervisedConfig
    from memcores.experiments.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        config = load_config(
            SupervisedConfig, COPY, [*overrides, f"train.device={device}", f"run.dir={tmp}"]
        )
        prep = prepare(config)
        data = TaskData(prep.task, config.train.batch_size, config.train.seed)
        for step in range(2):
            train_step(prep, data.train_batch(step), config.optim.lr, math.inf)
        done, start = 0, time.perf_counter()
        sync(prep.device)
        while done < updates and (done == 0 or clock.left() > 0):
            train_step(prep, data.train_batch(2 + done), config.optim.lr, math.inf)
            done += 1
        sync(prep.device)
    seconds = (time.perf_counter() - start) / done
    return dict(s_per_update=seconds, updates=done, core=config.core.name,
                threads=torch.get_num_threads())  # fmt: skip


def part_supervised(device: torch.device, sizes: Sizes, clock: Clock, against: str) -> dict:
    """Copy T=200, hidden 128, batch 256: seconds per update on the CPU and on ``device``."""
    overrides = list(sizes.supervised_overrides)  # each run sets its threads: main restores
    half = Clock(max(clock.left() / 2, 1.0))
    cpu = supervised_rate(overrides, "cpu", sizes.supervised_updates, half)
    dev = cpu
    if device.type != "cpu":
        dev = supervised_rate(overrides, str(device), sizes.supervised_updates, clock)
    x_cpu = cpu["s_per_update"] / dev["s_per_update"]
    return {"config": COPY, "overrides": overrides, "cpu": cpu, "device": dev, "x_cpu": x_cpu}


RUNNERS: dict[str, Callable[[torch.device, Sizes, Clock, str], dict]] = dict(
    cores=part_cores, scaling=part_scaling, acting=part_acting, rl=part_rl,
    supervised=part_supervised,
)  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="memcores bench gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/bench_gpu", help="folder for the JSON and markdown")
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N (default cuda)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a check that it runs)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts")
    parser.add_argument("--against", default=RECORD, help="a committed bench_gpu.json to compare")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        named = ", ".join(unknown) or "none"
        raise ValueError(f"unknown part(s) {named}; valid: {', '.join(PARTS)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            "bench gpu needs a CUDA GPU and none is available "
            "(--device cpu --quick checks the script on the CPU)"
        )
    device = resolve_device(args.device)
    sizes = QUICK if args.quick else Sizes()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command, budgets = "memcores bench gpu " + " ".join(argv), {p: PARTS[p] for p in parts}
    results = dict(command=command, hardware=info(device), budgets_s=budgets, parts={})
    print(f"bench gpu: device {device}, parts {', '.join(parts)}; writing {out}", flush=True)
    carry, threads = 0.0, torch.get_num_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in parts:
            clock = Clock(PARTS[name] + carry)
            result = RUNNERS[name](device, sizes, clock, args.against)
            torch.set_num_threads(threads)  # a part may set a config's train.threads
            result["seconds"] = clock.budget - clock.left()
            carry = max(clock.left(), 0.0)
            results["parts"][name] = result
            (out / "bench_gpu.json").write_text(json.dumps(results, indent=1, default=str))
            (out / "bench_gpu.md").write_text(markdown(results))
            print(f"  {name}: {result['seconds']:.1f} s", flush=True)
    print(markdown(results))
    print(f"wrote {out / 'bench_gpu.json'} and {out / 'bench_gpu.md'}")
    return 0
