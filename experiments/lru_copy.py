"""Pattern-copy comparison of the LRU's gradient modes (Zucchet et al. 2023, Table 1).

A small stand-alone driver (it does not need the supervised trainer): trains ``LRUCore`` +
linear decoder on ``pattern_copy`` (20 patterns x 7 bits, padding 7, T = 48) with one gradient
mode and writes ``progress.csv`` (step, loss, accuracy, lr, seconds) and ``result.json`` (the
final training loss = mean loss of the last ``--final-window`` steps on fresh batches) to
``--out``. The paper's setup: 4 layers, H=128, N=64, Adam, cosine decay to 0, no warmup.

    python -m experiments.lru_copy --grad online --steps 3000 --out runs/lru_copy/online

Differences from the paper, forced by a shared CPU: fresh batches instead of a fixed 20,000
example training set (so "training loss" is measured on unseen batches), far fewer steps,
no dropout, and one untuned learning rate for every method.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from cores.lru import GRAD_MODES, LRUCore
from envs.sequences import make_task


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.lru_copy", description=__doc__)
    p.add_argument("--grad", choices=GRAD_MODES, required=True, help="gradient mode")
    p.add_argument("--steps", type=int, default=3000, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=20, help="sequences per step (paper: 20)")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam base learning rate")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=128, help="H")
    p.add_argument("--state-size", type=int, default=64, help="N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--max-minutes", type=float, default=60.0, help="hard wall-clock cap")
    p.add_argument("--final-window", type=int, default=100, help="steps averaged for the result")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--out", type=Path, required=True, help="output directory")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--steps, --batch-size and --lr must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)  # same data stream for every gradient mode
    task = make_task("pattern_copy")
    core = LRUCore(
        task.input_size,
        args.hidden_size,
        state_size=args.state_size,
        layers=args.layers,
        grad=args.grad,
    )
    decoder = torch.nn.Linear(args.hidden_size, task.output_size)
    params = [*core.parameters(), *decoder.parameters()]
    opt = torch.optim.Adam(params, lr=args.lr)
    # Cosine decay to 0 over the run, no warmup (the paper's copy-task schedule).
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps))
    )
    args.out.mkdir(parents=True, exist_ok=True)
    losses: list[float] = []
    accs: list[float] = []
    start = time.monotonic()
    stopped_early = False
    with open(args.out / "progress.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "loss", "accuracy", "lr", "seconds"])
        for step in range(1, args.steps + 1):
            batch = task.sample(rng, args.batch_size)
            x, y = torch.from_numpy(batch.x), torch.from_numpy(batch.y)  # [T,B,8], [W,B,7]
            out, _ = core(x, core.initial_state(args.batch_size))
            logits = decoder(out[-task.window :])  # [W, B, 7]
            loss = F.binary_cross_entropy_with_logits(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            accs.append(((logits > 0).float() == y).float().mean().item())
            elapsed = time.monotonic() - start
            if step % args.log_every == 0 or step == args.steps:
                w = args.log_every
                writer.writerow(
                    [
                        step,
                        np.mean(losses[-w:]),
                        np.mean(accs[-w:]),
                        sched.get_last_lr()[0],
                        elapsed,
                    ]
                )
                f.flush()
            if elapsed > args.max_minutes * 60:
                stopped_early = True
                break
    k = min(args.final_window, len(losses))
    result = {
        "grad": args.grad,
        "steps_done": len(losses),
        "steps_planned": args.steps,
        "stopped_early": stopped_early,
        "final_train_loss": float(np.mean(losses[-k:])),
        "final_train_accuracy": float(np.mean(accs[-k:])),
        "final_window": k,
        "seconds": time.monotonic() - start,
        "config": {k_: str(v) for k_, v in vars(args).items()},
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k_: result[k_] for k_ in list(result)[:-1]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
