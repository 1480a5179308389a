"""Is the cue in the memory? Probes for the memory-match envs (docs/memory_match.md).

``decode``: play episodes of Passive Visual Match with a policy (a trained run, or a fresh one
built from a config) and, for every step ``t`` up to the first reward-room step, fit a
logistic regression from the core state after step ``t`` to the cue colour (5-fold
cross-validated accuracy; chance is ``1 / n_colors``). A state that holds the cue decodes it.

``supervised``: train the same encoder and core by backpropagation to report the cue colour
at the first reward-room step (random actions; a dense label on every episode). It separates
"this network cannot hold the cue over the delay" from "RL does not teach it to".

    python -m memcores.experiments.bench.memory_probe decode RUN_DIR [--episodes 300]
    python -m memcores.experiments.bench.memory_probe decode --config CONFIG [KEY=VALUE ...]
    python -m memcores.experiments.bench.memory_probe supervised --config CONFIG [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

from memcores.agents.policy import RecurrentActorCritic, obs_to_tensors, sample_actions


def _policy_and_env(run: str | None, config_path: str | None, overrides: list[str]) -> Any:
    from memcores.agents.evaluation import load_policy
    from memcores.agents.rl_config import RLConfig
    from memcores.agents.rl_trainer import setup
    from memcores.envs import make_env
    from memcores.experiments.config import load_config

    if run is not None:
        policy, config = load_policy(run)
    else:  # the policy `memcores train` would start from (same checks, seed and threads)
        config = load_config(RLConfig, config_path, overrides)
        fresh = setup(config)
        fresh.envs.close()
        policy = fresh.policy
    env = make_env(config.env.id, seed=7, **config.env.kwargs)
    if not hasattr(env.unwrapped, "cue_color"):
        raise ValueError(f"{config.env.id} is not a memory-match env (no cue colour)")
    return policy.eval(), env


@torch.no_grad()
def decode(policy: RecurrentActorCritic, env: Any, episodes: int) -> list[float]:
    """Cross-validated accuracy of the cue colour from the core state after each step ``t``
    (``t = 0`` is the first observation), up to the first reward-room observation."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import cross_val_score

    base = env.unwrapped
    device = policy.device
    states: dict[int, list[np.ndarray]] = {}
    labels = []
    for _ in range(episodes):
        obs, _ = env.reset()
        labels.append(base.colors.index(base.cue_color))
        state = policy.initial_state(1, device)
        starts = torch.ones(1, 1, dtype=torch.bool, device=device)
        t = 0
        while True:
            out = policy(obs_to_tensors({k: [v] for k, v in obs.items()}, device), state, starts)
            flat = torch.cat([s.flatten().float() for s in out.state])
            states.setdefault(t, []).append(flat.cpu().numpy())
            if base.phase == 3:
                break
            action, _ = sample_actions(out.logits[0])
            state, starts = out.state, torch.zeros(1, 1, dtype=torch.bool, device=device)
            obs, *_ = env.step(int(action[0]))
            t += 1
    y = np.array(labels)
    scores = []
    for t in sorted(states):
        x = np.array(states[t])
        x = (x - x.mean(0)) / (x.std(0) + 1e-8)
        scores.append(float(cross_val_score(LogisticRegression(max_iter=3000), x, y, cv=5).mean()))
    return scores


def supervised(policy: RecurrentActorCritic, env: Any, episodes: int, updates: int) -> list[float]:
    """Train ``policy``'s encoder and core (plus a linear readout) to report the cue colour at
    the first reward-room step; held-out accuracy every 50 updates. Runs on ``policy``'s
    device."""
    base = env.unwrapped
    device = policy.device
    rng = np.random.default_rng(0)
    runs = []
    for _ in range(episodes):
        obs, _ = env.reset()
        seq = [obs]
        while base.phase != 3:
            obs, *_ = env.step(int(rng.integers(0, 3)))
            seq.append(obs)
        runs.append((seq, base.colors.index(base.cue_color)))
    batch = {
        k: torch.as_tensor(np.stack([[o[k] for o in s] for s, _ in runs], 1), device=device)
        for k in seq[0]
    }  # each [steps, episodes, ...]
    labels = torch.tensor([c for _, c in runs], device=device)
    steps, n = batch["image"].shape[:2]
    held = n // 4
    policy.train()
    readout = torch.nn.Linear(policy.actor[0].in_features, base.n_colors).to(device)
    optimiser = torch.optim.Adam([*policy.parameters(), *readout.parameters()], 1e-3)

    def last_output(idx: torch.Tensor) -> torch.Tensor:
        starts = torch.zeros(steps, len(idx), dtype=torch.bool, device=device)
        starts[0] = True
        x = policy.encode({k: v[:, idx] for k, v in batch.items()})
        y, _ = policy.core(x, policy.initial_state(len(idx), device), starts)
        return readout(y[-1, :, : readout.in_features])

    accuracies = []
    generator = torch.Generator().manual_seed(0)
    for update in range(updates + 1):
        if update % 50 == 0:
            with torch.no_grad():
                test = torch.arange(n - held, n, device=device)
                accuracies.append(
                    float((last_output(test).argmax(-1) == labels[test]).float().mean())
                )
        idx = torch.randint(0, n - held, (64,), generator=generator).to(device)
        loss = torch.nn.functional.cross_entropy(last_output(idx), labels[idx])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return accuracies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["decode", "supervised"])
    parser.add_argument("run", nargs="?", help="a trained run folder (decode only)")
    parser.add_argument("--config", help="build a fresh policy from this config instead")
    parser.add_argument("overrides", nargs="*", default=[], help="KEY=VALUE config overrides")
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--updates", type=int, default=300)
    args, extra = parser.parse_known_args(argv)
    overrides = [*args.overrides, *extra]
    if args.run and "=" in args.run:
        overrides.insert(0, args.run)
        args.run = None
    if (args.run is None) == (args.config is None):
        parser.error("give a run folder or --config")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    policy, env = _policy_and_env(args.run, args.config, overrides)
    if args.mode == "decode":
        scores = decode(policy, env, args.episodes)
        print("step  cue decodable from the core state")
        for t, score in enumerate(scores):
            print(f"{t:4d}  {score:.2f}")
    else:
        if args.run is not None:
            parser.error("supervised trains a fresh policy: give --config")
        for i, acc in enumerate(supervised(policy, env, 1024, args.updates)):
            print(f"update {50 * i:4d}  held-out accuracy {acc:.2f}")


if __name__ == "__main__":
    main()
