"""``memcores bench memory rel``: autograd memory and time of lstm vs rel_lstm vs mem_lstm.

``--cores`` runs other cores beside them (``gtrxl``, or ``gtrxl:memory_len=256`` with options,
as ``memcores bench cores`` names them). For each core and sequence length T, one forward +
backward pass over ``x [T, B, D]`` from the initial state with loss ``y.mean()``.

Memory: the bytes of the unique tensor storages that autograd saves for backward during the
forward pass (collected with ``torch.autograd.graph.saved_tensors_hooks``, deduplicated by
storage). That is the graph memory alive at the end of the forward pass, i.e. the peak that
grows with T (parameters, inputs and outputs are small next to it). Because it counts what
the graph holds rather than what the allocator reports, it is exact, unaffected by other
processes on a shared machine, and can be computed on the ``meta`` device (shapes only, no
data, no allocation): that is how MemLSTM lengths that would not fit in RAM are measured.
The test suite checks that the meta accounting equals the one on real CPU tensors.

Time: ``time.perf_counter`` around the same forward + backward on real CPU tensors (one
thread; the hook's cost is a dict insert per saved tensor), for rows predicted (quadratic
extrapolation from the previous length) to fit in ``--max-gb``; the others are measured on the
meta device, memory only, and print ``skip``. On a shared machine compare ratios within one
run, not absolute seconds.
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from memcores.cores import CORES, make_core
from memcores.cores.base import MemoryCore
from memcores.experiments.argtypes import positive_int
from memcores.experiments.bench.cores import parse_core_spec
from memcores.experiments.bench.record import (
    Table,
    add_record_arguments,
    record_folder,
    write_record,
)

CORE_NAMES = ("lstm", "rel_lstm", "mem_lstm")


class _TorchLSTM(MemoryCore):
    """Fallback baseline (``torch.nn.LSTM``) for when the registered ``lstm`` cannot be built."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        self.lstm = nn.LSTM(input_size, hidden_size)

    def initial_state(self, batch_size: int, device=None) -> tuple[Tensor, ...]:
        z = torch.zeros(batch_size, self.hidden_size, device=device)
        return z, z.clone()

    def forward(self, x, state, starts=None):
        h, c = state
        y, (h, c) = self.lstm(x, (h.unsqueeze(0), c.unsqueeze(0)))
        return y, (h[0], c[0])


def build_core(name: str, input_size: int, hidden_size: int, T: int, nu: int, rho: int):
    """The core benchmarked under ``name`` (mem_lstm gets ``max_len = T``: full attention; a
    name beyond :data:`CORE_NAMES` is built by ``make_core``, ``name:option=value`` with
    those options)."""
    if name not in CORE_NAMES:
        base, options = parse_core_spec(name)
        return make_core(base, input_size, hidden_size, **options)
    if name == "rel_lstm":
        return make_core(name, input_size, hidden_size, nu=nu, rho=rho)
    if name == "mem_lstm":
        return make_core(name, input_size, hidden_size, max_len=T)
    try:
        return make_core("lstm", input_size, hidden_size)
    except (ImportError, AttributeError) as err:  # cores.gated not available yet
        print(f"  (lstm: registered core unavailable ({err}); using torch.nn.LSTM)")
        return _TorchLSTM(input_size, hidden_size)


def graph_bytes(core: MemoryCore, T: int, B: int, device: str = "cpu") -> int:
    """Bytes of the unique storages autograd saves during ``core``'s forward over ``[T, B, D]``.

    Runs a copy of ``core`` on ``device`` (``"meta"`` for shape-only accounting).
    """
    return measure(copy.deepcopy(core).to(device), T, B, device)[0]


def measure(core: MemoryCore, T: int, B: int, device: str = "cpu") -> tuple[int, float]:
    """One forward + backward of ``core`` over ``[T, B, D]`` from the initial state.

    :return: bytes of the unique storages autograd saved during the forward pass, and the
        ``time.perf_counter`` seconds of forward + backward (meaningless on ``meta``).
    """
    x = torch.randn(T, B, core.input_size, device=device)
    state = core.initial_state(B, device)
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        st = t.untyped_storage()
        storages[st._cdata] = st.nbytes()  # _cdata: the storage's identity (works on meta)
        return t

    core.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y, _ = core(x, state)
        loss = y.mean()
    loss.backward()
    return sum(storages.values()), time.perf_counter() - start


@dataclass
class Row:
    core: str
    T: int
    graph_bytes: int
    seconds: float | None


def run(
    lengths: list[int],
    batch: int,
    hidden: int,
    input_size: int,
    nu: int,
    rho: int,
    max_gb: float,
    cores: tuple[str, ...] = CORE_NAMES,
) -> list[Row]:
    """Measure every (core, T) pair.

    A pair runs on real CPU tensors (memory and time in one pass) when a quadratic
    extrapolation from the core's previous length predicts its graph fits in ``max_gb``;
    otherwise only its memory is measured, on the meta device.
    """
    rows = []
    budget = max_gb * 2**30
    for name in cores:
        previous: tuple[int, int] | None = None  # (T, bytes) of the last measured length
        for T in sorted(lengths):
            torch.manual_seed(0)
            core = build_core(name, input_size, hidden, T, nu, rho)
            guess = 0 if previous is None else previous[1] * (T / previous[0]) ** 2
            nbytes = seconds = None
            if guess > budget:
                try:
                    nbytes = graph_bytes(core, T, batch, "meta")
                except (NotImplementedError, RuntimeError) as err:  # e.g. autocast on meta
                    print(f"  ({name} cannot run on meta: {err}; measuring on CPU)")
            if nbytes is None:
                nbytes, seconds = measure(core, T, batch, "cpu")
            previous = (T, nbytes)
            rows.append(Row(name, T, nbytes, seconds))
            shown = "memory only (meta)" if seconds is None else f"{seconds:.3f} s"
            print(f"  measured {name} T={T}: {nbytes / 2**20:.1f} MB, {shown}", flush=True)
    return rows


def format_table(rows: list[Row], max_gb: float) -> str:
    """The results table plus memory ratios and growth factors."""
    out = [
        f"{'core':<9} {'T':>6} {'graph MB':>10} {'kB/step':>9} {'fwd+bwd s':>10} {'ms/step':>8}",
    ]
    for r in rows:
        mb, kb_step = r.graph_bytes / 2**20, r.graph_bytes / 2**10 / r.T
        if r.seconds is None:
            secs, ms = f"skip>{max_gb:g}GB", "-"
        else:
            secs, ms = f"{r.seconds:.3f}", f"{1000 * r.seconds / r.T:.2f}"
        out.append(f"{r.core:<9} {r.T:>6} {mb:>10.1f} {kb_step:>9.1f} {secs:>10} {ms:>8}")
    by = {(r.core, r.T): r for r in rows}
    lengths = sorted({r.T for r in rows})
    out.append("")
    out.append("memory ratio mem_lstm / rel_lstm and rel_lstm / lstm:")
    for T in lengths:
        rel, mem, lstm = by.get(("rel_lstm", T)), by.get(("mem_lstm", T)), by.get(("lstm", T))
        parts = [f"  T={T:<5}"]
        if rel and mem:
            parts.append(f"mem/rel = {mem.graph_bytes / rel.graph_bytes:7.1f}x")
        if rel and lstm:
            parts.append(f"rel/lstm = {rel.graph_bytes / lstm.graph_bytes:5.1f}x")
        if rel and mem and rel.seconds and mem.seconds:
            parts.append(f"time mem/rel = {mem.seconds / rel.seconds:5.1f}x")
        out.append("  ".join(parts))
    out.append("growth of graph memory from the shortest to the longest T (linear = T ratio):")
    if len(lengths) > 1:
        lo, hi = lengths[0], lengths[-1]
        for name in sorted({r.core for r in rows}):
            if (name, lo) in by and (name, hi) in by:
                g = by[(name, hi)].graph_bytes / by[(name, lo)].graph_bytes
                out.append(f"  {name:<9} x{g:8.1f} for T x{hi / lo:g}")
    return "\n".join(out)


def result_table(rows: list[Row]) -> Table:
    """Graph MB per length and core, and the ``mem_lstm / rel_lstm`` memory ratio."""
    by = {(r.core, r.T): r.graph_bytes / 2**20 for r in rows}
    names = list(dict.fromkeys(r.core for r in rows))
    table_rows = []
    for T in sorted({r.T for r in rows}):
        cells = [f"{by[n, T]:.1f}" if (n, T) in by else "-" for n in names]
        ratio = (
            f"{by['mem_lstm', T] / by['rel_lstm', T]:.1f}x"
            if ("mem_lstm", T) in by and ("rel_lstm", T) in by
            else "-"
        )
        table_rows.append([str(T), *cells, ratio])
    columns = ["T", *(f"{n} MB" for n in names), "mem / rel"]
    if not {"mem_lstm", "rel_lstm"} <= set(names):  # the ratio column needs both
        columns, table_rows = columns[:-1], [row[:-1] for row in table_rows]
    return Table("bytes autograd saves for one forward+backward", columns, table_rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="memcores bench memory rel", description=__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[250, 500, 1000, 2000])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--input-size", type=int, default=8)
    parser.add_argument("--nu", type=int, default=5, help="rel_lstm buffer length")
    parser.add_argument("--rho", type=int, default=5, help="rel_lstm relevant-set size")
    parser.add_argument(
        "--max-gb", type=float, default=2.5, help="time only rows whose graph fits in this"
    )
    parser.add_argument(
        "--threads", type=positive_int, default=1, help="torch CPU threads for timing"
    )
    parser.add_argument(
        "--cores",
        default=",".join(CORE_NAMES),
        help="comma-separated cores (name or name:option=value); default: " + ",".join(CORE_NAMES),
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    add_record_arguments(parser, "memory_rel")
    args = parser.parse_args(argv)
    cores = tuple(args.cores.split(","))
    unknown = [n for n in cores if parse_core_spec(n)[0] not in CORES]
    if unknown:
        parser.error(f"unknown core(s) {unknown}; valid cores: {', '.join(sorted(CORES))}")
    if args.quick:
        args.lengths, args.batch, args.hidden = [20, 40], 2, 16
    torch.set_num_threads(args.threads)
    print(
        f"forward+backward, B={args.batch}, H={args.hidden}, D={args.input_size}, "
        f"rel_lstm nu={args.nu} rho={args.rho}, mem_lstm max_len=T, threads={args.threads}; "
        "graph MB = bytes autograd saves for backward"
    )
    rows = run(
        args.lengths,
        args.batch,
        args.hidden,
        args.input_size,
        args.nu,
        args.rho,
        args.max_gb,
        cores,
    )
    print(format_table(rows, args.max_gb))
    write_record(
        record_folder(args, "memory_rel"),
        bench="memory_rel",
        argv=["memory", "rel", *argv],
        tables=[result_table(rows)],
        notes=[
            f"B={args.batch} H={args.hidden} D={args.input_size}, rel_lstm nu={args.nu} "
            f"rho={args.rho}, mem_lstm max_len=T, other cores at their defaults unless named "
            "with options; graph bytes are exact (meta device), times are one run each",
        ],
        numbers={
            f"{r.core}/{r.T}": {"graph_bytes": r.graph_bytes, "seconds": r.seconds} for r in rows
        },
    )
    return 0
