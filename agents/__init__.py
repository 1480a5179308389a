"""Policies, rollout storage, PPO/A2C and trainers (RL, supervised, streaming)."""
