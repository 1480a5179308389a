"""The CPU cores this process may use, and thread or worker counts checked against them
(the envs' workers and threads, the trainers' torch threads, a sweep's trials)."""

from __future__ import annotations

from collections.abc import Mapping


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system reports one)."""
    import os

    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def check_cpu_counts(counts: Mapping[str, int]) -> None:
    """Refuse thread or worker counts beyond the CPU cores of the computer before anything starts
    (100,000 EnvPool threads abort in C++; as many torch threads or env processes only
    oversubscribe the cores).

    :param counts: option name -> its value (``train.threads``: 0 means torch's default).
    :raises ValueError: one line naming the first count too large and the cores there are.
    """
    cores = cpu_cores()
    for option, value in counts.items():
        if value > cores:
            raise ValueError(
                f"{option}={value:,} is more than the {cores} CPU cores this process may use; "
                f"give 1..{cores}"
            )
