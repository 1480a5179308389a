"""How a sweep runs (:class:`SweepOptions`) and its one error type: below the sweep, its
Ray Tune engine and its searches, which all take them."""

from __future__ import annotations

import dataclasses
import math

from memcores.agents.run_config import MAX_SEED

BACKENDS = ("auto", "ray", "local")
SCHEDULERS = ("fifo", "asha", "pbt")
SEARCHES = ("grid", "random", "optuna")
CLUSTER_RETRIES = 2
"""``--max-failures`` when it is not given and the sweep runs on a cluster (``--address``)."""


class SweepError(ValueError):
    """A sweep's arguments are wrong (bad grid, unknown command, another sweep in the folder)."""


@dataclasses.dataclass
class SweepOptions:
    """How a sweep runs.

    :param backend: ``ray`` (Ray Tune), ``local`` (a plain loop over the trials in this
        process: no retries, no scheduler, no cluster), ``auto``: ray when installed.
    :param address: Ray cluster address (``auto``, ``ray://head:10001``); None: a private
        local Ray instance with ``max_concurrent * cpus`` CPUs.
    :param cpus, gpus, memory_gb: what each trial reserves (GPUs may be a fraction); checked
        against the cluster's nodes before anything is written.
    :param max_failures: retries of a failed trial (from its last checkpoint); None:
        :data:`CLUSTER_RETRIES` with ``address``, else 0.
    :param scheduler: ``fifo``, ``asha`` (early stopping on ``metric``/``mode``; rungs in
        ``step`` units, the first after ``grace_period`` steps) or ``pbt`` (Population Based
        Training over the config's ``search:`` space, every ``perturbation_interval`` steps).
    :param search: ``grid`` (the ``--grid`` points), ``random`` or ``optuna`` (``samples``
        points of the config's ``search:`` space, each run on every seed of the grid;
        ``metric``/``mode`` is what Optuna optimises: the mean over seeds of its last value).
    :param timeout: seconds after which a trial is stopped (None: no limit).
    :param grace_period, samples, search_seed: None: not given (1, 1 and 0 where they apply);
        given where nothing uses them, they are an error (see :meth:`check`).
    """

    backend: str = "auto"
    address: str | None = None
    max_concurrent: int = 1
    cpus: int = 1
    gpus: float = 0.0
    max_failures: int | None = None
    scheduler: str = "fifo"
    metric: str | None = None
    mode: str = "max"
    grace_period: int | None = None
    timeout: float | None = None
    search: str = "grid"
    samples: int | None = None
    memory_gb: float = 0.0
    perturbation_interval: int = 0
    search_seed: int | None = None

    @property
    def retries(self) -> int:
        """``max_failures``, or its default (more on a cluster, where nodes can be lost)."""
        if self.max_failures is not None:
            return self.max_failures
        return CLUSTER_RETRIES if self.address else 0

    @property
    def rung(self) -> int:
        """ASHA's first rung, in steps (``--grace-period``, default 1)."""
        return 1 if self.grace_period is None else self.grace_period

    @property
    def points(self) -> int:
        """Points a random or Optuna search draws (``--samples``, default 1)."""
        return 1 if self.samples is None else self.samples

    @property
    def sampler_seed(self) -> int:
        """Seed of the search's or PBT's sampler (``--search-seed``, default 0)."""
        return 0 if self.search_seed is None else self.search_seed

    def check(self) -> None:
        """:raises SweepError: an impossible combination, or an option that does nothing in
        the chosen mode (named in the message)."""
        if self.backend not in BACKENDS:
            raise SweepError(f"unknown backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
        if self.scheduler not in SCHEDULERS:
            raise SweepError(
                f"unknown scheduler {self.scheduler!r}; valid: {', '.join(SCHEDULERS)}"
            )
        if self.search not in SEARCHES:
            raise SweepError(f"unknown search {self.search!r}; valid: {', '.join(SEARCHES)}")
        if self.scheduler in ("asha", "pbt") and not self.metric:
            raise SweepError(f"--scheduler {self.scheduler} needs --metric TAG (and --mode)")
        if self.search == "optuna" and not self.metric:
            raise SweepError("--search optuna needs --metric TAG (and --mode max|min)")
        if self.search != "grid" and self.scheduler != "fifo":
            raise SweepError(
                f"--search {self.search} runs each point's seeds in one trial; it takes no "
                f"--scheduler (got {self.scheduler})"
            )
        if self.scheduler == "pbt" and self.perturbation_interval < 1:
            raise SweepError("--scheduler pbt needs --perturbation-interval STEPS (>= 1)")
        if self.mode not in ("max", "min"):
            raise SweepError(f"--mode must be max or min, got {self.mode!r}")
        self._check_numbers()
        unused = self.unused_options()
        if unused:
            raise SweepError(unused[0])
        asked = self.ray_only_options()
        if self.backend == "local" and asked:
            raise SweepError(
                f"--backend local runs trials one after the other in this process; {asked[0]} "
                "needs Ray Tune"
            )

    def _check_numbers(self) -> None:
        """Counts >= 1, resources finite and >= 0, a time limit > 0, a seed numpy takes."""
        counts = {
            "--max-concurrent": self.max_concurrent,
            "--threads-per-trial": self.cpus,
            "--grace-period": self.rung,
            "--samples": self.points,
        }
        for flag, value in counts.items():
            if value < 1:
                raise SweepError(f"{flag} must be >= 1, got {value}")
        amounts = {"--gpus-per-trial": self.gpus, "--memory-per-trial": self.memory_gb}
        for flag, value in amounts.items():
            if not (math.isfinite(value) and value >= 0):  # nan fails both
                raise SweepError(f"{flag} must be a finite number >= 0, got {value}")
        if self.timeout is not None and not (math.isfinite(self.timeout) and self.timeout > 0):
            raise SweepError(f"--trial-timeout must be a number of seconds > 0, got {self.timeout}")
        if not 0 <= self.sampler_seed <= MAX_SEED:
            raise SweepError(f"--search-seed must be in 0..{MAX_SEED}, got {self.search_seed}")
        if self.retries < 0:
            raise SweepError(f"--max-failures must be >= 0, got {self.max_failures}")

    def unused_options(self) -> list[str]:
        """Why each option given does nothing in the chosen mode (empty: none)."""
        pbt, asha, searching = self.scheduler == "pbt", self.scheduler == "asha", self.search
        unused = {
            "--perturbation-interval": (self.perturbation_interval > 0, pbt, "--scheduler pbt"),
            "--grace-period": (self.grace_period is not None, asha, "--scheduler asha"),
            "--samples": (self.samples is not None, searching != "grid", "--search random|optuna"),
            "--search-seed": (
                self.search_seed is not None,
                searching != "grid" or pbt,
                "--search random|optuna or --scheduler pbt",
            ),
        }
        return [
            f"{flag} is only used by {who}; drop it or add {who.split(' or ')[0]}"
            for flag, (given, used, who) in unused.items()
            if given and not used
        ]

    def ray_only_options(self) -> list[str]:
        """The options given that only Ray Tune can honour (empty: none)."""
        given = {
            "--address": self.address,
            "--max-failures": self.max_failures,
            "--trial-timeout": self.timeout,
            "--gpus-per-trial": self.gpus,
            "--memory-per-trial": self.memory_gb,
            "--threads-per-trial": self.cpus > 1,
            "--max-concurrent": self.max_concurrent > 1,
            f"--scheduler {self.scheduler}": self.scheduler != "fifo",
            f"--search {self.search}": self.search != "grid",
        }
        return [name for name, value in given.items() if value]
