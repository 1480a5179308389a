"""Frames per second of ``memcores train`` itself, as the RL benchmarks time it
(``bench rl``, ``bench rl --batched``)."""

from __future__ import annotations


def train_rates(
    config_path: str | None,
    overrides: list[str],
    frames_per_update: int,
    updates: int,
    tmp: str,
    name: str,
) -> tuple[float, float]:
    """Frames per wall second and per CPU second of ``memcores train`` on ``config_path`` with
    ``overrides``: one update of warm-up, then ``updates`` timed. The loop only (rollouts,
    updates, logging, checkpoints), as sb3's learn(); setup (building envs and policy, opening
    TensorBoard) is excluded on both sides."""
    from memcores.agents.rl_config import RLConfig
    from memcores.agents.rl_trainer import train
    from memcores.experiments.config import load_config

    rates = (0.0, 0.0)
    for run, n_updates in (("warmup", 1), ("timed", updates)):
        config = load_config(
            RLConfig,
            config_path,
            [
                *overrides,
                f"train.total_steps={n_updates * frames_per_update}",
                "train.threads=0",  # keep the thread count the bench set, for both sides
                "train.progress=false",
                "train.histogram_every=0",
                f"train.checkpoint_every={n_updates}",
            ],
        )
        result = train(config, f"{tmp}/{run}_{name}")
        rates = (
            result.global_step / result.loop_seconds,
            result.global_step / result.loop_cpu_seconds,
        )
    return rates
