"""``memcores transfer SUITE [key.sub=value ...]``: train small, test large (thesis Table 7).

For each (train env, test env) pair of the suite (``memcores list suites``): train an agent on
the train env from ``--config`` plus the overrides (``core.name=rel_lstm``...), evaluate it on
both envs, and write ``table.md`` and ``table.csv`` with the mean train/test returns and
success rates into the output folder (updated after every pair). Every pair's config is
validated before anything is trained or written. Re-running with the same ``--out`` resumes
unfinished pairs and re-evaluates finished ones.

The config may be a transfer sweep's (``suite``, ``episodes``, ``argmax`` and
``pair_overrides`` at its top level): ``episodes`` and ``argmax`` are the defaults of the flags,
``pair_overrides`` (:func:`resolve_pair_overrides`) sets keys for single pairs, and the suite
named on the command line wins over the config's.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcores.experiments.argtypes import positive_int
from memcores.experiments.config import build, parse_override, read_yaml_mapping, set_dotted

if TYPE_CHECKING:
    from memcores.agents.evaluation import EvalResult
    from memcores.agents.rl_config import RLConfig

DEFAULT_CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "transfer.yaml")
"""The packaged ``experiments/configs/transfer.yaml``, found from any working directory."""
TRANSFER_KEYS = ("suite", "episodes", "argmax", "pair_overrides")
"""Top-level keys of a transfer config that are arguments of the suite, not RL config keys."""

FIELDS = [
    "train_env",
    "test_env",
    "core",
    "algo",
    "frames",
    "train_return",
    "train_success",
    "test_return",
    "test_success",
    "episodes",
    "run_dir",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", help="transfer suite (see `memcores list suites`)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides: core.name=ur_lstm ...")
    parser.add_argument(
        "--config",
        default=DEFAULT_CONFIG,
        help="base RL config (default: the packaged experiments/configs/transfer.yaml)",
    )
    parser.add_argument(
        "--episodes",
        type=positive_int,
        default=None,
        help="evaluation episodes per env (default: the config's `episodes`, else 100)",
    )
    parser.add_argument(
        "--argmax",
        action="store_true",
        default=None,
        help="greedy actions in evaluation (default: the config's `argmax`, else sampled)",
    )
    parser.add_argument(
        "--out", default=None, help="output folder (default runs/transfer_<suite>_<core>)"
    )


def short_name(env_id: str) -> str:
    """``MiniGrid-DoorKey-5x5-v0`` -> ``DoorKey-5x5`` (as the thesis table prints them)."""
    name = env_id.split("/")[-1]
    name = re.sub(r"^(MiniGrid|BabyAI)-", "", name)
    return re.sub(r"-v\d+$", "", name)


def pair_record_names(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """The record folder of each pair: its train env's short name, or ``TRAIN-to-TEST`` where
    the suite tests one train env on several envs (one trained run, one record per test)."""
    trains = [train_id for train_id, _ in pairs]
    return [
        short_name(train_id)
        if trains.count(train_id) == 1
        else f"{short_name(train_id)}-to-{short_name(test_id)}"
        for train_id, test_id in pairs
    ]


def resolve_pair_overrides(
    spec: object, suite: str, pairs: Sequence[tuple[str, str]], out: Path
) -> dict[str, list[str]]:
    """A transfer config's ``pair_overrides`` as ``key=value`` overrides per train env id.

    ``spec`` maps a train env id of the suite to ``{dotted.key: value}``, applied to that pair
    only, on top of the config and the command-line overrides. Entries for the train env of
    another registered suite are left out, so one config can serve each row of a suite on its
    own (a sweep over ``suite``). ``train.init_from: "@ENV_ID"``
    starts the pair from the policy trained on an earlier pair's train env ``ENV_ID`` in the
    same output folder ``out``: a curriculum, as the Active visual-match task needs one (it is
    learnt from the Passive policy, docs/memory_match.md section 6).

    :raises ValueError: ``spec`` is not such a mapping, names an env that is not a train env of
        the suite, or ``@`` names one that is not trained earlier (the message lists the valid
        choices).
    """
    from memcores.envs.suites import SUITES

    order = [train_id for train_id, _ in pairs]
    resolved: dict[str, list[str]] = {train_id: [] for train_id in order}
    if spec is None:
        return resolved
    if not isinstance(spec, dict):
        raise ValueError("pair_overrides must map a train env id to {dotted.key: value}")
    elsewhere = {train_id for s in SUITES.values() for train_id, _ in s.pairs}
    for env_id, keys in spec.items():
        if env_id not in resolved and env_id in elsewhere:
            continue  # a row of another suite that this config also serves
        if env_id not in resolved:
            raise ValueError(
                f"pair_overrides: {env_id!r} is not a train env of suite {suite} or of any "
                f"other suite; valid here: {', '.join(order)}"
            )
        if not isinstance(keys, dict):
            raise ValueError(f"pair_overrides.{env_id} must map dotted keys to values")
        for key, value in keys.items():
            if key == "train.init_from" and isinstance(value, str) and value.startswith("@"):
                earlier = order[: order.index(env_id)]
                if value[1:] not in earlier:
                    choices = ", ".join("@" + e for e in earlier) or "none (it is the first pair)"
                    raise ValueError(
                        f"pair_overrides.{env_id}: train.init_from {value!r} must name the "
                        f"train env of an earlier pair; valid: {choices}"
                    )
                value = str(out / short_name(value[1:]))
            text = value if isinstance(value, str) else json.dumps(value)
            resolved[env_id].append(f"{key}={text}")
    return resolved


def suite_config(path: str | Path, overrides: Sequence[str]) -> tuple[RLConfig, dict]:
    """The RL config of a transfer config file plus ``overrides``, and its transfer keys.

    :raises ConfigError: a wrong key or value, or a missing or malformed file.
    """
    from memcores.agents.rl_config import RLConfig

    raw = read_yaml_mapping(path)
    transfer = {k: raw.pop(k) for k in TRANSFER_KEYS if k in raw}
    for item in overrides:
        set_dotted(raw, *parse_override(item))
    return build(RLConfig, raw, prefix=""), transfer


def table_row(
    train_id: str,
    test_id: str,
    config: RLConfig,
    frames: int,
    on_train: EvalResult,
    on_test: EvalResult,
    episodes: int,
    run_dir: Path,
) -> dict[str, Any]:
    """One row of the transfer table (the columns of :data:`FIELDS`), for one trained pair.

    Shared by ``memcores transfer`` and the sweep's transfer trials, whose tables must agree.
    """
    return dict(
        train_env=train_id,
        test_env=test_id,
        core=config.core.name,
        algo=config.agent.algo,
        frames=frames,
        train_return=on_train.mean_return,
        train_success=on_train.success_rate,
        test_return=on_test.mean_return,
        test_success=on_test.success_rate,
        episodes=episodes,
        run_dir=str(run_dir),
    )


def write_table_csv(path: Path, rows: list[dict]) -> None:
    """Write ``rows`` to ``path`` as CSV with the :data:`FIELDS` header."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def markdown_table(rows: list[dict], core: str) -> str:
    """Table 7 layout: a Train block and a Test block, then the success rates."""
    lines = [f"| Environment | {core} |", "|---|---|", "| **Train** | |"]
    lines += [f"| {short_name(r['train_env'])} | {r['train_return']:.2f} |" for r in rows]
    lines.append("| **Test** | |")
    lines += [f"| {short_name(r['test_env'])} | {r['test_return']:.2f} |" for r in rows]
    lines += [
        "",
        "| Train env | Test env | frames | train return | train success | test return "
        "| test success |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {short_name(r['train_env'])} | {short_name(r['test_env'])} | {r['frames']} "
        f"| {r['train_return']:.3f} | {r['train_success']:.2f} | {r['test_return']:.3f} "
        f"| {r['test_success']:.2f} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from memcores.agents.evaluation import evaluate_run
    from memcores.agents.rl_trainer import (
        CHECKPOINT_NAME,
        load_rl_checkpoint,
        make_vector_env,
        setup,
        train,
    )
    from memcores.envs.suites import SUITES

    if args.suite not in SUITES:
        raise ValueError(f"unknown suite {args.suite!r}; valid suites: {', '.join(SUITES)}")
    pairs = list(SUITES[args.suite].pairs)
    base, transfer = suite_config(args.config, args.overrides)
    episodes = args.episodes or int(transfer.get("episodes", 100))
    argmax = bool(args.argmax if args.argmax is not None else transfer.get("argmax", False))
    out = Path(args.out or f"runs/transfer_{args.suite}_{base.core.name}")
    per_pair = resolve_pair_overrides(transfer.get("pair_overrides"), args.suite, pairs, out)

    # Validate every pair (config, env ids, core) before training or writing anything. A pair
    # that starts from an earlier pair's policy is checked against that pair's spaces here,
    # since the policy it loads does not exist yet.
    plans, spaces = [], {}
    for train_id, test_id in pairs:
        run_dir = out / short_name(train_id)
        own = [f"env.id={train_id}", f"run.dir={run_dir}", *per_pair[train_id]]
        config, _ = suite_config(args.config, [*args.overrides, *own])
        source = config.train.init_from
        from_pair = next((e for e in spaces if source == str(out / short_name(e))), None)
        if from_pair is not None:
            config.train.init_from = None
        built = setup(config)
        built.envs.close()
        spaces[train_id] = (tuple(built.image_shape), built.n_actions)
        if from_pair is not None:
            if spaces[from_pair] != spaces[train_id]:
                raise ValueError(
                    f"pair_overrides.{train_id}: train.init_from @{from_pair}: that env has "
                    f"observations and actions {spaces[from_pair]}, this one {spaces[train_id]}"
                )
            config.train.init_from = source
        make_vector_env(test_id, 1, 0).close()
        plans.append((train_id, test_id, config, run_dir))

    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for train_id, test_id, config, run_dir in plans:
        # A pair trained before (same --out) is resumed, or just re-evaluated when finished.
        print(f"== transfer: training {config.core.name} on {train_id} -> {run_dir}")
        train(config, run_dir, resume=(run_dir / CHECKPOINT_NAME).is_file())
        frames = load_rl_checkpoint(run_dir)["step"]
        on_train = evaluate_run(run_dir, train_id, episodes, argmax)
        on_test = evaluate_run(run_dir, test_id, episodes, argmax)
        print(f"   {on_train.summary()}\n   {on_test.summary()}")
        rows.append(
            table_row(train_id, test_id, config, frames, on_train, on_test, episodes, run_dir)
        )
        write_table_csv(out / "table.csv", rows)
        (out / "table.md").write_text(markdown_table(rows, base.core.name))
    print((out / "table.md").read_text())
    print(f"wrote {out / 'table.md'} and {out / 'table.csv'}")
    return 0
