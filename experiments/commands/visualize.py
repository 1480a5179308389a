"""``memcores visualize RUN --env ID --gif out.gif``: record a trained agent as a GIF."""

from __future__ import annotations

import argparse
from pathlib import Path

from memcores.experiments.argtypes import output_file, positive_float, positive_int, seed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run folder or checkpoint file")
    parser.add_argument("--env", default=None, help="env id (default: the training env)")
    parser.add_argument("--gif", required=True, type=output_file, help="output GIF path")
    parser.add_argument("--episodes", type=positive_int, default=3, help="episodes to record")
    parser.add_argument("--argmax", action="store_true", help="greedy actions, not sampled")
    parser.add_argument("--seed", type=seed, default=10_000, help="env seed")
    parser.add_argument(
        "--fps", type=positive_float, default=8.0, help="frames per second of the GIF"
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")


def run(args: argparse.Namespace) -> int:
    from memcores.agents.device import resolve_device
    from memcores.agents.evaluation import record_gif

    gif = record_gif(
        args.run,
        Path(args.gif),
        args.env,
        args.episodes,
        args.argmax,
        args.seed,
        args.fps,
        device=resolve_device(args.device),
    )
    shown = ", ".join(f"{r:.2f}" for r in gif.returns)
    merged = (
        f" ({gif.steps} steps; identical consecutive steps share one longer frame)"
        if gif.frames != gif.steps
        else ""
    )
    print(
        f"wrote {args.gif}: {gif.frames} frames{merged} at {args.fps:g} steps/s, "
        f"{len(gif.returns)} episodes (returns {shown})"
    )
    return 0
