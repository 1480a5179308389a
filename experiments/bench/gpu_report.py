"""``bench_gpu.md``: the record of ``memcores bench gpu`` (:mod:`experiments.bench.gpu`) as
markdown, one section per part that ran."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def section(title: str, columns: list[str], note: str = "") -> list[str]:
    """A part's heading, an optional note, and its table's head."""
    head = ["", f"## {title}", ""] + ([note, ""] if note else [])
    return head + ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def cores(c: dict[str, Any]) -> list[str]:
    """The cores part: one row per core, forward+backward."""
    shape = c["shape"]
    timings = c.get("baseline_runs", {}).items()
    runs = [f"{name} " + " / ".join(map(_num, ms)) + " ms" for name, ms in timings if ms]
    against = c.get("against")
    note = (
        "Capturable cores also through CUDA graphs; ratios and targets use the better time; "
        "x own loop: the eager loop's time over the CUDA graph's. "
        + (f"record: `{against}`. " if against else "No committed record to compare. ")
    )
    if runs:
        note += f"Baselines timed before, between and after the cores: {'; '.join(runs)}."
    T, B, D, H = (shape[k] for k in "TBDH")
    title = f"Cores, forward+backward, T={T} B={B} input {D} hidden {H}"
    columns = ["core", "ms", "ms, CUDA graph", "x nn.LSTM", "x nn.GRU", "x own loop"]
    lines = section(title, [*columns, "record ms", "x record", "target"], note)
    for r in c["rows"]:
        lines.append(
            f"| {r['core']} | {_num(r['ms'])} | {_num(r.get('ms_graphed'))} "
            f"| {_x(r['x_nn_lstm'])} | {_x(r['x_nn_gru'])} | {_x(r.get('x_own_loop'))} "
            f"| {_num(r.get('record_ms'))} | {_x(r.get('x_record'))} | {r.get('target', '-')} |"
        )
    return lines


def scaling(s: dict[str, Any]) -> list[str]:
    """The scaling part: each core's cost at each sequence length."""
    lengths = [f"T={T}" for T in s["lengths"]]
    title = f"Cost against T, forward+backward ms, B={s['B']} hidden {s['H']}"
    lines = section(title, ["core", *lengths, f"{lengths[-1]} / {lengths[0]}", "target"])
    for r in s["rows"]:
        ms = {int(T): v for T, v in r["ms"].items()}  # JSON keys are strings
        cells = " | ".join(_num(ms.get(T)) for T in s["lengths"])
        lines.append(f"| {r['core']} | {cells} | {_x(r['growth'])} | {r['target']} |")
    return lines


def acting(a: dict[str, Any]) -> list[str]:
    """The acting part: one row per n_envs, then the crossover."""
    columns = ["n_envs", "CPU", "device", "device, CUDA graph", "faster", "trainer's rule"]
    lines = section("Acting step (MemoryS7 policy), microseconds", columns)
    for r in a["rows"]:
        cells = [
            f"not measured ({r[f'{w}_error']})" if f"{w}_error" in r else _num(r.get(f"us_{w}"), 0)
            for w in ("cpu", "device", "graphed")
        ]
        lines.append(
            f"| {r['n_envs']} | {' | '.join(cells)} | {r.get('faster', '-')} | {r['rule']} |"
        )
    lines.append(f"\nFirst n_envs where the device is faster: {a['crossover_n_envs']}.")
    return lines


def rl(part: dict[str, Any]) -> list[str]:
    """The RL part: frames/s per setting, device against CPU."""
    columns = ["setting", "CPU frames/s", "device frames/s", "x CPU", "x against"]
    columns += ["device: collect s / update s", "epochs timed", "acting"]
    note = (
        "A batched-env row (`env.vector=batched`) is timed on the device only, against the "
        "row it names (the fastest row without batched envs, or its own setting's)."
    )
    lines = section("RL frames/s, device against the same machine's CPU", columns, note)
    for r in part["rows"]:
        if "error" in r:
            lines.append(f"| {r['setting']} | error: {r['error']} | | | | | | |")
            continue
        d, cpu = r["device"], r.get("cpu")
        against = f"{_x(r['x_against'])} {r['against']}" if "x_against" in r else "-"
        lines.append(
            f"| {r['setting']} | {_num(cpu and cpu['fps'], 0)} | {d['fps']:.0f} "
            f"| {_x(r.get('x_cpu'))} | {against} "
            f"| {d['collect_s']:.2f} / {d['update_s']:.2f} | {d['epochs_timed']} "
            f"| {d['acting']}; {d.get('graphs', '-')} |"
        )
    return lines


def supervised(s: dict[str, Any]) -> list[str]:
    """The supervised part: seconds per update, device against CPU."""
    cpu, dev = s["cpu"], s["device"]
    title = f"Supervised copy ({s['config']} {' '.join(s['overrides'])}), core {cpu['core']}"
    return [
        *section(title, ["", "s per update", "updates timed"]),
        f"| CPU ({cpu['threads']} threads) | {cpu['s_per_update']:.3f} | {cpu['updates']} |",
        f"| device | {dev['s_per_update']:.3f} | {dev['updates']} |",
        f"\nDevice against CPU: {_x(s['x_cpu'])}.",
    ]


def not_measured(parts: dict[str, Any]) -> list[str]:
    """What the time budget skipped and what failed, if anything."""
    skipped = {k: v["not_measured"] for k, v in parts.items() if v.get("not_measured")}
    errors = {k: v["errors"] for k, v in parts.items() if v.get("errors")}
    if not (skipped or errors):
        return []
    lines = ["", "## Not measured", ""]
    lines += [f"- {k} (time budget): {', '.join(map(str, v))}" for k, v in skipped.items()]
    lines += [f"- {k}: {n}: {e}" for k, v in errors.items() for n, e in v.items()]
    return lines


# each part's renderer, in the order the parts appear in the report
SECTIONS: dict[str, Callable[[dict[str, Any]], list[str]]] = dict(
    cores=cores, scaling=scaling, acting=acting, rl=rl, supervised=supervised
)


def markdown(results: dict[str, Any]) -> str:
    """The results as markdown: the hardware and command, then one section per part that ran."""
    hw = results["hardware"]
    gpu = f" ({hw['gpu']}, CUDA {hw['cuda']})" if "gpu" in hw else ""
    lines = [
        "# memcores bench gpu\n",
        f"Device {hw['device']}{gpu}; CPU {hw['cpu']} x {hw['cpu_count']}; "
        f"torch {hw['torch']}; triton {hw['triton']}.",
        f"Command: `{results['command']}`.",
    ]
    parts = results["parts"]
    for name, render in SECTIONS.items():
        if name in parts:
            lines += render(parts[name])
    return "\n".join(lines + not_measured(parts)) + "\n"
