"""``memcores bench cores|rl|envs|memory|gpu [options]``: dispatch to ``experiments/bench/*.py``."""

from __future__ import annotations

import argparse
import importlib

BENCHES = {
    "cores": "forward+backward time of every core, as ratios to torch.nn.LSTM",
    "rl": "PPO steps/s of memcores vs sb3-contrib RecurrentPPO on MiniGrid-MemoryS7 "
    "(--batched: PPO with the gymnasium vs the batched envs)",
    "envs": "steps/s of the memory-match envs vs MiniGrid-MemoryS7 (--batched: the batched "
    "torch envs vs their gymnasium versions)",
    "memory": "peak memory/time of lstm vs rel_lstm vs mem_lstm, and LRU bptt vs online",
    "gpu": "the GPU measured in one run: cores vs cuDNN, T-scaling, acting, "
    "RL and supervised GPU vs CPU (JSON + markdown in --out)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "which", choices=list(BENCHES), help="; ".join(f"{k}: {v}" for k, v in BENCHES.items())
    )
    parser.add_argument("bench_args", nargs=argparse.REMAINDER, help="options of that benchmark")


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"memcores.experiments.bench.{args.which}")
    return int(module.main(args.bench_args) or 0)
