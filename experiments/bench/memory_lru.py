"""``memcores bench memory lru``: peak memory of one LRU training step, BPTT vs streaming online.

For each sequence length T it measures, on CPU, the peak memory of

- ``bptt``: one training step with ``grad="bptt"`` (forward over ``[T, B, D]`` + backward);
- ``online-seq``: the same with ``grad="online"`` (one ``loss.backward()`` over the sequence;
  same gradients as streaming, but it keeps the sequence's activations like BPTT does);
- ``online-stream``: one training step with :class:`agents.online.StreamingOnlineTrainer`
  (one time step at a time, backward as each step's loss arrives, inputs generated on the fly);
- ``infer-seq``: inference alone, ``core.eval()`` + ``torch.no_grad()`` over ``[T, B, D]``;
- ``infer-stream``: inference alone, one step at a time under ``torch.no_grad()``.

Every step has a loss (MSE of a linear decoder to random targets). No optimizer step: its
state does not depend on T or on the method.

**How memory is measured.** :class:`LiveTensorBytes`, a ``TorchDispatchMode`` that sees every
tensor allocated by an operator (including those of backward and of custom autograd functions)
and a weak-reference callback on each storage that fires when it is freed, reports the peak of
the sum of live tensor bytes during the step. (PyTorch's own ``MemTracker`` does the same but
refuses modules called more than once per step, as streaming does.) The total counts the
parameters, gradients, inputs, states, traces, saved activations and temporaries; it does not
count allocator caching or fragmentation (on CPU PyTorch returns freed blocks to ``malloc``), nor
Python objects. "excl. params" subtracts the parameter bytes, which are identical in every row.
Each configuration runs in the same process, one after another, after ``gc.collect()``.

Criteria printed at the end (the online-LRU paper's claims): the streaming online step stays flat
(peak at the largest T <= 1.1x the peak at the smallest T), is within 2.5x of inference
(reported against both inference variants), and BPTT grows with T.
"""

from __future__ import annotations

import argparse
import gc
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from memcores.agents.online import StreamingOnlineTrainer
from memcores.cores.lru import LRUCore
from memcores.experiments.argtypes import positive_int
from memcores.experiments.bench.record import (
    Table,
    add_record_arguments,
    markdown_table,
    record_folder,
    write_record,
)

MiB = 2**20
METHODS = ("bptt", "online-seq", "online-stream", "infer-seq", "infer-stream")


class LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of live tensor storages created by operators while active.

    Every operator output's storage is recorded once, and a ``weakref.finalize`` on the storage
    subtracts its bytes when it is freed (PyTorch keeps one Python object per storage alive as
    long as the storage, so the callback fires exactly when the memory is released). Tensors that
    exist before entering (parameters) are added with :meth:`add`. Views share their storage and
    are not double counted. Dispatch modes also see the ops of backward and of custom autograd
    functions.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.current = 0
        self.peak = 0

    def add(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        if st in self.seen:
            return
        n = st.nbytes()
        self.seen[st] = n
        self.current += n
        self.peak = max(self.peak, self.current)
        weakref.finalize(st, self._free, n)

    def _free(self, n: int) -> None:
        self.current -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.add(t)
        return out


def _inputs(t_len: int, batch: int, d_in: int, d_out: int, seed: int) -> Iterator[tuple]:
    """``(x_t [B, D], target_t [B, d_out])`` generated one step at a time."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(t_len):
        yield torch.randn(batch, d_in, generator=g), torch.randn(batch, d_out, generator=g)


def _run(method: str, core: LRUCore, decoder: torch.nn.Module, t_len: int, batch: int) -> None:
    d_in, d_out = core.input_size, decoder.out_features
    core.zero_grad(set_to_none=True)
    decoder.zero_grad(set_to_none=True)
    if method in ("bptt", "online-seq"):
        core.grad = "bptt" if method == "bptt" else "online"
        core.train()
        pairs = list(_inputs(t_len, batch, d_in, d_out, 0))
        x = torch.stack([p[0] for p in pairs])
        target = torch.stack([p[1] for p in pairs])
        del pairs
        y, _ = core(x, core.initial_state(batch))
        F.mse_loss(decoder(y), target, reduction="sum").backward()
    elif method == "online-stream":
        core.train()
        trainer = StreamingOnlineTrainer(core, decoder)
        stream = _inputs(t_len, batch, d_in, d_out, 0)
        targets: list[torch.Tensor] = []

        def xs() -> Iterator[torch.Tensor]:
            for x_t, tgt in stream:
                targets.append(tgt)
                yield x_t

        def loss_fn(t: int, out: torch.Tensor) -> torch.Tensor:
            return F.mse_loss(out, targets.pop(), reduction="sum")

        trainer.accumulate(xs(), loss_fn, trainer.initial_state(batch))
    elif method == "infer-seq":
        core.eval()
        with torch.no_grad():
            x = torch.stack([p[0] for p in _inputs(t_len, batch, d_in, d_out, 0)])
            y, _ = core(x, core.initial_state(batch))
            decoder(y)
    elif method == "infer-stream":
        core.eval()
        with torch.no_grad():
            state = core.initial_state(batch)
            for x_t, _ in _inputs(t_len, batch, d_in, d_out, 0):
                y, state = core(x_t.unsqueeze(0), state)
                decoder(y)
    else:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")


def measure(
    method: str, core: LRUCore, decoder: torch.nn.Module, t_len: int, batch: int
) -> dict[str, float]:
    """Peak live tensor bytes of one ``method`` step: ``{"total": .., "params": ..}``."""
    gc.collect()
    params = [*core.parameters(), *decoder.parameters()]
    tracker = LiveTensorBytes()
    for p in params:
        tracker.add(p)
    param_bytes = tracker.current
    with tracker:
        _run(method, core, decoder, t_len, batch)
    core.zero_grad(set_to_none=True)
    decoder.zero_grad(set_to_none=True)
    return {"total": float(tracker.peak), "params": float(param_bytes)}


def run_bench(
    lengths: list[int],
    hidden: int,
    state: int,
    layers: int,
    batch: int,
    methods: tuple[str, ...] = METHODS,
    report: Callable[[str], None] = print,
) -> dict[str, dict[int, dict[str, float]]]:
    """Measure every method at every length; returns ``{method: {T: {"total", "params"}}}``."""
    torch.manual_seed(0)
    core = LRUCore(8, hidden, state_size=state, layers=layers)
    decoder = torch.nn.Linear(hidden, 7)
    results: dict[str, dict[int, dict[str, float]]] = {m: {} for m in methods}
    for t_len in lengths:
        for m in methods:
            results[m][t_len] = measure(m, core, decoder, t_len, batch)
            report(f"  measured {m:14s} T={t_len:5d}: {results[m][t_len]['total'] / MiB:8.2f} MiB")
    return results


def result_table(results: dict[str, dict[int, dict[str, float]]]) -> Table:
    """Peak MiB per method and T (total, and excluding parameters) plus the growth ratio."""
    lengths = sorted(next(iter(results.values())))
    columns = ["method", *(f"T={t}" for t in lengths), f"T={lengths[-1]} / T={lengths[0]}"]
    rows = []
    for m, by_t in results.items():
        cells = [
            f"{by_t[t]['total'] / MiB:.2f} ({(by_t[t]['total'] - by_t[t]['params']) / MiB:.2f})"
            for t in lengths
        ]
        growth = by_t[lengths[-1]]["total"] / by_t[lengths[0]]["total"]
        rows.append([m, *cells, f"{growth:.2f}x"])
    return Table("peak MiB of one step, total (excluding parameters)", columns, rows)


def format_table(results: dict[str, dict[int, dict[str, float]]]) -> str:
    """Markdown table of peak MiB (total and excluding parameters) plus the growth ratio."""
    return markdown_table(result_table(results))


def verdicts(results: dict[str, dict[int, dict[str, float]]]) -> list[str]:
    """The criteria, each as one line with the measured ratio and PASS/FAIL."""
    lengths = sorted(next(iter(results.values())))
    lo, hi = lengths[0], lengths[-1]
    out = []
    stream = results.get("online-stream")
    if stream:
        flat = stream[hi]["total"] / stream[lo]["total"]
        out.append(f"online-stream flat: T={hi}/T={lo} = {flat:.3f}x (<= 1.1x: {_ok(flat <= 1.1)})")
        for inf in ("infer-stream", "infer-seq"):
            if inf in results:
                worst = max(stream[t]["total"] / results[inf][t]["total"] for t in lengths)
                out.append(
                    f"online-stream / {inf}: max over T = {worst:.2f}x "
                    f"(<= 2.5x: {_ok(worst <= 2.5)})"
                )
    if "bptt" in results:
        grow = results["bptt"][hi]["total"] / results["bptt"][lo]["total"]
        out.append(f"bptt grows with T: T={hi}/T={lo} = {grow:.2f}x ({_ok(grow > 2)})")
    return out


def _ok(flag: bool) -> str:
    return "PASS" if flag else "FAIL"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="memcores bench memory lru", description=__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--hidden-size", type=int, default=128, help="H")
    p.add_argument("--state-size", type=int, default=64, help="N")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--threads", type=positive_int, default=1, help="torch.set_num_threads")
    p.add_argument(
        "--quick", action="store_true", help="tiny model, T=32,64,128 (smoke test, seconds)"
    )
    add_record_arguments(p, "memory_lru")
    args = p.parse_args(argv)
    if args.quick:
        args.lengths, args.hidden_size, args.state_size = [32, 64, 128], 16, 8
        args.layers, args.batch_size = 2, 2
    if any(t < 1 for t in args.lengths):
        p.error("--lengths must be positive")
    torch.set_num_threads(args.threads)
    print(
        f"LRU memory: H={args.hidden_size} N={args.state_size} layers={args.layers} "
        f"B={args.batch_size}, float32, CPU; peak live tensor bytes (LiveTensorBytes)"
    )
    results = run_bench(
        sorted(args.lengths),
        args.hidden_size,
        args.state_size,
        args.layers,
        args.batch_size,
        tuple(args.methods),
    )
    print("\npeak MiB of one step, total (excluding parameters):\n")
    print(format_table(results))
    print()
    for line in verdicts(results):
        print(line)
    config = (
        f"H={args.hidden_size} N={args.state_size} layers={args.layers} B={args.batch_size}, "
        f"float32, {args.threads} thread(s); peak live tensor bytes (LiveTensorBytes)"
    )
    write_record(
        record_folder(args, "memory_lru"),
        bench="memory_lru",
        argv=["memory", "lru", *(argv or [])],
        tables=[result_table(results)],
        notes=[config, *verdicts(results)],
        numbers={m: {str(t): v for t, v in by_t.items()} for m, by_t in results.items()},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
