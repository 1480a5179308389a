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
  ``lstm``; ``fast_gru, ur_gru`` with ``gru``; ``power_rnn`` with ``leaky_rnn``; the modern
  cores with the classic cell they replace (``min_gru`` with ``gru``; ``min_lstm``, ``slstm``,
  ``mlstm`` with ``lstm``).

``--acting`` times what a rollout asks of a core instead: ``--T`` single steps (``step`` under
``torch.no_grad``, ``forward`` with ``T = 1`` for a core without one) of ``--B`` envs from a
warm state (the same ``--T`` steps run first, so a transformer's memory is full), against
``torch.nn.LSTM`` stepped the same way; ``gtrxl`` and ``trxl`` are compared with ``lstm`` and
a line under the table checks ``gtrxl``'s 3x target.

A core given as ``name:option=value`` (``rel_lstm:impl=loop``) runs with those options and is
compared with the same core at its defaults.

When ``min_gru`` and ``gru`` both run, a line under the table gives ``gru / min_gru``: how many
times faster the scan-trained minGRU trains than the GRU at the same hidden size.

Under each table, ``ur_lstm``'s twin ratio is split into the price of a fourth gate block
(``lstm / tied_lstm``) and the refine gate's own arithmetic (``ur_lstm / lstm``, the same
parameter count): the 1.3x target for ``ur_lstm`` sits at the first of these. The
line ends with the floor under any 4-block cell against a 3-block one: the matrix products
alone that the fused LSTM runs (input projection, per-step recurrence and its backward, weight
gradients), timed in the same rounds at 4H and 3H gate rows (``MATMUL_RUNS``).

Times are medians over rounds; ratios are medians of the per-round ratios (paired, so a busy
spell on a shared machine slows both sides alike). With ``--stat min`` times are the fastest
round and ratios are ratios of those minima (best of N, as ``timeit`` advises: interference only
ever adds time). On a virtual machine whose neighbours steal CPU, round-to-round noise of
+-10% makes medians of a few rounds move by several points between runs, while minima over
many rounds (``--reps 31 --stat min``) settle. Wall-clock is what a user waits for; the process
CPU time (``cpu`` columns) is less disturbed by other jobs, so both are printed. Benchmarks
print ratios; tests never assert on them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from memcores.agents.device import resolve_device, sync
from memcores.cores import CORES, make_core
from memcores.cores.base import MemoryCore
from memcores.experiments.argtypes import positive_int
from memcores.experiments.bench.record import (
    Table,
    add_record_arguments,
    record_folder,
    write_record,
)
from memcores.experiments.config import parse_yaml
from memcores.experiments.malloc import ENV_VAR, keep_freed_memory

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
    "min_gru": "gru",
    "min_lstm": "lstm",
    "slstm": "lstm",
    "mlstm": "lstm",
    "gtrxl": "lstm",
    "trxl": "lstm",
}
# the gated-LSTM variants held to the 1.5x nn.LSTM target (not the cells that build on an
# LSTM, nor the modern cells compared with it)
MODERN = {"min_gru", "min_lstm", "slstm", "mlstm"}
LSTM_FAMILY = {name for name, twin in TWINS.items() if twin in ("lstm", "tied_lstm")} - {
    "rel_lstm",
    "mem_lstm",
    "gtrxl",
    "trxl",
    *MODERN,
}
# (core, reference column, limit) pairs checked in the "target" column
TARGETS = {"fast_lstm": ("twin", 1.05), "ur_lstm": ("twin", 1.3)}
LSTM_LIMIT = 1.5
# the acting-step target of the transformer core: one step at most 3x lstm's
ACTING_TARGET = ("gtrxl", "lstm", 3.0)
# --stat choices and how the header names them
STATS = {"median": "medians", "min": "minima (best round)"}
ANCHOR = "nn.LSTM"
# matrix-product-only runs (gate blocks per name), timed when ur_lstm and tied_lstm both run
MATMUL_RUNS = {"matmuls 3H": 3, "matmuls 4H": 4}


def _runner(module: torch.nn.Module, x: torch.Tensor, call: Callable) -> Callable[[], None]:
    params = [p for p in module.parameters() if p.requires_grad]

    def run() -> None:
        for p in params:
            p.grad = None
        y = call(x)
        y.float().sum().backward()

    return run


def _matmul_runner(
    T: int, B: int, D: int, H: int, blocks: int, gen: torch.Generator, device: torch.device
) -> Callable[[], None]:
    """The matrix products of the fused LSTM's forward+backward with ``blocks`` gate blocks and
    no gate arithmetic: ``x [T*B, D] @ W_ih^T`` once, ``h_{t-1} @ W_hh^T`` added into the gate
    row ``[B, blocks*H]`` per step, ``dy_{t-1} + dA_t @ W_hh`` per step backwards, then the
    weight gradients ``dA^T h``, ``dA @ W_ih``, ``dA^T x`` and ``sum dA``."""
    n = blocks * H
    x, y = torch.randn(T * B, D, generator=gen), torch.randn(T, B, H, generator=gen)
    w_ih, w_hh = torch.randn(n, D, generator=gen), torch.randn(n, H, generator=gen)
    bias, d_gates = torch.randn(n, generator=gen), torch.randn(T, B, n, generator=gen)
    x, y, w_ih, w_hh, bias, d_gates = (t.to(device) for t in (x, y, w_ih, w_hh, bias, d_gates))

    def run() -> None:
        gates = torch.addmm(bias, x, w_ih.t()).view(T, B, n)
        w_t, h = w_hh.t().contiguous(), torch.zeros(B, H, device=device)  # as the fused path
        for gate_row, y_t in zip(gates.unbind(0), y.unbind(0), strict=True):
            gate_row.addmm_(h, w_t)
            h = y_t
        for t in range(T - 1, 0, -1):  # the gradient into h_{t-1} (step 0's goes to h0)
            torch.addmm(y[t - 1], d_gates[t], w_hh)
        d_gates[0].mm(w_hh)
        flat = d_gates.view(T * B, n)
        for left, right in ((flat.t(), y.view(T * B, H)), (flat, w_ih), (flat.t(), x)):
            left.mm(right)
        flat.sum(0)

    return run


def _built_cores(
    names: list[str], D: int, H: int, device: torch.device
) -> tuple[dict[str, MemoryCore], dict[str, str]]:
    """Each core of ``names`` (``name`` or ``name:option=value``) built on ``device``, and
    the error of each that could not be built: a core under construction must not stop the
    benchmark."""
    cores: dict[str, MemoryCore] = {}
    errors: dict[str, str] = {}
    for name in names:
        try:
            base, options = parse_core_spec(name)
            cores[name] = make_core(base, D, H, **options).to(device)
        except Exception as err:
            errors[name] = f"{type(err).__name__}: {err}"
    return cores, errors


def build_runs(
    names: list[str],
    T: int,
    B: int,
    D: int,
    H: int,
    seed: int,
    device: torch.device | str = "cpu",
) -> tuple[dict[str, Callable[[], None]], dict[str, str]]:
    """One forward+backward closure per core on ``device`` (plus the anchor, and the
    ``MATMUL_RUNS`` when ``ur_lstm`` and ``tied_lstm`` both run); errors are reported, not
    raised. Inputs and weights are drawn on the CPU, so every device sees the same values."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, D, generator=gen).to(device)
    torch.manual_seed(seed)
    anchor = torch.nn.LSTM(D, H).to(device)
    runs = {ANCHOR: _runner(anchor, x, lambda xs: anchor(xs)[0])}
    cores, errors = _built_cores(names, D, H, device)
    for name, core in cores.items():
        runs[name] = _runner(
            core.train(), x, lambda xs, c=core: c(xs, c.initial_state(xs.shape[1], xs.device))[0]
        )
    if {"ur_lstm", "tied_lstm"} <= runs.keys():
        for label, blocks in MATMUL_RUNS.items():
            runs[label] = _matmul_runner(T, B, D, H, blocks, gen, device)
    return runs, errors


def _acting_runner(
    step: Callable[[torch.Tensor, tuple], tuple], xs: list[torch.Tensor], state: tuple
) -> Callable[[], None]:
    """``len(xs)`` single steps from ``state`` (the same warm state every round), no grad."""

    def run() -> None:
        with torch.no_grad():
            s = state
            for x_t in xs:
                _, s = step(x_t, s)

    return run


def build_acting_runs(
    names: list[str],
    T: int,
    B: int,
    D: int,
    H: int,
    seed: int,
    device: torch.device | str = "cpu",
) -> tuple[dict[str, Callable[[], None]], dict[str, str]]:
    """One closure per core that takes ``T`` acting steps of ``B`` envs (plus the anchor,
    ``torch.nn.LSTM`` called with ``T = 1``), each from the state after ``T`` warm-up steps."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    warm, x = (torch.randn(T, B, D, generator=gen).to(device) for _ in range(2))
    xs = list(x.unbind(0))
    torch.manual_seed(seed)
    anchor = torch.nn.LSTM(D, H).to(device).eval()
    with torch.no_grad():
        _, anchor_state = anchor(warm)

    def anchor_step(x_t: torch.Tensor, s: tuple) -> tuple:
        y, s = anchor(x_t.unsqueeze(0), s)
        return y[0], s

    runs = {ANCHOR: _acting_runner(anchor_step, xs, anchor_state)}
    cores, errors = _built_cores(names, D, H, device)
    for name, core in cores.items():
        core.eval()
        with torch.no_grad():
            _, state = core(warm, core.initial_state(B, device))

        def step(x_t: torch.Tensor, s: tuple, c=core) -> tuple:
            if c.has_step:
                return c.step(x_t, s)
            y, s = c(x_t.unsqueeze(0), s)
            return y[0], s

        runs[name] = _acting_runner(step, xs, state)
    return runs, errors


def format_acting_target(samples: Samples, stat: str = "median") -> str | None:
    """``gtrxl / lstm`` per acting step (wall) against :data:`ACTING_TARGET`, or ``None``."""
    name, ref, limit = ACTING_TARGET
    r = ratio(samples, name, ref, 0, stat) if name in samples else None
    if r is None:
        return None
    mark = "ok" if r <= limit else "MISS"
    return f"{name} / {ref} per acting step (wall) = {r:.2f}x: {mark} <={limit:g}x"


Samples = dict[str, list[tuple[float, float]]]
"""Per core, one ``(wall, cpu)`` seconds pair per round."""


def run_order(names: list[str]) -> list[str]:
    """The anchor, then each twin directly followed by the cores compared with it."""
    order = [ANCHOR] if ANCHOR in names else []
    for twin in dict.fromkeys(TWINS.values()):
        order += [
            n
            for n in [twin, *(k for k, v in TWINS.items() if v == twin and k != twin)]
            if n in names and n not in order
        ]
    return order + [n for n in names if n not in order]


def measure(
    runs: dict[str, Callable[[], None]], reps: int, device: torch.device | str = "cpu"
) -> Samples:
    """Time every run once per round. A core runs right after its twin and the order reverses
    every other round (A B B A ...), so slow drifts of a shared machine cancel in the ratios.
    On a GPU each run is timed to the end of its queued kernels (:func:`agents.device.sync`)."""
    order = run_order(list(runs))
    samples: Samples = {k: [] for k in order}
    for fn in runs.values():  # warm-up: allocator, first-call dispatch, kernel compilation
        fn()
    sync(device)
    for rep in range(reps):
        for name in order if rep % 2 == 0 else order[::-1]:
            w0, c0 = time.perf_counter(), time.process_time()
            runs[name]()
            sync(device)
            samples[name].append((time.perf_counter() - w0, time.process_time() - c0))
    return samples


def summary_time(samples: Samples, name: str, col: int, stat: str = "median") -> float:
    """Median (or minimum) seconds of ``name`` over rounds (col 0: wall, 1: cpu)."""
    values = [s[col] for s in samples[name]]
    return min(values) if stat == "min" else statistics.median(values)


def ratio(
    samples: Samples, name: str, ref: str | None, col: int, stat: str = "median"
) -> float | None:
    """``name / ref``: the median over rounds of the per-round ratio (rounds are close in time,
    so a busy spell on a shared machine slows both sides alike), or with ``stat="min"`` the
    ratio of the two fastest rounds."""
    if ref is None or ref not in samples:
        return None
    if stat == "min":
        fastest_ref = summary_time(samples, ref, col, "min")
        return summary_time(samples, name, col, "min") / fastest_ref if fastest_ref > 0 else None
    return statistics.median(
        a[col] / b[col] for a, b in zip(samples[name], samples[ref], strict=True) if b[col] > 0
    )


def _fmt(r: float | None) -> str:
    return "-" if r is None else f"{r:5.2f}x"


def _target(name: str, samples: Samples, stat: str = "median") -> str:
    """Each of the targets that applies, marked ``ok`` or ``MISS`` (wall-clock ratios),
    e.g. ``ok <=1.5x nn, MISS <=1.3x twin``."""
    marks = []
    if name in LSTM_FAMILY:
        met = ratio(samples, name, ANCHOR, 0, stat) <= LSTM_LIMIT
        marks.append(f"{'ok' if met else 'MISS'} <={LSTM_LIMIT}x nn")
    if name in TARGETS and TWINS[name] in samples:
        met = ratio(samples, name, TWINS[name], 0, stat) <= TARGETS[name][1]
        marks.append(f"{'ok' if met else 'MISS'} <={TARGETS[name][1]}x twin")
    return ", ".join(marks)


def parse_core_spec(spec: str) -> tuple[str, dict[str, object]]:
    """``name[:option=value...]`` -> the core name and its options, values read as YAML
    scalars (``rel_lstm:impl=loop`` -> ``("rel_lstm", {"impl": "loop"})``)."""
    name, *pairs = spec.split(":")
    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"core option {pair!r} in {spec!r} is not key=value")
        options[key] = parse_yaml(value)
    return name, options


def twin_of(name: str, samples: Samples) -> str | None:
    """The core a row is compared with: its twin, or for a core run with options
    (``rel_lstm:impl=loop``) the same core with its defaults when that ran too."""
    base = name.split(":")[0]
    if base != name:
        return base if base in samples else None
    return TWINS.get(name)


def format_table(samples: Samples, threads: int, stat: str = "median") -> str:
    """The result table for one thread count (wall and cpu times and ratios, by ``stat``)."""
    width = max([14, *(len(k) + 2 for k in samples)])
    header = (
        f"{'core':<{width}}{'wall ms':>9}{'x nn.LSTM':>11}{'x twin':>9}  "
        f"{'cpu ms':>9}{'x nn.LSTM':>11}{'x twin':>9}  {'twin':<11}{'target (wall)'}"
    )
    lines = [f"threads={threads}", header, "-" * len(header)]
    for name in [ANCHOR, *sorted(k for k in samples if k != ANCHOR and k not in MATMUL_RUNS)]:
        twin = twin_of(name, samples)
        cols = []
        for col in (0, 1):
            cols.append(
                f"{summary_time(samples, name, col, stat) * 1e3:>9.1f}"
                f"{_fmt(ratio(samples, name, ANCHOR, col, stat)):>11}"
                f"{_fmt(ratio(samples, name, twin, col, stat)):>9}"
            )
        target = _target(name, samples, stat)
        lines.append(f"{name:<{width}}{cols[0]}  {cols[1]}  {(twin or '-'):<11}{target}")
    return "\n".join(lines)


def result_table(samples: Samples, threads: int, stat: str = "median") -> Table:
    """:func:`format_table`'s numbers as a record table (ms and ratios to ``nn.LSTM``)."""
    rows = []
    for name in [ANCHOR, *sorted(k for k in samples if k != ANCHOR and k not in MATMUL_RUNS)]:
        twin = twin_of(name, samples)
        cells = [name]
        for col in (0, 1):
            cells += [
                f"{summary_time(samples, name, col, stat) * 1e3:.1f}",
                _fmt(ratio(samples, name, ANCHOR, col, stat)).strip(),
            ]
        twin_ratio = _fmt(ratio(samples, name, twin, 0, stat)).strip()
        rows.append([*cells, twin or "-", twin_ratio, _target(name, samples, stat) or "-"])
    columns = ["core", "wall ms", "x nn.LSTM", "cpu ms", "x nn.LSTM (cpu)", "twin", "x twin"]
    return Table(f"threads={threads}, {stat}", [*columns, "target (wall)"], rows)


def format_refine_split(samples: Samples, stat: str = "median") -> str | None:
    """One line that splits ``ur_lstm``'s ratio to its 3-block twin into the price of a fourth
    gate block (``lstm / tied_lstm``: same cell family, plain sigmoid gates, no refine) and the
    refine gate's own arithmetic (``ur_lstm / lstm``, equal parameter counts), then the matrix
    products alone at 4 against 3 gate blocks when ``MATMUL_RUNS`` ran. ``None`` unless the
    three cores ran."""
    if not all(n in samples for n in ("lstm", "tied_lstm", "ur_lstm")):
        return None
    fourth = ratio(samples, "lstm", "tied_lstm", 0, stat)
    refine = ratio(samples, "ur_lstm", "lstm", 0, stat)
    line = (
        f"ur_lstm / tied_lstm split (wall): lstm / tied_lstm = {fourth:.2f}x (a fourth gate "
        f"block), ur_lstm / lstm = {refine:.2f}x (the refine arithmetic, same parameter count)"
    )
    three, four = MATMUL_RUNS
    floor = ratio(samples, four, three, 0, stat)
    if floor is not None:
        ms = [summary_time(samples, label, 0, stat) * 1e3 for label in (four, three)]
        line += (
            f"; matrix products alone, 4H / 3H gate rows = {ms[0]:.1f} / {ms[1]:.1f} ms"
            f" = {floor:.2f}x"
        )
    return line


def format_speedup(samples: Samples, stat: str = "median") -> str | None:
    """``min_gru / gru`` and its inverse (wall clock), or ``None`` unless both ran."""
    r = ratio(samples, "min_gru", "gru", 0, stat) if "min_gru" in samples else None
    if r is None:
        return None
    return f"min_gru / gru (wall) = {r:.3f}x: min_gru trains {1 / r:.1f}x faster than gru"


def scan_kernels(T: int, B: int, H: int, reps: int, seed: int = 0) -> str:
    """Forward+backward of ``h_t = a_t h_{t-1} + b_t`` (``[T, B, H]`` float32) with each kernel
    of :mod:`cores.scan`, an autograd step loop and, where PyTorch has it, its prototype
    ``associative_scan``; interleaved rounds, minimum process CPU time, one table."""
    from memcores.cores.scan import linear_scan, linear_scan_loop

    gen = torch.Generator().manual_seed(seed)
    a = torch.rand(T, B, H, generator=gen).requires_grad_(True)
    b = torch.randn(T, B, H, generator=gen).requires_grad_(True)
    h0 = torch.zeros(B, H)
    kernels: dict[str, Callable[[], torch.Tensor]] = {
        "cores.scan sequential": lambda: linear_scan(a, b, h0, "sequential"),
        "cores.scan parallel": lambda: linear_scan(a, b, h0, "parallel"),
        "autograd step loop": lambda: linear_scan_loop(a, b, h0),
    }
    try:
        from torch._higher_order_ops.associative_scan import associative_scan

        def combine(x: tuple, y: tuple) -> tuple:
            return x[0] * y[0], y[0] * x[1] + y[1]

        kernels["torch associative_scan"] = lambda: associative_scan(
            combine, (a, b), dim=0, combine_mode="generic"
        )[1]
    except ImportError:  # a PyTorch without the prototype API
        pass
    reference = linear_scan_loop(a, b, h0).detach()
    errors, times = {}, {name: [] for name in kernels}
    for name, fn in kernels.items():  # warm-up and accuracy
        h = fn()
        errors[name] = float((h.detach() - reference).abs().max())
        h.sum().backward()
    for rep in range(reps):
        for name in list(kernels) if rep % 2 == 0 else list(kernels)[::-1]:
            a.grad = b.grad = None
            start = time.process_time()
            kernels[name]().sum().backward()
            times[name].append(time.process_time() - start)
    base = min(times["cores.scan sequential"])
    lines = [
        f"linear scan kernels: forward+backward, T={T} B={B} H={H}, {reps} rounds, minimum cpu ms",
        f"{'kernel':<26}{'cpu ms':>9}{'x seq':>8}  max |h - loop|",
    ]
    for name, values in times.items():
        lines.append(
            f"{name:<26}{min(values) * 1e3:>9.1f}{min(values) / base:>7.2f}x  {errors[name]:.1e}"
        )
    return "\n".join(lines)


TANH_SHAPES = ((8, 64), (64, 64), (256, 64), (8, 32, 64), (8, 200, 64))
"""Policy-step, minibatch-head and attention-score shapes of the RL track."""


def tanh_routes(reps: int, shapes: tuple[tuple[int, ...], ...] = TANH_SHAPES) -> Table:
    """Forward+backward of ``torch.tanh`` against ``2 sigmoid(2 z) - 1`` (the route
    :func:`cores.fast_tanh.tanh` takes from ``SIGMOID_FROM`` elements) per shape; interleaved
    rounds of 50 calls, minimum process CPU time, one table (printed as it comes)."""
    from memcores.cores.fast_tanh import SIGMOID_FROM, _TanhViaSigmoid

    routes = {"torch.tanh": torch.tanh, "via sigmoid": _TanhViaSigmoid.apply}
    title = (
        f"tanh routes: forward+backward, {reps} rounds of 50 calls, minimum cpu us per call; "
        f"cores.fast_tanh takes the sigmoid route from {SIGMOID_FROM} elements"
    )
    print(title)
    print(f"{'shape':<16}{'elements':>9}{'torch.tanh':>12}{'via sigmoid':>13}{'ratio':>8}")
    columns = ["shape", "elements", "`torch.tanh` (us)", "via sigmoid (us)", "ratio"]
    table = Table(title, columns, [])
    for shape in shapes:
        z = torch.randn(*shape).requires_grad_(True)
        grad = torch.ones(*shape)
        best = {name: float("inf") for name in routes}
        for rep in range(reps + 1):  # round 0 warms up
            for name in list(routes) if rep % 2 == 0 else list(routes)[::-1]:
                start = time.process_time()
                for _ in range(50):
                    routes[name](z).backward(grad)
                if rep:
                    best[name] = min(best[name], (time.process_time() - start) / 50)
        native, via = best["torch.tanh"], best["via sigmoid"]
        name = "x".join(map(str, shape))
        print(
            f"{name:<16}{z.numel():>9}{native * 1e6:>12.1f}{via * 1e6:>13.1f}{native / via:>7.2f}x",
            flush=True,
        )
        table.rows.append(
            [name, f"{z.numel():,}", f"{native * 1e6:.1f}", f"{via * 1e6:.1f}",
             f"{native / via:.2f}x"]
        )  # fmt: skip
    return table


def _parser() -> argparse.ArgumentParser:
    """The command line of ``memcores bench cores``."""
    parser = argparse.ArgumentParser(
        prog="memcores bench cores", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--T", type=positive_int, default=256, help="sequence length")
    parser.add_argument("--B", type=positive_int, default=64, help="batch size")
    parser.add_argument("--D", type=positive_int, default=128, help="input size")
    parser.add_argument("--H", type=positive_int, default=128, help="hidden size")
    parser.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    parser.add_argument("--reps", type=positive_int, default=7, help="interleaved rounds")
    parser.add_argument(
        "--stat",
        choices=list(STATS),
        default="median",
        help="median: medians of times and of paired per-round ratios; min: fastest round "
        "and ratios of the minima (steadier on a noisy virtual machine with many --reps)",
    )
    parser.add_argument(
        "--cores",
        default="all",
        help="comma-separated core names or 'all'; name:option=value runs a core with options "
        "and compares it with the same core's defaults (rel_lstm:impl=loop)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and inputs")
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda, cuda:N or auto (default cpu); on a GPU "
        "the times are to the end of the queued kernels",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke mode: T=16 B=4 D=H=16, 1 thread, 1 round"
    )
    parser.add_argument(
        "--scan",
        action="store_true",
        help="time the linear-scan kernels of cores/scan.py (T, B, H, reps) instead of cores",
    )
    parser.add_argument(
        "--acting",
        action="store_true",
        help="time --T single acting steps of --B envs (no grad, warm state) instead of "
        "forward+backward over T",
    )
    parser.add_argument(
        "--tanh",
        action="store_true",
        help="time torch.tanh against the sigmoid route of cores/fast_tanh.py instead of cores",
    )
    add_record_arguments(parser, "cores")
    return parser


def _core_names(spec: str) -> list[str]:
    """The cores ``--cores`` names, each checked against :data:`cores.CORES`.

    :raises ValueError: a name is not a core.
    """
    names = sorted(CORES) if spec == "all" else spec.split(",")
    unknown = [n for n in names if parse_core_spec(n)[0] not in CORES]
    if unknown:
        raise ValueError(f"unknown core(s) {unknown}; valid cores: {', '.join(sorted(CORES))}")
    return names


def _bench_threads(
    names: list[str], args: argparse.Namespace, device: torch.device, n: int, notes: list[str]
) -> Table:
    """Time the cores with ``n`` torch threads, print their tables, return the record's (and
    append the acting target's line, when it was measured, to ``notes``)."""
    torch.set_num_threads(n)
    build = build_acting_runs if args.acting else build_runs
    runs, errors = build(names, args.T, args.B, args.D, args.H, args.seed, device)
    samples = measure(runs, args.reps, device)
    print()
    print(format_table(samples, n, args.stat))
    acting = format_acting_target(samples, args.stat) if args.acting else None
    if acting:
        print(acting)
        notes.append(f"threads={n}: {acting}")
    split = format_refine_split(samples, args.stat)
    if split:
        print(split)
    speedup = format_speedup(samples, args.stat)
    if speedup:
        print(speedup)
    for name, err in errors.items():
        print(f"{name:<14}skipped ({err})")
    return result_table(samples, n, args.stat)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    device = resolve_device(args.device)
    if args.tanh:
        table = tanh_routes(1 if args.quick else args.reps)
        out = record_folder(args, "tanh")
        write_record(out, bench="tanh", argv=["cores", *argv], tables=[table])
        return 0
    if args.quick:
        args.T, args.B, args.D, args.H, args.threads, args.reps = 16, 4, 16, 16, "1", 1
    if args.scan:
        print(scan_kernels(args.T, args.B, args.H, args.reps, args.seed))
        return 0
    names = _core_names(args.cores)
    threads = [int(t) for t in args.threads.split(",")]
    old_threads = torch.get_num_threads()
    what = f"{args.T} acting steps (no grad, warm state)" if args.acting else "forward+backward"
    print(
        f"bench cores: {what}, T={args.T} B={args.B} D={args.D} H={args.H}, "
        f"{args.reps} interleaved rounds (A B B A), {STATS[args.stat]}; "
        f"device {device}; torch {torch.__version__}; "
        f"malloc keeps freed memory: {'yes' if keep_freed_memory() else 'no'} ({ENV_VAR})"
    )
    notes = [f"{what}, T={args.T} B={args.B} D={args.D} H={args.H}, {args.reps} rounds"]
    try:
        tables = [_bench_threads(names, args, device, n, notes) for n in threads]
    finally:
        torch.set_num_threads(old_threads)
    write_record(
        record_folder(args, "cores"),
        bench="cores",
        argv=["cores", *argv],
        tables=tables,
        notes=notes,
    )
    return 0
