"""One core, one env, three engines: memcores' own PPO, torchrl and RLlib, side by side.

::

    python -m memcores.experiments.engines run --engine memcores --core gru --seed 0
    python -m memcores.experiments.engines run --engine torchrl --core gru --seed 0
    python -m memcores.experiments.engines run --engine rllib --core gru --seed 0
    python -m memcores.experiments.engines report           # results/engines/REPORT.md

Each ``run`` trains POPGym RepeatPreviousEasy for ``--frames`` (default 50,176: 49 batches of
1024) with the same network and PPO settings (agents.torchrl_ppo, agents.rllib_module) and
writes a record under ``results/engines/engine=<e>,core=<c>,seed=<s>/``. The RLlib run uses
two env runners on a local Ray; ``--address`` joins a running cluster instead, with one env
runner per node that offers the ``memcores_runner`` resource. ``cluster`` starts such a
cluster of two Ray nodes on this host and runs RLlib on it (the script ``rllib_cluster.sh``
shipped beside this module)::

    python -m memcores.experiments.engines cluster --core gru --frames 50176
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from memcores.experiments.core_compare import format_p, separation, welch_p
from memcores.experiments.records import find_runs, write_record

ENGINES = ("memcores", "torchrl", "rllib")
ENV_ID = "popgym/RepeatPreviousEasy-v0"
DEFAULT_FRAMES = 50_176
MEMCORES_CONFIG = "experiments/configs/sweep_popgym_150k.yaml"
RUNNER_RESOURCE = "memcores_runner"
"""The custom resource each cluster node offers once: one env runner per node."""


def _trial(engine: str, core: str, seed: int) -> str:
    return f"engine={engine},core={core},seed={seed}"


def _write_run(run_dir: Path, config: dict[str, Any], result: dict[str, Any]) -> None:
    """A run folder as memcores' trainer leaves one: ``config.yaml`` and ``progress.csv``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    with open(run_dir / "progress.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", "rollout/ep_rew_mean", "time/fps"])
        for row in result["curve"]:
            writer.writerow([row["step"], row["mmer"], row["fps"]])


def _engine_config(engine: str, core: str, seed: int, frames: int) -> dict[str, Any]:
    return {
        "engine": engine,
        "env": {"id": ENV_ID, "n_envs": 8},
        "core": {"name": core, "hidden_size": 64},
        "agent": {"algo": "ppo", "n_steps": 128, "seq_len": 32, "n_epochs": 4,
                  "minibatch_size": 256, "learning_rate": 0.001, "ent_coef": 0.01},
        "train": {"total_steps": frames, "seed": seed, "threads": 1},
    }  # fmt: skip


def run_memcores(core: str, seed: int, frames: int, run_dir: Path) -> dict[str, Any]:
    """memcores' own trainer, as the popgym_150k sweep runs it, at ``frames``."""
    command = [
        sys.executable, "-m", "memcores", "train", MEMCORES_CONFIG, f"env.id={ENV_ID}",
        f"core.name={core}", f"train.seed={seed}", f"train.total_steps={frames}",
        f"run.dir={run_dir}", "run.overwrite=true", "run.tensorboard=false",
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True)
    # wall_seconds None: the record takes frames / the trainer's own time/fps (its loop only)
    return {"wall_seconds": None, "process_seconds": round(time.perf_counter() - start, 1)}


def run_torchrl(core: str, seed: int, frames: int, run_dir: Path) -> dict[str, Any]:
    from memcores.agents.torchrl_ppo import TorchRLPPOConfig, train_torchrl_ppo

    result = train_torchrl_ppo(TorchRLPPOConfig(core=core, seed=seed, total_frames=frames))
    _write_run(run_dir, _engine_config("torchrl", core, seed, frames), result)
    return {"wall_seconds": result["wall_seconds"]}


def run_rllib(
    core: str, seed: int, frames: int, run_dir: Path, address: str | None = None
) -> dict[str, Any]:
    """RLlib PPO with two env runners (4 envs each): on a local Ray, or, with ``address``,
    on a running cluster with one runner per node offering :data:`RUNNER_RESOURCE`."""
    import ray

    from memcores.agents.rllib_module import core_ppo_config, train_rllib_ppo

    config = core_ppo_config(core, ENV_ID, seed=seed, num_env_runners=2)
    if address:
        ray.init(address=address, log_to_driver=False)
        config = config.env_runners(custom_resources_per_env_runner={RUNNER_RESOURCE: 1})
    else:
        ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        result = train_rllib_ppo(config, frames)
        nodes = [
            {"node_id": n["NodeID"], "address": n["NodeManagerAddress"], "alive": n["Alive"],
             "resources": n["Resources"]}
            for n in ray.nodes()
        ]  # fmt: skip
    finally:
        ray.shutdown()
    engine_config = _engine_config("rllib", core, seed, frames)
    engine_config["rllib"] = {"num_env_runners": 2, "num_envs_per_env_runner": 4,
                              "cluster": address or "local"}  # fmt: skip
    _write_run(run_dir, engine_config, result)
    placement = dict(result["placement"], nodes=nodes)
    runner_nodes = {runner["node_id"] for runner in placement["env_runners"]}
    print(f"rllib: {len(nodes)} Ray node(s); env runners on {len(runner_nodes)} of them")
    for runner in placement["env_runners"]:
        print(f"  env runner {runner['worker_index']} -> node {runner['node_id'][:12]}")
    print(f"  learner -> node {placement['learner']['node_id'][:12]}")
    return {"wall_seconds": result["wall_seconds"], "setup_seconds": result["setup_seconds"],
            "placement": placement}  # fmt: skip


def cmd_run(args: argparse.Namespace) -> int:
    trial = _trial(args.engine, args.core, args.seed)
    if args.address:
        trial += ",cluster=2-node"
    run_dir = Path(args.runs) / trial
    out = Path(args.results) / trial
    if args.engine == "memcores":
        extra = run_memcores(args.core, args.seed, args.frames, run_dir)
    elif args.engine == "torchrl":
        extra = run_torchrl(args.core, args.seed, args.frames, run_dir)
    else:
        extra = run_rllib(args.core, args.seed, args.frames, run_dir, args.address)
    command = "python -m memcores.experiments.engines " + " ".join(sys.argv[1:])
    # fps: frames over the training loop's wall time (RLlib's actor start-up is setup_seconds)
    wall = extra.pop("wall_seconds")
    extra["engine"] = args.engine
    write_record(run_dir, out, command=command, wall_seconds=wall, extra=extra, replace=True)
    print(f"record: {out}")
    return 0


def _memcores_reference(root: Path, core: str, frames: int) -> list[float]:
    """MMER of memcores' popgym_150k runs of ``core`` at ``frames`` (one per seed)."""
    values = []
    for folder in sorted(root.glob(f"id={ENV_ID.replace('/', '-')},name={core},seed=*")):
        rows = list(csv.DictReader(open(folder / "curve.csv")))
        at = [r for r in rows if int(r["step"]) <= frames]
        if at:
            values.append(float(at[-1]["rollout/ep_rew_mean"]))
    return values


def _mmer_column(folder: Path) -> list[str]:
    return [row["rollout/ep_rew_mean"] for row in csv.DictReader(open(folder / "curve.csv"))]


def seed_statistics(rows: list[tuple[str, str, int, float]]) -> list[str]:
    """Markdown lines: per core, each engine's final MMER over its seeds (mean, sample
    standard deviation) and Welch's p against memcores' own trainer.

    :param rows: ``(engine, core, seed, final MMER)`` of one-node runs.
    :return: a table with one row per (core, engine) of at least two seeds, for the cores
        memcores has at least two seeds of; empty when there is none.
    """
    runs: dict[tuple[str, str], dict[int, float]] = {}
    for engine, core, seed, mmer in rows:
        runs.setdefault((core, engine), {})[seed] = mmer
    order = {name: i for i, name in enumerate(ENGINES)}
    lines = []
    for core, engine in sorted(runs, key=lambda key: (key[0], order.get(key[1], 9))):
        base = list(runs.get((core, "memcores"), {}).values())
        values = list(runs[(core, engine)].values())
        if len(base) < 2 or len(values) < 2:
            continue
        seeds = ",".join(str(seed) for seed in sorted(runs[(core, engine)]))
        if engine == "memcores":
            versus = ""
        else:
            versus = f"{format_p(welch_p(base, values))} | {separation(base, values)}"
        lines.append(
            f"| {core} | {engine} | {seeds} | {statistics.mean(values):.3f} | "
            f"{statistics.stdev(values):.3f} | {versus or ' | '} |"
        )
    if not lines:
        return []
    return [
        "| core | engine | seeds | mean final MMER | std | Welch p vs memcores | "
        "runs vs memcores |",
        "|---|---|---|---:|---:|---:|---|",
        *lines,
    ]


def cmd_report(args: argparse.Namespace) -> int:
    """Write ``REPORT.md``: one row per record, the popgym_150k reference beside it."""
    results = Path(args.results)
    rows = []
    records = [run for run in find_runs([results]) if run.is_record]
    for run in records:
        record = run.record
        frames = record["frames"]
        rows.append(
            (
                record.get("engine", "?"), record["core"], record["seed"], frames,
                frames / record["wall_seconds"], record["final"]["rollout/ep_rew_mean"],
                record["wall_seconds"], record.get("setup_seconds"), run.path.name,
            )
        )  # fmt: skip
    order = {name: i for i, name in enumerate(ENGINES)}
    rows.sort(key=lambda r: (r[1], r[8].endswith("2-node"), order.get(r[0], 9), r[2]))
    lines = [
        "# One core, three engines: memcores' PPO, torchrl, RLlib",
        "",
        "POPGym RepeatPreviousEasy, the same network (vector encoder, core of 64, actor and "
        "critic heads) and PPO settings (1024-frame batches, 4 epochs, minibatches of 256 "
        "frames, sequences of 32, Adam 1e-3 annealed, entropy 0.01), one torch thread per "
        "process. MMER: mean return of the last 100 episodes (random play: about -0.5, "
        "perfect: 1.0). frames/s: frames over the training loop's wall time.",
        "",
        "| engine | core | seed | frames | frames/s | final MMER | wall s | start-up s | record |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for engine, core, seed, frames, fps, mmer, wall, setup, name in rows:
        setup_text = f"{setup:.0f}" if setup is not None else ""
        lines.append(
            f"| {engine} | {core} | {seed} | {frames} | {fps:.0f} | {mmer:.3f} | {wall:.0f} | "
            f"{setup_text} | `{name}` |"
        )
    spread = seed_statistics(
        [(r[0], r[1], r[2], r[5]) for r in rows if not r[8].endswith("2-node")]
    )
    if spread:
        legend = (
            "Across seeds (one-node runs; std: sample standard deviation; Welch's two-sided "
            "t-test, unequal variances; runs vs memcores: above/below when every run is "
            "above/below every memcores run, else overlap):"
        )
        lines += ["", legend, "", *spread]
    lines += ["", "memcores' popgym_150k records (150,528-frame runs) at the same frames:", ""]
    for core in sorted({r[1] for r in rows}):
        frames = max(r[3] for r in rows if r[1] == core)
        ref = _memcores_reference(Path(args.reference), core, frames)
        if ref:
            shown = ", ".join(f"{v:.3f}" for v in ref)
            lines.append(f"- {core} at {frames} frames: MMER {shown} (seeds 0-{len(ref) - 1})")
    for run in records:
        placement = run.record.get("placement")
        if not placement or len(placement.get("nodes", [])) < 2:
            continue
        runner_nodes = [runner["node_id"][:12] for runner in placement["env_runners"]]
        lines += ["", f"Cluster run `{run.path.name}` "
                  "(`python -m memcores.experiments.engines cluster`): "
                  f"{len(placement['nodes'])} Ray nodes; "
                  f"env runners on nodes {', '.join(runner_nodes)}; learner on node "
                  f"{placement['learner']['node_id'][:12]}."]  # fmt: skip
        local = results / run.path.name.replace(",cluster=2-node", "")
        if (local / "curve.csv").is_file():
            same = _mmer_column(local) == _mmer_column(run.path)
            lines.append(
                f"Its learning curve is {'identical to' if same else 'different from'} the "
                f"one-node run `{local.name}` (same seed)."
            )
    hardware = {run.record["hardware"] for run in records}
    lines += ["", f"Hardware: {', '.join(sorted(hardware))}; the machine was shared with other "
              "jobs, so frames/s compare runs made side by side, not absolute speeds.", "",
              "Commands: each record's `command`; this report: "
              "`python -m memcores.experiments.engines report`.", ""]  # fmt: skip
    (results / "REPORT.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memcores.experiments.engines", description=__doc__
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train one engine and write its record")
    run.add_argument("--engine", choices=ENGINES, required=True)
    run.add_argument("--core", default="gru")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--frames", type=int, default=DEFAULT_FRAMES)
    run.add_argument("--address", default=None, help="a running Ray cluster (rllib only)")
    run.add_argument("--results", default="results/engines")
    run.add_argument("--runs", default="runs/engines")
    cluster = sub.add_parser("cluster", help="RLlib on two Ray nodes started on this host")
    cluster.add_argument("--core", default="gru")
    cluster.add_argument("--frames", type=int, default=DEFAULT_FRAMES)
    report = sub.add_parser("report", help="write results/engines/REPORT.md")
    report.add_argument("--results", default="results/engines")
    report.add_argument("--reference", default="results/popgym_150k")
    args = parser.parse_args(argv)
    if args.command == "run" and args.address and args.engine != "rllib":
        parser.error(f"--address runs RLlib only, not engine {args.engine!r}")
    if args.command in ("run", "cluster"):
        from memcores.cores import CORES

        if args.core not in CORES:
            parser.error(f"unknown core {args.core!r}; valid: {', '.join(CORES)}")
    if args.command in ("run", "cluster") and args.frames <= 0:
        parser.error(f"--frames must be positive, got {args.frames}")
    if args.command == "cluster":
        return cmd_cluster(args)
    return cmd_run(args) if args.command == "run" else cmd_report(args)


def cmd_cluster(args: argparse.Namespace) -> int:
    """Run ``rllib_cluster.sh`` (shipped beside this module) with this interpreter."""
    script = Path(__file__).with_name("rllib_cluster.sh")
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(script), args.core, str(args.frames)], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
