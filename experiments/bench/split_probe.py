"""``memcores bench gpu --parts probe``: the unit-split kernels' variants, timed side by side.

The fused kernels' unit split (:mod:`cores.triton_gates`) leaves the gated presets above
cuDNN's ``nn.LSTM``. This part times forward+backward of ``ur_lstm``, ``fast_gru`` and
``slstm`` through the fused kernels under each variant of
:class:`cores.triton_gates.SplitOptions` (:data:`VARIANTS`: the barrier that marks a part's
step with a ``release`` reduction and waits with ``acquire`` reads, the one that waits on the
exchanged values themselves, a step's own inputs read after the barrier instead of before it,
both of the last two, 4 warps per program against the default's 8 at these hidden sizes, parts
of 32 and of 64 units against the default's 16, and the default launched as a cooperative
grid), beside the default and cuDNN's modules, at two shapes: the cores table's (T=256, B=64,
input 64, hidden 128) and a POPGym update's minibatch (T=1024, B=8, hidden 256). Each variant's
outputs and parameter gradients are compared with the default's (largest difference over the
largest value), so a faster variant that changes the numbers shows it. The default of each core
and the cuDNN modules are also profiled (:func:`kernel_times`): each kernel's time per call
beside the wall time, so the table says where a step's time goes (forward or backward kernel,
the matmuls outside them, or the GPU waiting on launches).
Not in the default run; its budget is 150 s. Each variant compiles kernels of its own, on CUDA
first all side by side in worker processes (:mod:`experiments.bench.warm`).
"""

from __future__ import annotations

from typing import Any

import torch

from experiments.bench.warm import Launch, warm_part
from experiments.bench.warm import markdown as warm_markdown

PROBE_CORES = ("ur_lstm", "fast_gru", "slstm")
BASELINE_OF = {"ur_lstm": "nn.LSTM", "fast_gru": "nn.GRU", "slstm": "nn.LSTM"}
"""The cuDNN module each probed core's target is set against, timed at the same shapes."""
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "release barrier": dict(barrier="release"),
    "data barrier": dict(barrier="data"),
    "no prefetch": dict(prefetch=False),
    "data barrier, no prefetch": dict(barrier="data", prefetch=False),
    "4 warps": dict(num_warps=4),  # 0.88-0.93x the default's 8 at hidden 128 with scalar waits
    "32 units per part": dict(units=32),
    "64 units per part": dict(units=64),
    "cooperative launch": dict(cooperative=True),
}
"""Each variant's changes to :class:`cores.triton_gates.SplitOptions`. ``data barrier`` waits on
the exchanged values themselves instead of step counters
(:func:`cores.triton_gates.meet_parts`); ``no prefetch`` reads a step's own inputs at its
start, after the barrier, and the other parts' gradients one gate block before each product.
``32 units per part`` halves the programs that meet after each step, each holding twice the
weights (no spill at 128 units with 8 warps, 32-156 bytes at 256; 72-96 KB of shared memory at
128, 144 KB at 256: more than a consumer GPU gives a block); ``64 units per part`` quarters
them (two parts at 128 units, no spill with 8 warps, 136-160 KB; at 256 units 272 KB, more than
any GPU gives a block, so there the GPU refuses the split and the row, marked so, times one
program per batch tile). ``cooperative launch`` has CUDA guarantee that a tile's parts all run
at once (the default trusts that nothing else holds a multiprocessor); at the default's speed
it would become the default.
Not among them, as an H100 has settled them: the ``scalar`` barrier (1.6-2.1x the ``vector``
wait's time), the split off (2.6-5.4x; the cores part times it) and full float32 products
(``precision="ieee"``, 1.7-2.4x the TF32 default's time)."""


def _values(name: str, shape: tuple[int, int, int, int], device: torch.device) -> torch.Tensor:
    """Outputs and every parameter's gradient of one forward+backward, flattened into one
    vector (the same weights and input for every variant)."""
    from cores import make_core

    T, B, D, H = shape
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, D, generator=gen).to(device)
    torch.manual_seed(0)
    core = make_core(name, D, H).to(device).train()
    y, _ = core(x, core.initial_state(B, device))
    y.sin().sum().backward()
    grads = [p.grad.flatten() for p in core.parameters() if p.grad is not None]
    return torch.cat([y.detach().flatten(), *grads]).double().cpu()


PROFILED_CALLS = 5
"""Forward+backward calls under :mod:`torch.profiler` per profiled row."""
NAMED_KERNELS = 4
"""A profile names its longest kernels, this many; the rest is summed as ``other``."""


def kernel_times(run: Any, device: torch.device, calls: int = PROFILED_CALLS) -> dict[str, float]:
    """Where one forward+backward's time goes: microseconds per call of each kernel that
    ``run`` launches, by name, from :mod:`torch.profiler` (on a CPU, each operator's own CPU
    time instead, so the part runs there too), longest first."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    run()  # compiled and allocated before the profile starts
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            run()
        if cuda:
            torch.cuda.synchronize(device)
    times: dict[str, float] = {}
    for event in prof.key_averages():
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if us > 0:
            times[event.key] = times.get(event.key, 0.0) + us / calls
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def _profiled(run: Any, device: torch.device, clock: Any) -> dict[str, float] | None:
    """:func:`kernel_times` of ``run`` where the part has time left for it, else ``None``."""
    return kernel_times(run, device) if clock.left() > 0 else None


def part_probe(device: torch.device, sizes: Any, clock: Any, quick: bool) -> dict:
    """ms of forward+backward per core, shape and variant, with the variant's largest
    relative difference from the default's values."""
    from cores import triton_gates
    from experiments.bench.gpu import core_runner, time_runner

    rows: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    not_measured: list[str] = []
    warmed = warm_part(probe_launches(sizes.probe_shapes), device, clock.left())
    for shape in sizes.probe_shapes:
        for baseline in dict.fromkeys(BASELINE_OF.values()):  # side by side with the variants
            if clock.left() > 0:
                run = core_runner(baseline, *shape, device)
                seconds = time_runner(run, device, sizes.reps, clock)
                rows.append(
                    dict(
                        core=baseline,
                        shape=list(shape),
                        variant="default",
                        ms=1e3 * seconds,
                        kernels_us=_profiled(run, device, clock),
                    )
                )
        for name in PROBE_CORES:
            reference = None
            for variant, changes in VARIANTS.items():
                label = f"{name} {shape} {variant}"
                if clock.left() <= 0:
                    not_measured.append(label)
                    continue
                try:
                    with triton_gates.split_options(**changes):
                        values = _values(name, shape, device)
                        run = core_runner(name, *shape, device)
                        seconds = time_runner(run, device, sizes.reps, clock)
                        # where the default's time goes, kernel by kernel
                        kernels = _profiled(run, device, clock) if variant == "default" else None
                        refused = triton_gates.split_refused(shape[3], device)
                except Exception as err:  # one failing variant must not stop the part
                    errors[label] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
                    continue
                reference = values if variant == "default" else reference
                diff = None
                if reference is not None:
                    scale = reference.abs().max().clamp_min(1e-30)
                    diff = float((values - reference).abs().max() / scale)
                rows.append(
                    dict(
                        core=name,
                        shape=list(shape),
                        variant=variant,
                        ms=1e3 * seconds,
                        diff=diff,
                        kernels_us=kernels,
                        refused=refused,
                    )
                )
    return dict(rows=rows, errors=errors, not_measured=not_measured, warm=warmed)


def probe_launches(shapes: Any) -> list[Launch]:
    """The forward+backward launches the probe times, in its order: each shape's cores under
    each variant."""
    return [
        Launch(name, tuple(shape), tuple(changes.items()))
        for shape in shapes
        for name in PROBE_CORES
        for changes in VARIANTS.values()
    ]


def markdown(part: dict[str, Any]) -> list[str]:
    """The probe's table: one row per core and shape, one column per variant (ms, and x the
    default's time); cuDNN's rows fill the default column, and each core's default says its
    multiple of its cuDNN module at that shape."""
    lines = [
        "",
        "## Unit-split kernel variants (forward+backward ms; x default; max relative difference)",
        "",
        "| core | T, B, D, H | " + " | ".join(VARIANTS) + " |",
        "|---|---|" + "---|" * len(VARIANTS),
    ]
    cells: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for row in part["rows"]:
        cells.setdefault((row["core"], str(tuple(row["shape"]))), {})[row["variant"]] = row
    for (core, shape), by_variant in cells.items():
        default = by_variant.get("default")
        base = cells.get((BASELINE_OF.get(core, ""), shape), {}).get("default")
        out = []
        for variant in VARIANTS:
            row = by_variant.get(variant)
            if row is None:
                out.append("-")
                continue
            text = f"{row['ms']:.2f}"
            if row.get("refused"):  # the GPU refused the split: one program per batch tile
                text += ", split refused"
            if variant == "default" and base is not None:
                text += f" ({row['ms'] / base['ms']:.2f}x {base['core']})"
            if default is not None and variant != "default":
                text += f" ({row['ms'] / default['ms']:.2f}x"
                text += f", {row['diff']:.0e})" if row["diff"] is not None else ")"
            out.append(text)
        lines.append(f"| {core} | {shape} | " + " | ".join(out) + " |")
    return lines + warm_markdown(part.get("warm")) + _md_kernels(part["rows"])


def _md_kernels(rows: list[dict[str, Any]]) -> list[str]:
    """One line per profiled row: its wall time per call, the kernels' summed time and the
    longest kernels by name (the rest as ``other``)."""
    profiled = [r for r in rows if r.get("kernels_us")]
    if not profiled:
        return []
    lines = [
        "",
        "Where a default forward+backward's time goes (torch.profiler, microseconds per call; "
        "on a GPU the kernels' own time, so wall minus their sum is time the GPU waited; on a "
        "CPU each operator's own time):",
        "",
    ]
    for r in profiled:
        kernels = r["kernels_us"]
        named = list(kernels.items())[:NAMED_KERNELS]
        other = sum(kernels.values()) - sum(us for _, us in named)
        parts = [f"`{name[:60]}` {us:.0f}" for name, us in named]
        if other > 0:
            parts.append(f"other {other:.0f}")
        lines.append(
            f"- {r['core']} {tuple(r['shape'])}: wall {1e3 * r['ms']:.0f}, kernels "
            f"{sum(kernels.values()):.0f}: " + ", ".join(parts)
        )
    return lines
