"""``memcores bench cores``: forward+backward time of every registered core, side by side.

For each thread count, every core (and the fused ``torch.nn.LSTM`` anchor) runs
forward+backward on the same ``[T, B, D]`` batch; the runs of all cores are interleaved in a
shuffled order and repeated, and the table shows medians and two ratios:

- ``x nn.LSTM``: against ``torch.nn.LSTM`` (the fused anchor);
- ``x twin``: against the same gated cell with a plain sigmoid gate. The twin of the
  gate-tied cores (``fast_lstm, fast2_lstm, softsign_lstm, uf_lstm``) and of the refine cores
  (``ur_lstm, r_lstm``) is ``tied_lstm`` (the gate-tied sigmoid LSTM without refine, so for
  ``ur_lstm`` the ratio is the cost of the refine gate); untied LSTM variants (``u_lstm,
  c_lstm, hdetach_lstm``, and ``rel_lstm``/``mem_lstm``, which build on an LSTM) compare with
  ``lstm``; ``fast_gru, ur_gru`` with ``gru``; ``power_rnn`` with ``leaky_rnn``.

Wall-clock medians are what a user waits for; on a shared machine the process CPU time
(``cpu`` columns) is less disturbed by other jobs, so both are printed. Benchmarks print ratios;
tests never assert on them.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

from cores import CORES, make_core

TWINS = {
    "lstm": "lstm",
    "tied_lstm": "tied_lstm",
    "fast_lstm": "tied_lstm",
    "fast2_lstm": "tied_lstm",
    "softsign_lstm": "tied_lstm",
    "uf_lstm": "tied_lstm",
    "ur_lstm": "tied_lstm",
    "r_lstm": "tied_lstm",
    "u_lstm": "lstm",
    "c_lstm": "lstm",
    "hdetach_lstm": "lstm",
    "rel_lstm": "lstm",
    "mem_lstm": "lstm",
    "gru": "gru",
    "fast_gru": "gru",
    "ur_gru": "gru",
    "leaky_rnn": "leaky_rnn",
    "power_rnn": "leaky_rnn",
}
LSTM_FAMILY = {name for name, twin in TWINS.items() if twin in ("lstm", "tied_lstm")} - {
    "rel_lstm",
    "mem_lstm",
}
# (core, reference column, limit) pairs checked in the "target" column
TARGETS = {"fast_lstm": ("twin", 1.05), "ur_lstm": ("twin", 1.3)}
LSTM_LIMIT = 1.5
ANCHOR = "nn.LSTM"


def _runner(module: torch.nn.Module, x: torch.Tensor, call: Callable) -> Callable[[], None]:
    params = [p for p in module.parameters() if p.requires_grad]

    def run() -> None:
        for p in params:
            p.grad = None
        y = call(x)
        y.float().sum().backward()

    return run


def build_runs(
    names: list[str], T: int, B: int, D: int, H: int, seed: int
) -> tuple[dict[str, Callable[[], None]], dict[str, str]]:
    """One forward+backward closure per core (plus the anchor); errors are reported, not raised."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, D, generator=gen)
    torch.manual_seed(seed)
    anchor = torch.nn.LSTM(D, H)
    runs = {ANCHOR: _runner(anchor, x, lambda xs: anchor(xs)[0])}
    errors: dict[str, str] = {}
    for name in names:
        try:
            core = make_core(name, D, H).train()
        except Exception as err:  # a core under construction must not stop the benchmark
            errors[name] = f"{type(err).__name__}: {err}"
            continue
        runs[name] = _runner(core, x, lambda xs, c=core: c(xs, c.initial_state(xs.shape[1]))[0])
    return runs, errors


def measure(
    runs: dict[str, Callable[[], None]], reps: int, seed: int
) -> dict[str, tuple[float, float]]:
    """Median (wall, cpu) seconds per run; rounds interleave all cores in a shuffled order."""
    order = list(runs)
    wall: dict[str, list[float]] = {k: [] for k in order}
    cpu: dict[str, list[float]] = {k: [] for k in order}
    for fn in runs.values():  # warm-up: allocator, first-call dispatch
        fn()
    rng = random.Random(seed)
    for _ in range(reps):
        rng.shuffle(order)
        for name in order:
            w0, c0 = time.perf_counter(), time.process_time()
            runs[name]()
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in runs}


def _ratio(a: float, b: float | None) -> str:
    return "-" if b is None or b <= 0 else f"{a / b:5.2f}x"


def _target(name: str, times: dict[str, tuple[float, float]], col: int) -> str:
    checks = []
    anchor = times[ANCHOR][col]
    if name in LSTM_FAMILY:
        checks.append(times[name][col] / anchor <= LSTM_LIMIT)
    if name in TARGETS and TWINS[name] in times:
        _, limit = TARGETS[name]
        checks.append(times[name][col] / times[TWINS[name]][col] <= limit)
    if not checks:
        return ""
    labels = [f"<={LSTM_LIMIT}x nn"] if name in LSTM_FAMILY else []
    if name in TARGETS:
        labels.append(f"<={TARGETS[name][1]}x twin")
    return ("ok " if all(checks) else "MISS ") + ", ".join(labels)


def format_table(times: dict[str, tuple[float, float]], threads: int) -> str:
    """The result table for one thread count (wall and cpu medians and ratios)."""
    header = (
        f"{'core':<14}{'wall ms':>9}{'x nn.LSTM':>11}{'x twin':>9}  "
        f"{'cpu ms':>9}{'x nn.LSTM':>11}{'x twin':>9}  {'twin':<11}{'target (wall)'}"
    )
    lines = [f"threads={threads}", header, "-" * len(header)]
    for name in [ANCHOR, *sorted(k for k in times if k != ANCHOR)]:
        w, c = times[name]
        twin = TWINS.get(name)
        tw = times.get(twin) if twin else None
        lines.append(
            f"{name:<14}{w * 1e3:>9.1f}{_ratio(w, times[ANCHOR][0]):>11}"
            f"{_ratio(w, tw[0] if tw else None):>9}  {c * 1e3:>9.1f}"
            f"{_ratio(c, times[ANCHOR][1]):>11}{_ratio(c, tw[1] if tw else None):>9}  "
            f"{(twin or '-'):<11}{_target(name, times, 0)}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="memcores bench cores", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--T", type=int, default=256, help="sequence length")
    parser.add_argument("--B", type=int, default=64, help="batch size")
    parser.add_argument("--D", type=int, default=128, help="input size")
    parser.add_argument("--H", type=int, default=128, help="hidden size")
    parser.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    parser.add_argument("--reps", type=int, default=7, help="interleaved rounds (median taken)")
    parser.add_argument("--cores", default="all", help="comma-separated core names or 'all'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="smoke mode: T=16 B=4 D=H=16, 1 thread, 1 round"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.T, args.B, args.D, args.H, args.threads, args.reps = 16, 4, 16, 16, "1", 1
    names = sorted(CORES) if args.cores == "all" else args.cores.split(",")
    unknown = [n for n in names if n not in CORES]
    if unknown:
        raise ValueError(f"unknown core(s) {unknown}; valid cores: {', '.join(sorted(CORES))}")
    threads = [int(t) for t in args.threads.split(",")]
    old_threads = torch.get_num_threads()
    print(
        f"bench cores: forward+backward, T={args.T} B={args.B} D={args.D} H={args.H}, "
        f"{args.reps} interleaved rounds, medians; torch {torch.__version__}"
    )
    try:
        for n in threads:
            torch.set_num_threads(n)
            runs, errors = build_runs(names, args.T, args.B, args.D, args.H, args.seed)
            times = measure(runs, args.reps, args.seed)
            print()
            print(format_table(times, n))
            for name, err in errors.items():
                print(f"{name:<14}skipped ({err})")
    finally:
        torch.set_num_threads(old_threads)
    return 0
