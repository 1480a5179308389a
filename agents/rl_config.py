"""Config schema of ``memcores train``: sections ``env``, ``core``, ``agent``, ``train``, ``run``.

Every field has a docstring; :func:`experiments.config.load_config` validates keys and
values (``Literal`` fields list their choices) and calls each section's ``validate()``.
Unknown keys under ``core`` are collected into ``core.options`` and passed to
:func:`cores.make_core`, which checks them against the core's constructor
(``core.p=0.25`` for ``hdetach_lstm``).

Example::

    from memcores.experiments.config import load_config
    cfg = load_config(RLConfig, "experiments/configs/memory_s7.yaml", ["core.name=ur_lstm"])
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from memcores.agents.core_config import CoreConfig
from memcores.agents.divergence import check_learning_rate
from memcores.agents.run_config import (  # noqa: F401  (MAX_SEED: part of this schema's API)
    MAX_SEED,
    MigratingSchema,
    RunConfig,
    TrainBase,
    migrate_saved_config,
)
from memcores.cores.graphed import cuda_graph_choice, cuda_only, graph_switch


@dataclass
class EnvConfig:
    """Which environment to train on and how to vectorise it."""

    id: str = "MiniGrid-MemoryS7-v0"
    """Gymnasium id accepted by :func:`envs.make_env` (``MiniGrid-*``, ``BabyAI-*``,
    ``memcores/*``)."""
    n_envs: int = 8
    """Number of parallel environments in the vector env."""
    vector: Literal["sync", "async", "batched", "envpool"] = "sync"
    """``sync`` steps the envs in the trainer's process; ``async`` steps them in
    ``env.workers`` worker processes over shared memory, in two groups, so the policy acts on
    one group while the other steps (both CPU cores busy; ``memcores bench rl`` measures it;
    :mod:`envs.vector`); ``batched`` steps all of them as tensors on the device the policy
    acts on, and the rollout never leaves that device (:mod:`envs.batched`; ids with a batched
    version only); ``envpool`` steps ``MiniGrid-*`` ids in EnvPool's C++ envs on
    ``env.workers`` threads (the ``envpool`` extra; :mod:`envs.envpool_env`)."""
    workers: int = 1
    """Worker processes when ``vector`` is ``async`` (group ``g`` of the envs lives in worker
    ``g % workers``); EnvPool's threads when it is ``envpool``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra constructor options of the env (e.g. ``max_steps``)."""

    def validate(self) -> None:
        if self.n_envs < 1:
            raise ValueError(f"env.n_envs must be >= 1, got {self.n_envs}")
        if self.workers < 1:
            raise ValueError(f"env.workers must be >= 1, got {self.workers}")
        if self.workers != 1 and self.vector in ("sync", "batched"):
            raise ValueError(
                f"env.workers={self.workers} does nothing with env.vector={self.vector}: it "
                "counts the worker processes of async and the threads of envpool; drop it"
            )
        if self.vector == "async" and self.n_envs < 2:
            raise ValueError("env.vector=async needs env.n_envs >= 2 (two groups of envs)")
        if self.vector == "batched":
            from memcores.envs.batched_registry import batched_ids

            if self.id not in batched_ids():
                raise ValueError(
                    f"env.vector=batched: env.id {self.id!r} has no batched version; batched "
                    f"ids: {', '.join(batched_ids())}"
                )
        from memcores.envs import envpool_env
        from memcores.envs.env_options import as_flag, bool_options, check_env_options
        from memcores.envs.observation import unavailable_reason

        for key in sorted(bool_options(self.id) & set(self.kwargs or {})):
            # a flag's "false" or "maybe" would be a true string: parsed like any bool key
            self.kwargs[key] = as_flag(self.kwargs[key], f"env.kwargs.{key}")
        check_env_options(self.id, self.kwargs or {}, "env.kwargs.")

        why = unavailable_reason(self.id)  # before a run folder exists, not at the first reset
        if why:
            raise ValueError(f"env.id {self.id!r} is unavailable: {why}")
        why = envpool_env.unavailable_reason(self.id) if self.vector == "envpool" else None
        if why:
            raise ValueError(why)


@dataclass
class AgentConfig:
    """The learning algorithm and the network around the core."""

    algo: Literal["ppo", "a2c", "pqn", "r2d2"] = "ppo"
    """``ppo``: clipped surrogate, several epochs of minibatches. ``a2c``: one gradient step on
    the whole rollout per update (``n_epochs``/``minibatch_size``/clipping are ignored).
    ``pqn``: recurrent PQN (Gallici et al., ICLR 2025; :mod:`agents.pqn`): a Q-network with
    LayerNorm, epsilon-greedy acting, Q(lambda) returns over each rollout (``gae_lambda`` is
    the lambda), ``n_epochs`` passes of minibatches of chunks, no replay, no target network.
    ``r2d2``: R2D2 (Kapturowski et al., ICLR 2019; :mod:`agents.r2d2`): prioritized sequence
    replay with stored states and burn-in, n-step double Q with a target network and value
    rescaling, one Ape-X epsilon per env; ``n_epochs`` gradient steps of ``replay_batch``
    sequences per rollout. Each algorithm wants other values of some keys
    (:data:`ALGO_DEFAULTS`); ``memcores train CONFIG agent.algo=a2c`` on a PPO config file
    takes them for the keys not given on the command line."""
    n_steps: int = 128
    """Rollout length per env per update (must be a multiple of ``seq_len``)."""
    seq_len: int = 32
    """Truncated-BPTT chunk length: each env's rollout is cut into chunks of this many steps,
    each replayed from its stored initial core state."""
    n_epochs: int = 4
    """PPO epochs over each rollout."""
    minibatch_size: int = 256
    """Steps per PPO minibatch (a multiple of ``seq_len``: minibatches hold whole chunks)."""
    learning_rate: float = 2.5e-4
    """Initial learning rate."""
    anneal_lr: bool = True
    """Linearly decay the learning rate to 0 over ``train.total_steps``."""
    optimizer: Literal["auto", "adam", "rmsprop"] = "auto"
    """``auto``: Adam for PPO, RMSprop (alpha 0.99, eps 1e-5, as SB3) for A2C."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda (1.0 gives Monte-Carlo returns bootstrapped at the rollout end)."""
    clip_range: float = 0.2
    """PPO policy clipping epsilon."""
    clip_range_vf: float | None = None
    """Optional PPO value clipping around the old values (``None``: no value clipping)."""
    normalize_advantage: bool | None = None
    """Normalise advantages per minibatch (PPO) or over the rollout (A2C). ``null`` (default):
    the algorithm's default, on for PPO (CleanRL) and off for A2C (SB3; on DoorKey-5x5 it made
    A2C's return collapse to 0, docs/rl.md)."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clipping threshold (``0`` disables it)."""
    target_kl: float | None = None
    """PPO early stop: skip the remaining minibatches of an update once the approximate KL
    exceeds ``1.5 * target_kl`` (``None``: never stop early)."""
    bptt_check: bool = True
    """Refuse a ``seq_len`` shorter than the env's declared memory horizon (the memory-match
    envs declare one): the choice's gradient could never reach the cue."""
    image_encoder: Literal["flat", "onehot", "cnn", "embed"] = "onehot"
    """``onehot`` (default): one linear layer on the one-hot object/colour/state of every
    cell (DoorKey-5x5 at 100k frames: 2 of 3 seeds >= 0.9 and the third climbing, against 1
    of 3 for ``flat``; it also solved MemoryS7; docs/rl.md); ``flat``: one linear layer on
    the scaled 7x7x3 symbolic image (cheapest on CPU, what SB3's MlpPolicy sees; ``memcores
    bench rl`` uses it);
    ``cnn``: torch-ac's small conv net on the raw image; ``embed``: learned embeddings of
    object/colour/state per cell, then the same conv net. ``flat`` ties the weights to the
    view size; ``cnn``/``embed`` do not."""
    separate_critic: bool = False
    """Give the critic its own core (same kind and size; the encoder stays shared), as
    SB3-contrib's RecurrentPPO does by default. With one shared core the value loss removes a
    cue from the memory wherever the value does not depend on it (docs/memory_match.md);
    twice the core's cost."""
    recon_coef: float = 0.0
    """Weight of the auxiliary reconstruction loss (:mod:`agents.reconstruction`): the actor
    core's output at step ``t`` must reconstruct the observation at ``t - lag`` for each of
    ``recon_lags``, which gives the memory a reason to keep what it saw before any reward
    depends on it (Hung et al.'s RMA; docs/memory_match.md). ``0`` (default): no decoder."""
    recon_lags: list[int] = field(default_factory=lambda: [0])
    """Steps back that the reconstruction head reads (``0`` = the current observation); each
    must be shorter than ``seq_len``."""
    recon_target: Literal["view", "objects"] = "view"
    """What the reconstruction scores in a MiniGrid view: ``view``, every cell's object and
    colour; ``objects``, only the cells that hold a thing (ball, key, door, box, goal, lava),
    not the walls and floor."""
    mission: Literal["none", "mean", "gru"] = "mean"
    """Mission encoder: ``none`` ignores it; ``mean`` averages word embeddings; ``gru`` runs a
    GRU over the words (slower; only matters for envs whose mission varies)."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this in the returns and targets every algorithm learns from
    (GAE, Q(lambda), R2D2's n-step targets); the logged episode returns stay the env's.
    Value-based learners regress on the returns, so they need returns of order 1: POPGym
    pays ``+-1 / episode length`` per step (``popgym_pqn.yaml`` and ``popgym_r2d2.yaml`` set 10)."""
    epsilon_start: float = 1.0
    """``pqn``: exploration rate at the first frame (one schedule for all envs)."""
    epsilon_end: float = 0.05
    """``pqn``: exploration rate after the decay."""
    epsilon_fraction: float = 0.25
    """``pqn``: fraction of ``train.total_steps`` over which epsilon decays linearly."""
    burn_in: int = 0
    """``r2d2``: steps at the start of each replayed sequence that only recompute the core
    state from the stored one (online network, no gradient, no loss); must be < ``seq_len``."""
    n_step: int = 5
    """``r2d2``: steps of rewards in the double-Q target before bootstrapping."""
    replay_size: int = 100_000
    """``r2d2``: frames (steps over all envs) the sequence replay holds."""
    replay_stride: int | None = None
    """``r2d2``: steps between the starts of consecutive sequences of one env (``null``:
    ``seq_len // 2``, sequences overlapping by half); must divide ``n_steps``."""
    replay_batch: int = 32
    """``r2d2``: sequences per gradient step."""
    learning_starts: int = 5_000
    """``r2d2``: frames collected before the first gradient step."""
    target_update_every: int = 250
    """``r2d2``: gradient steps between copies of the online network into the target."""
    priority_alpha: float = 0.9
    """``r2d2``: priority exponent of the sampling probabilities (0: uniform)."""
    priority_beta: float = 0.6
    """``r2d2``: importance-sampling exponent (0: no correction)."""
    priority_eta: float = 0.9
    """``r2d2``: a sequence's priority is ``eta max|TD| + (1 - eta) mean|TD|``."""
    apex_epsilon: float = 0.4
    """``r2d2``: Ape-X's base epsilon: env ``i`` of ``N`` explores with
    ``apex_epsilon ** (1 + i / (N - 1) * apex_alpha)``."""
    apex_alpha: float = 7.0
    """``r2d2``: Ape-X's epsilon exponent spread."""
    value_rescale_eps: float = 1e-3
    """``r2d2``: ``eps`` of the value rescaling ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x``."""

    @property
    def stride(self) -> int:
        """``replay_stride`` resolved: steps between consecutive sequence starts."""
        return self.replay_stride or max(self.seq_len // 2, 1)

    def __post_init__(self) -> None:
        if self.normalize_advantage is None:
            self.normalize_advantage = self.algo == "ppo"

    def validate(self) -> None:
        positive = ("n_steps", "seq_len", "n_epochs", "minibatch_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"agent.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_steps % self.seq_len:
            raise ValueError(
                f"agent.n_steps ({self.n_steps}) must be a multiple of agent.seq_len "
                f"({self.seq_len}): the rollout is cut into whole chunks"
            )
        if self.algo == "ppo" and self.minibatch_size % self.seq_len:
            raise ValueError(
                f"agent.minibatch_size ({self.minibatch_size}) must be a multiple of "
                f"agent.seq_len ({self.seq_len}): minibatches hold whole chunks"
            )
        check_learning_rate("agent.learning_rate", self.learning_rate)
        for name, (low, closed, nullable) in AGENT_RANGES.items():
            value = getattr(self, name)
            if value is None and nullable:
                continue
            if not (math.isfinite(value) and (value >= low if closed else value > low)):
                bound = f">= {low:g}" if closed else f"> {low:g}"
                null = " or null" if nullable else ""
                raise ValueError(f"agent.{name} must be a finite number {bound}{null}, got {value}")
        if not math.isfinite(self.recon_coef) or self.recon_coef < 0:
            raise ValueError(f"agent.recon_coef must be finite and >= 0, got {self.recon_coef}")
        if not self.recon_lags or any(
            not isinstance(k, int) or not 0 <= k < self.seq_len for k in self.recon_lags
        ):
            raise ValueError(
                f"agent.recon_lags must be a non-empty list of ints in 0..seq_len-1 "
                f"({self.seq_len - 1}), got {self.recon_lags}"
            )
        if not (math.isfinite(self.reward_scale) and self.reward_scale > 0):
            raise ValueError(
                f"agent.reward_scale must be a finite number > 0, got {self.reward_scale}"
            )
        if not 0 < self.gamma <= 1:
            raise ValueError(f"agent.gamma must be in (0, 1], got {self.gamma}")
        if not 0 <= self.gae_lambda <= 1:
            raise ValueError(f"agent.gae_lambda must be in [0, 1], got {self.gae_lambda}")
        if self.algo in ("pqn", "r2d2"):
            self._validate_value_based()

    def _validate_value_based(self) -> None:
        """The keys of ``pqn`` and ``r2d2`` (:mod:`agents.pqn`, :mod:`agents.r2d2`)."""
        if self.separate_critic:
            raise ValueError(f"agent.separate_critic=true does not apply to agent.algo={self.algo}")
        for name in ("epsilon_start", "epsilon_end", "epsilon_fraction", "apex_epsilon"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"agent.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("priority_alpha", "priority_beta", "priority_eta"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"agent.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.algo == "pqn" and self.minibatch_size % self.seq_len:
            raise ValueError(
                f"agent.minibatch_size ({self.minibatch_size}) must be a multiple of "
                f"agent.seq_len ({self.seq_len}): minibatches hold whole chunks"
            )
        if self.algo != "r2d2":
            return
        if self.recon_coef > 0:
            raise ValueError(
                f"agent.recon_coef ({self.recon_coef}) applies to agent.algo ppo, a2c and pqn; "
                "r2d2 has no reconstruction loss: set agent.recon_coef=0"
            )
        if not 0 <= self.burn_in < self.seq_len:
            raise ValueError(
                f"agent.burn_in ({self.burn_in}) must be >= 0 and < agent.seq_len "
                f"({self.seq_len}): the sequence needs steps to learn from after the burn-in"
            )
        for name in ("n_step", "replay_size", "replay_batch", "target_update_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent.{name} must be >= 1, got {getattr(self, name)}")
        if self.learning_starts < 0 or self.apex_alpha < 0 or self.value_rescale_eps <= 0:
            raise ValueError(
                "agent.learning_starts and agent.apex_alpha must be >= 0 and "
                f"agent.value_rescale_eps > 0, got {self.learning_starts}, {self.apex_alpha}, "
                f"{self.value_rescale_eps}"
            )
        if self.stride < 1 or self.n_steps % self.stride:
            raise ValueError(
                f"agent.replay_stride ({self.stride}) must be >= 1 and divide agent.n_steps "
                f"({self.n_steps}): sequence starts fall on stored chunk states"
            )


AGENT_RANGES: dict[str, tuple[float, bool, bool]] = {
    "clip_range": (0.0, False, False),
    "clip_range_vf": (0.0, False, True),
    "target_kl": (0.0, False, True),
    "ent_coef": (0.0, True, False),
    "vf_coef": (0.0, True, False),
    "max_grad_norm": (0.0, True, False),
}
"""``agent.<key>: (bound, bound allowed, null allowed)``: a negative clip range or KL target
inverts what PPO does and a negative coefficient rewards the loss it should lower, and each
would train without an error."""

MUTABLE_HYPERPARAMETERS: tuple[str, ...] = (
    "agent.learning_rate",
    "agent.ent_coef",
    "agent.vf_coef",
    "agent.clip_range",
    "agent.clip_range_vf",
    "agent.target_kl",
    "agent.max_grad_norm",
    "agent.gamma",
    "agent.gae_lambda",
    "agent.n_epochs",
    "agent.epsilon_start",
    "agent.epsilon_end",
    "agent.apex_epsilon",
    "agent.priority_alpha",
    "agent.priority_beta",
)
"""Keys of the learning algorithm that a run restored from its checkpoint can continue under
new values (``rl_trainer.train(config, run_dir, resume=True, allow_changes=...)``): the
coefficients of the loss and the update, read afresh at every update; never the network's
shapes, the env or the rollout's layout, which the checkpoint fixes. Population Based Training
(``memcores sweep --scheduler pbt``) mutates these keys and no others."""


@dataclass
class TrainConfig(TrainBase):
    """How long to train, on what, and how often to log and checkpoint (the keys shared with
    the supervised trainer: :class:`agents.run_config.TrainBase`)."""

    total_steps: int = 200_000
    """Environment steps (frames) over all envs."""
    overlap: bool = False
    """Collect rollout k+1 (in a second thread, with a copy of the policy from before update k)
    while update k runs, so collection and learning use both CPU cores. The rollout a PPO
    update learns from is then one update stale (policy lag 1, as in asynchronous PPO; the
    clipped ratio is taken against the policy that acted). Reproducible for a seed, except
    with cores that draw random numbers while training (``hdetach_lstm``). docs/rl.md has its
    measured effect on learning."""
    update_threads: int = 0
    """Torch threads during the update (the PPO/A2C epochs); ``0``: as ``threads``. With
    ``env.vector=async`` the env workers idle while the learner updates, so ``2`` puts the
    second core to work there (``memcores bench rl`` measures it)."""
    graph_update: Any = "auto"
    """Replay each PPO minibatch step (the core's forward and backward, the loss, clipping and
    Adam) from one CUDA graph instead of launching its kernels one by one
    (:mod:`agents.update_graph`; the same maths as the eager update). ``auto`` (a bool or
    ``auto``, :func:`cores.graphed.graph_switch`): on for a CUDA learner without ``overlap``
    where the update can be recorded (PPO with Adam, no reconstruction loss, a core that draws
    nothing on the host and is not keyed by its state: not ``hdetach_lstm`` or ``mem_lstm``);
    ``true`` insists and is refused, with the reason, where it cannot apply; ``false`` off."""
    graph_acting: Any = "auto"
    """Act on the GPU learner itself at any number of envs, each acting step (encoders, the
    core's step, heads, action sampling) replayed from one CUDA graph
    (:mod:`agents.acting_graph`) instead of on a CPU copy below 128 envs. ``auto``: on for a
    CUDA learner without ``overlap`` whose core reads nothing of its state on the host (not
    ``mem_lstm``), where a replayed step measured faster than both the CPU and the eager GPU
    at every number of envs; ``true`` insists and is refused where it cannot apply."""
    graph_env_step: Any = "false"
    """With a batched env (``env.vector=batched``), replay each rollout step, the acting step
    and the env's step together, from one CUDA graph (:mod:`agents.rollout_graph`) instead of
    replaying the acting step and stepping the env eagerly between replays; the same
    rollouts. ``false`` by default (``memcores bench gpu`` measures it); ``true`` needs
    ``env.vector=batched`` and what ``graph_acting`` needs (a CUDA learner without
    ``overlap``, not ``mem_lstm``), and is refused, with the reason, elsewhere; ``auto``: on
    where it can apply."""
    checkpoint_every: int = 50
    """Write ``checkpoints/last.pt`` every this many updates (and always at the end)."""
    histogram_every: int = 10
    """Log the core's gate time-scale histogram every this many updates (0 disables)."""

    def validate(self) -> None:
        super().validate()
        if self.total_steps < 1:
            raise ValueError(f"train.total_steps must be >= 1, got {self.total_steps}")
        if self.checkpoint_every < 1:
            raise ValueError(f"train.checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.update_threads < 0:
            raise ValueError(f"train.update_threads must be >= 0, got {self.update_threads}")
        cuda_graph_choice(self.graph_acting, "train.graph_acting")
        cuda_graph_choice(self.graph_update, "train.graph_update")
        cuda_graph_choice(self.graph_env_step, "train.graph_env_step")


@dataclass
class RLConfig(MigratingSchema):
    """Everything ``memcores train`` needs."""

    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    core: CoreConfig = field(default_factory=CoreConfig)
    """The memory core."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    """The algorithm and network."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Budget, seed, device, logging."""
    run: RunConfig = field(default_factory=RunConfig)
    """Output location."""

    def check_device(self, device: Any) -> None:
        """Refuse what cannot run on ``device`` (a ``torch.device``), before anything is
        built: Triton options (:meth:`CoreConfig.check_device`) and a CUDA graph insisted on
        (``train.graph_*=true``) off CUDA, as ``memcores train`` refuses them (its setup
        checks the graph flags against the built policy too, :func:`agents.rl_trainer.setup`).
        Every trial of a sweep, its dry run included, makes this check before Ray starts.

        :raises ValueError: naming the key and the values that run there.
        """
        self.core.check_device(device)
        for name in ("graph_update", "graph_acting", "graph_env_step"):
            graph_switch(getattr(self.train, name), f"train.{name}", cuda_only(device))

    def validate(self) -> None:
        batch = self.env.n_envs * self.agent.n_steps
        if self.agent.algo in ("ppo", "pqn") and self.agent.minibatch_size > batch:
            raise ValueError(
                f"agent.minibatch_size ({self.agent.minibatch_size}) exceeds the rollout size "
                f"env.n_envs * agent.n_steps = {batch}"
            )


ALGO_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {
        "env.n_envs": 8,
        "agent.n_steps": 128,
        "agent.seq_len": 32,
        "agent.learning_rate": 2.5e-4,
        "agent.gae_lambda": 0.95,
        "agent.ent_coef": 0.01,
        "agent.vf_coef": 0.5,
    },
    "a2c": {
        "env.n_envs": 16,
        "agent.n_steps": 8,
        "agent.seq_len": 8,
        "agent.learning_rate": 1e-3,
        "agent.gae_lambda": 0.95,
        "agent.ent_coef": 0.001,
        "agent.vf_coef": 0.25,
    },
    "pqn": {
        "env.n_envs": 8,
        "agent.n_steps": 128,
        "agent.seq_len": 32,
        "agent.learning_rate": 2.5e-4,
        "agent.gae_lambda": 0.65,
        "agent.ent_coef": 0.0,
        "agent.vf_coef": 0.5,
    },
    "r2d2": {
        "env.n_envs": 8,
        "agent.n_steps": 128,
        "agent.seq_len": 32,
        "agent.learning_rate": 1e-4,
        "agent.gae_lambda": 0.95,
        "agent.ent_coef": 0.0,
        "agent.vf_coef": 0.5,
    },
}
"""Per-algorithm values of the keys whose good settings differ between PPO and A2C (dotted
keys). PPO's are the schema defaults. A2C takes one gradient step per rollout, so it wants
short rollouts from more envs; see docs/rl.md for the measurements behind these values."""


def algo_switch_overrides(file_algo: str, overrides: list[str]) -> list[str]:
    """Overrides that give a config file switched to another algorithm that algorithm's defaults.

    When ``overrides`` set ``agent.algo`` to something other than ``file_algo`` (the config
    file's algorithm), every key of :data:`ALGO_DEFAULTS` that the overrides do not set
    themselves gets the new algorithm's value (the file's values were chosen for the other
    algorithm). Put the result *before* the user's overrides.

    :param file_algo: ``agent.algo`` of the config file (``"ppo"`` when it has none).
    :param overrides: the command line's ``key.sub=value`` strings.
    :return: ``key=value`` strings; empty when the algorithm is not switched.
    """
    given = {item.partition("=")[0].strip(): item.partition("=")[2].strip() for item in overrides}
    algo = given.get("agent.algo", file_algo)
    if algo == file_algo or algo not in ALGO_DEFAULTS:
        return []  # an unknown algorithm is reported by the config's own validation
    return [f"{k}={v}" for k, v in ALGO_DEFAULTS[algo].items() if k not in given]


def config_to_dict(config: RLConfig) -> dict[str, Any]:
    """The config as plain dicts (for ``config.yaml`` and checkpoints)."""
    return asdict(config)


def config_from_dict(data: dict[str, Any]) -> RLConfig:
    """Rebuild a config saved by :func:`config_to_dict` (keys a newer schema added keep their
    defaults, keys of earlier releases are renamed; keys it no longer knows are an error)."""
    data = migrate_saved_config(data)
    sections = dict(env=EnvConfig, core=CoreConfig, agent=AgentConfig, train=TrainConfig)
    sections["run"] = RunConfig
    try:
        return RLConfig(**{k: cls(**dict(data.get(k) or {})) for k, cls in sections.items()})
    except TypeError as err:
        raise ValueError(f"saved config does not match the RL config schema: {err}") from err
