"""``memcores diagnose SOURCE... [key=value ...] --out profile.png``.

Two diagnostics from the papers, for one or several models on the same figure:

- the gradient-vs-lag profile ``||dL/dx_t||`` against the lag ``T - 1 - t`` between input step
  ``t`` and the last output (Ohno & Kumagai, Sec. IV-A): exponential decay is a straight line on
  the semi-log panel, polynomial decay a straight line on the log-log panel;
- the histogram of forget-gate time scales ``-1/log phi(b_f)`` (fast-gate paper Fig. 5, UR-gates
  Fig. 4), for cores that have a forget gate.

A SOURCE is a config YAML (models at initialisation, one per core in ``--cores`` or the
config's core) or a run directory (the trained checkpoint; with ``--before-after`` also the
weights at step 0). Arguments containing ``=`` are config overrides (``task.length=1000``).
The profile values are also written as CSV next to the PNG, and a fit of each profile to an
exponential and to a power law is printed.

By default the models are probed in eval mode (deterministic). ``--train-draws N`` probes them
in training mode instead and averages the profile over N draws (seeds ``--seed`` to
``--seed + N - 1``), which shows what training-only behaviour does to the gradient: h-detach's
stochastic detaching of ``h_{t-1}``, the LRU's online gradient rule.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
from pathlib import Path

import numpy as np

from memcores.experiments.argtypes import output_file, positive_int, seed
from memcores.experiments.config import config_path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sources",
        nargs="+",
        help="config YAML files and/or run directories; KEY=VALUE items are config overrides",
    )
    parser.add_argument(
        "--cores", help="comma-separated cores to build from each config (default: its core)"
    )
    parser.add_argument(
        "--out", default="profile.png", type=output_file, help="output PNG (default profile.png)"
    )
    parser.add_argument(
        "--batch", type=positive_int, default=64, help="sequences in the probe batch"
    )
    parser.add_argument("--seed", type=seed, default=0, help="seed of the initial weights")
    parser.add_argument(
        "--before-after",
        action="store_true",
        help="for run directories: also show the weights at step 0 (init.pt)",
    )
    parser.add_argument(
        "--normalize", action="store_true", help="divide each profile by its largest value"
    )
    parser.add_argument(
        "--train-draws",
        type=int,
        default=0,
        metavar="N",
        help="probe in training mode (h-detach draws, online rules), averaging N draws "
        "(default 0: eval mode)",
    )


@dataclasses.dataclass
class Probe:
    """One model's diagnostics: ``grad [T]`` by input step, ``log10`` of the forget-gate time
    scales ``[H]`` (None without a forget gate; logs keep saturated fast-gate units finite)."""

    label: str
    grad: np.ndarray
    log10_timescales: np.ndarray | None
    length: int


def run(args: argparse.Namespace) -> int:
    overrides = [s for s in args.sources if "=" in s and not Path(s).exists()]
    sources = [s for s in args.sources if s not in overrides]
    if not sources:
        raise ValueError("give at least one config YAML or run directory")
    if args.batch <= 0:
        raise ValueError(f"--batch must be positive, got {args.batch}")
    if args.train_draws < 0:
        raise ValueError(f"--train-draws must be >= 0, got {args.train_draws}")
    cores = [c for c in (args.cores or "").split(",") if c]
    probes: list[Probe] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            if cores:
                raise ValueError("--cores applies to config files, not to run directories")
            probes += _probe_run(path, overrides, args)
        elif config_path(path).is_file():  # a file, or a shipped config by name
            probes += _probe_config(config_path(path), overrides, cores, args)
        else:
            raise FileNotFoundError(
                f"{source}: no such config file or run directory (shipped configs by name: "
                "`memcores list configs`)"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _plot(probes, out, args.normalize)
    _write_csv(probes, out.with_suffix(".csv"))
    _print_summary(probes)
    print(f"wrote {out} and {out.with_suffix('.csv')}")
    return 0


# --------------------------------------------------------------------------- probing
def _probe_config(path: Path, overrides: list[str], cores: list[str], args) -> list[Probe]:
    import torch

    from memcores.agents import supervised
    from memcores.agents.supervised_config import SupervisedConfig
    from memcores.cores import core_options
    from memcores.experiments.config import load_config

    _require_supervised(path)
    config = load_config(SupervisedConfig, path, overrides)
    task = supervised.build_task(config)
    probes = []
    for core in cores or [config.core.name]:
        cfg = config
        if core != config.core.name:  # keep the config's options this core also accepts
            accepted = core_options(core)
            options = {k: v for k, v in config.core.options.items() if k in accepted}
            cfg = dataclasses.replace(
                config, core=dataclasses.replace(config.core, name=core, options=options)
            )
        torch.manual_seed(args.seed)
        model = supervised.build_model(cfg, task)
        probes.append(_probe(model, task, f"{core} (init)", args))
    return probes


def _probe_run(run_dir: Path, overrides: list[str], args) -> list[Probe]:
    from memcores.agents import supervised
    from memcores.agents.checkpoint import checkpoint_path, load_checkpoint
    from memcores.agents.supervised_config import SupervisedConfig
    from memcores.experiments.config import load_config

    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.yaml)")
    _require_supervised(config_path, run_dir)
    config = load_config(SupervisedConfig, config_path, overrides)
    task = supervised.build_task(config)
    name = config.core.name
    probes = []
    files = [supervised.INIT_CHECKPOINT] if args.before_after else []
    files.append(supervised.CHECKPOINT)
    for filename in files:
        payload = load_checkpoint(checkpoint_path(run_dir, filename))
        model = supervised.build_model(config, task)
        model.load_state_dict(payload["model"])
        when = "init" if filename == supervised.INIT_CHECKPOINT else f"step {payload['step']}"
        probes.append(_probe(model, task, f"{name} ({when})", args))
    return probes


RL_SECTIONS = ("env", "agent")
"""Sections of a ``memcores train`` config that a supervised config does not have."""


def _require_supervised(config_path: Path, run_dir: Path | None = None) -> None:
    """Refuse an RL config or run (``memcores train``) with a message that says what
    ``diagnose`` takes, instead of an unknown-key error about its ``env`` section."""
    from memcores.experiments.config import read_yaml_mapping

    raw = read_yaml_mapping(config_path)
    if "task" not in raw and any(section in raw for section in RL_SECTIONS):
        what = f"{run_dir} is an RL run" if run_dir else f"{config_path} is an RL config"
        raise ValueError(
            f"{what} (memcores train); memcores diagnose takes supervised configs and runs "
            "(memcores supervised)"
        )


def _probe(model, task, label: str, args) -> Probe:
    """Gradient profile on a fixed probe batch and the forget-gate time scales of ``model``:
    in eval mode, or with ``args.train_draws > 0`` the mean over that many training-mode draws."""
    import torch

    from memcores.agents import supervised
    from memcores.cores.diagnostics import input_gradient_profile

    batch = next(supervised.eval_batches(task, "valid", args.batch, args.batch))
    tb = supervised.batch_to_torch(batch, next(model.parameters()).device)

    def model_fn(x):
        return model(x, task.window)

    def loss_fn(out):
        return supervised.loss_and_metrics(task.loss, out, tb)[0]

    if args.train_draws == 0:
        model.eval()  # deterministic (h-detach off); gradients still flow
        grad = input_gradient_profile(model_fn, tb["x"], loss_fn).double()
    else:
        model.train()
        label = f"{label}, train mode x{args.train_draws}"
        draws = []
        for k in range(args.train_draws):
            torch.manual_seed(args.seed + k)
            draws.append(input_gradient_profile(model_fn, tb["x"], loss_fn).double())
        grad = torch.stack(draws).mean(0)
    log_ts = supervised.forget_log_timescales(model.core)
    log10_ts = None if log_ts is None else (log_ts / math.log(10.0)).cpu().numpy()
    return Probe(label, grad.cpu().numpy(), log10_ts, task.length)


# --------------------------------------------------------------------------- outputs
def _lags(probe: Probe) -> np.ndarray:
    """Lag of input step t behind the last output: ``T - 1 - t``."""
    return probe.length - 1 - np.arange(probe.length)


def _plot(probes: list[Probe], out: Path, normalize: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_ts = any(p.log10_timescales is not None for p in probes)
    ncols = 3 if has_ts else 2
    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols, 4.2))
    for probe in probes:
        g = probe.grad / probe.grad.max() if normalize and probe.grad.max() > 0 else probe.grad
        lag = _lags(probe)
        keep = g > 0
        axes[0].semilogy(lag[keep], g[keep], label=probe.label, lw=1.2)
        axes[1].loglog(lag[keep] + 1, g[keep], label=probe.label, lw=1.2)
    ylabel = r"$\|\partial L/\partial x_t\|$" + (" / max" if normalize else "")
    axes[0].set(xlabel="lag T-1-t (steps)", ylabel=ylabel, title="gradient vs lag (semi-log)")
    axes[1].set(xlabel="lag + 1 (steps)", ylabel=ylabel, title="gradient vs lag (log-log)")
    for ax in axes[:2]:
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    if has_ts:
        values = np.concatenate(
            [p.log10_timescales for p in probes if p.log10_timescales is not None]
        )
        lo, hi = min(values.min(), -1.0), max(values.max(), 1.0)
        bins = np.linspace(lo - 0.1, hi + 0.1, 41)
        for probe in probes:
            if probe.log10_timescales is not None:
                axes[2].hist(
                    probe.log10_timescales, bins=bins, histtype="step", lw=1.5, label=probe.label
                )
        axes[2].set(
            xlabel=r"$\log_{10}$ forget-gate time scale $-1/\log\,\phi(b_f)$ (steps)",
            ylabel="units",
            title="gate time scales",
        )
        axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def _write_csv(probes: list[Probe], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["label", "lag", "grad_norm"])
        for probe in probes:
            for lag, g in zip(_lags(probe), probe.grad, strict=True):
                writer.writerow([probe.label, int(lag), f"{g:.6e}"])


def decay_fits(probe: Probe) -> dict[str, float]:
    """Least-squares fits of ``log g`` against the lag (exponential) and ``log(lag+1)`` (power).

    :return: ``exp_rate`` (per step), ``exp_r2``, ``power_exponent``, ``power_r2`` and
        ``ratio`` = g(largest lag) / g(lag 0).
    """
    lag = _lags(probe).astype(float)
    g = probe.grad
    keep = (g > 0) & np.isfinite(g)
    if keep.sum() < 3:
        return {}
    y = np.log(g[keep])
    # g is indexed by input step t, so g[0] is the largest lag and g[-1] lag 0.
    out = {"ratio": float(g[keep][0] / g[keep][-1])}
    for name, x in (("exp", lag[keep]), ("power", np.log1p(lag[keep]))):
        slope, intercept = np.polyfit(x, y, 1)
        resid = y - (slope * x + intercept)
        r2 = 1.0 - resid.var() / y.var() if y.var() > 0 else 1.0
        out[f"{name}_{'rate' if name == 'exp' else 'exponent'}"] = float(-slope)
        out[f"{name}_r2"] = float(r2)
    return out


def _print_summary(probes: list[Probe]) -> None:
    head = f"{'model':<28}{'g(T-1)/g(0)':>12}{'exp rate':>10}{'R2':>7}{'power k':>9}{'R2':>7}"
    print(head + f"{'ts median':>11}{'ts max':>10}")
    for probe in probes:
        fit = decay_fits(probe)
        line = f"{probe.label:<28}"
        if fit:
            line += f"{fit['ratio']:>12.3g}{fit['exp_rate']:>10.4f}{fit['exp_r2']:>7.3f}"
            line += f"{fit['power_exponent']:>9.3f}{fit['power_r2']:>7.3f}"
        if probe.log10_timescales is not None:
            log10_ts = probe.log10_timescales
            line += f"{_power_of_ten(np.median(log10_ts)):>11}{_power_of_ten(log10_ts.max()):>10}"
        print(line)


def _power_of_ten(log10_value: float) -> str:
    """``10 ** log10_value`` as ``%.3g`` when a float holds it, else ``1e+NNNN`` (saturated)."""
    if log10_value < 300:
        return f"{10.0**log10_value:.3g}"
    return f"1e+{log10_value:.0f}"
