"""Recurrent actor-critic: observation encoder -> memory core -> actor and critic heads.

Observations are dicts of tensors with two leading dims ``[T, B]`` (time-major, like the
core): ``image [T, B, 7, 7, 3]`` uint8, ``direction [T, B]`` int64 and optionally
``mission [T, B, L]`` int64 token ids (0 = pad) for MiniGrid-API envs, or one
``vector [T, B, n]`` float32 for vector envs (POPGym; see
:class:`agents.vector_encoder.VectorEncoder`). The same module acts during rollouts
(``T = 1``) and replays whole chunks during updates (``T = seq_len``) in one core call.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from memcores.agents.device import to_device
from memcores.agents.reconstruction import ObservationDecoder
from memcores.agents.vector_encoder import VectorEncoder
from memcores.cores import MemoryCore, State, make_core
from memcores.envs.observation import CELL_VOCAB

Obs = dict[str, Tensor]
"""A batch of observations; every tensor starts with ``[T, B]``."""


class PolicyOutput(NamedTuple):
    """What one forward pass returns."""

    logits: Tensor  # [T, B, n_actions]
    values: Tensor  # [T, B]
    state: State  # the core state after step T
    features: Tensor | None = None  # [T, B, H] the actor core's outputs


def layer_init(layer: nn.Linear | nn.Conv2d, gain: float = float(np.sqrt(2))) -> Any:
    """Orthogonal weights and zero bias (CleanRL/SB3 initialisation)."""
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ImageEncoder(nn.Module):
    """MiniGrid's ``[..., H, W, 3]`` symbolic view -> ``[..., output_size]`` features.

    - ``flat``: one linear layer (+ReLU) on the flattened view, each channel scaled to [0, 1]
      (what SB3's MlpPolicy sees); by far the cheapest on CPU for 7x7 views.
    - ``cnn``: torch-ac's conv net on the raw integer channels (2x2 convs, one max-pool).
    - ``onehot``: one linear layer on the one-hot (object, colour, state) of every cell, so
      object identities are separate inputs (a key and a ball differ by one integer in the
      raw view); ~3x the cost of ``flat`` per minibatch on CPU.
    - ``embed``: learned embeddings of each cell's (object, colour, state), summed, then the
      same conv net.
    """

    def __init__(self, kind: str = "onehot", view: tuple[int, int] = (7, 7), embed_dim: int = 8):
        super().__init__()
        self.kind = kind
        self.input_shape = (*view, 3)
        in_channels = 3
        # channel maxima of the symbolic view (object, colour, state), for scaling to [0, 1]
        scale = 1.0 / torch.tensor(CELL_VOCAB, dtype=torch.float32).sub(1)
        self.register_buffer("scale", scale, persistent=False)
        maxima = torch.tensor(CELL_VOCAB).sub(1)
        offsets = torch.tensor([0, CELL_VOCAB[0], CELL_VOCAB[0] + CELL_VOCAB[1]])
        self.register_buffer("maxima", maxima, persistent=False)
        self.register_buffer("offsets", offsets, persistent=False)
        if kind == "flat":
            self.linear = layer_init(nn.Linear(view[0] * view[1] * 3, 64))
            self.output_size = 64
            return
        if kind == "onehot":
            self.linear = layer_init(nn.Linear(view[0] * view[1] * sum(CELL_VOCAB), 64))
            self.output_size = 64
            return
        if kind == "embed":
            self.embed = nn.Embedding(sum(CELL_VOCAB), embed_dim)
            in_channels = embed_dim
        elif kind != "cnn":
            raise ValueError(f"unknown image encoder {kind!r}; valid: flat, onehot, cnn, embed")
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, 16, 2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 2),
            nn.ReLU(),
            nn.Conv2d(32, 64, 2),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            self.output_size = self.conv(torch.zeros(1, in_channels, *view)).shape[-1]

    def forward(self, image: Tensor) -> Tensor:
        """``image [N, H, W, 3]`` uint8 -> ``[N, output_size]``."""
        if self.kind == "flat":
            return torch.relu(self.linear((image.float() * self.scale).flatten(1)))
        idx = torch.minimum(image.long(), self.maxima) + self.offsets  # [N, H, W, 3] in [0, 20)
        if self.kind == "onehot":
            n = idx.shape[0]
            cells = idx.view(n, -1, 3)  # [N, H*W, 3]
            onehot = torch.zeros(n, cells.shape[1], sum(CELL_VOCAB), device=idx.device)
            onehot.scatter_(2, cells, 1.0)  # [N, H*W, 20]: object, colour, state one-hot
            return torch.relu(self.linear(onehot.flatten(1)))
        if self.kind == "embed":
            x = self.embed(idx).sum(-2).permute(0, 3, 1, 2)  # [N, E, H, W]
        else:
            x = image.permute(0, 3, 1, 2).float()  # [N, 3, H, W]
        return self.conv(x)


class MissionEncoder(nn.Module):
    """Mission token ids ``[N, L]`` -> ``[N, dim]`` (mean of word embeddings, or a GRU)."""

    def __init__(self, vocab_size: int, kind: str = "mean", dim: int = 32) -> None:
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.gru = nn.GRU(dim, dim, batch_first=True) if kind == "gru" else None
        self.output_size = dim

    def forward(self, tokens: Tensor) -> Tensor:
        """``tokens [N, L]`` (pads at the end) -> ``[N, dim]``."""
        # Missions are short and padded at the end to a fixed length: on the CPU, drop the
        # all-pad tail columns (4-5x less embedding work for MiniGrid's missions). Off the CPU
        # that would read the device from the host (a wait per call, and no CUDA graph of the
        # update); pads embed to zeros and are masked, so keeping them changes nothing.
        if tokens.device.type == "cpu":
            longest = max(int((tokens > 0).sum(1).max()), 1) if tokens.numel() else 1
            tokens = tokens[:, :longest]
        mask = (tokens > 0).unsqueeze(-1)  # [N, L', 1]
        emb = self.embed(tokens)  # [N, L, dim]; pads embed to 0
        if self.gru is None:
            return emb.sum(1) / mask.sum(1).clamp_min(1)
        out, _ = self.gru(emb)  # [N, L, dim]
        last = (mask.squeeze(-1).sum(1) - 1).clamp_min(0)  # index of the last word
        return out[torch.arange(out.shape[0], device=out.device), last]


def observation_shape(space: Any) -> tuple[int, ...]:
    """The shape a policy is built for: MiniGrid's image ``(H, W, 3)``, or ``(n,)`` for a
    ``Dict(vector=Box(n,))`` observation.

    :raises ValueError: any other observation space (one line naming what is supported).
    """
    keys = set(getattr(space, "spaces", {}))
    if "image" in keys:
        return tuple(space["image"].shape)
    if keys == {"vector"} and len(space["vector"].shape) == 1:
        return tuple(space["vector"].shape)
    raise ValueError(
        f"unsupported observation space {space}; the policy reads MiniGrid dicts (image, "
        "direction, mission) or Dict(vector=Box(n,)) (POPGym ids)"
    )


class ActorCriticCores(MemoryCore):
    """Two cores of one kind on the same input: the actor's and the critic's.

    With one shared core the value loss shapes the memory the policy reads; where the value
    does not depend on what must be remembered (a cue, before the choice it decides) that loss
    pushes the state to drop it. Separate cores keep the critic's gradient out of the actor's
    memory (SB3-contrib's RecurrentPPO default, ``shared_lstm=False``). The output is
    ``[y_actor, y_critic]`` (``[T, B, 2 * hidden_size]``); the state is the actor's tuple
    followed by the critic's.
    """

    def __init__(
        self, core_name: str, input_size: int, hidden_size: int, options: dict[str, Any]
    ) -> None:
        super().__init__(input_size, 2 * hidden_size)
        self.actor_core = make_core(core_name, input_size, hidden_size, **options)
        self.critic_core = make_core(core_name, input_size, hidden_size, **options)
        self._split = len(self.actor_core.initial_state(1))

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        return (
            *self.actor_core.initial_state(batch_size, device),
            *self.critic_core.initial_state(batch_size, device),
        )

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, D]`` -> ``[T, B, 2H]`` (actor's then critic's outputs), new state."""
        y_actor, s_actor = self.actor_core(x, state[: self._split], starts)
        y_critic, s_critic = self.critic_core(x, state[self._split :], starts)
        return torch.cat([y_actor, y_critic], -1), (*s_actor, *s_critic)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One step of both cores (``forward`` with ``T = 1`` for cores without ``step``)."""
        outputs, states = [], []
        for core, part in (
            (self.actor_core, state[: self._split]),
            (self.critic_core, state[self._split :]),
        ):
            if not core.has_step:
                y, new = core(x_t.unsqueeze(0), part)
                y = y[0]
            else:
                y, new = core.step(x_t, part)
            outputs.append(y)
            states.extend(new)
        return torch.cat(outputs, -1), tuple(states)


class RecurrentActorCritic(nn.Module):
    """Encoder (image, direction, mission) -> memory core -> actor and critic MLP heads.

    :param n_actions: size of the discrete action space.
    :param core_name: registered core name (:data:`cores.CORES`).
    :param hidden_size: the core's output size.
    :param core_options: extra options for :func:`cores.make_core`.
    :param image_encoder: ``onehot``, ``flat``, ``cnn`` or ``embed`` (see :class:`ImageEncoder`).
    :param mission: ``none``, ``mean`` or ``gru`` (see :class:`MissionEncoder`).
    :param vocab_size: number of mission token ids.
    :param image_shape: the image observation's shape ``(H, W, 3)``, or ``(n,)`` for vector
        observations (then the image, direction and mission encoders are replaced by one
        :class:`~agents.vector_encoder.VectorEncoder`; see :func:`observation_shape`).
    :param separate_critic: give the critic its own core (:class:`ActorCriticCores`); the
        encoder stays shared.
    :param recon_lags: build an :class:`~agents.reconstruction.ObservationDecoder` reading the
        actor core's output back into the observations this many steps back (empty: none);
        ``recon_objects_only`` scores only the view cells that hold a thing.
    """

    greedy: bool = False
    """Whether evaluation always takes the argmax of the logits (a Q-network's values, which
    are no distribution to sample from) instead of sampling unless asked for the argmax."""

    def __init__(
        self,
        n_actions: int,
        core_name: str = "lstm",
        hidden_size: int = 128,
        core_options: dict[str, Any] | None = None,
        image_encoder: str = "onehot",
        mission: str = "mean",
        vocab_size: int = 1,
        image_shape: tuple[int, ...] = (7, 7, 3),
        separate_critic: bool = False,
        recon_lags: tuple[int, ...] = (),
        recon_objects_only: bool = False,
    ) -> None:
        super().__init__()
        self.vector = VectorEncoder(image_shape[0]) if len(image_shape) == 1 else None
        if self.vector is not None:
            self.image = self.direction = self.mission = None
            features = self.vector.output_size
        else:
            self.image = ImageEncoder(image_encoder, view=tuple(image_shape[:2]))
            self.direction = nn.Embedding(4, 8)
            self.mission = MissionEncoder(vocab_size, mission) if mission != "none" else None
            features = self.image.output_size + 8
            features += self.mission.output_size if self.mission is not None else 0
        self.features_size = features
        options = dict(core_options or {})
        self.core: MemoryCore = (
            ActorCriticCores(core_name, features, hidden_size, options)
            if separate_critic
            else make_core(core_name, features, hidden_size, **options)
        )
        self.separate_critic = separate_critic
        self.hidden_size = hidden_size
        # cores that implement step() (all but those with only a sequence forward, e.g. lru)
        self._has_step = self.core.has_step
        self.actor = nn.Sequential(
            layer_init(nn.Linear(hidden_size, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), gain=0.01),
        )
        self.critic = nn.Sequential(
            layer_init(nn.Linear(hidden_size, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), gain=1.0),
        )
        self.decoder = (
            ObservationDecoder(hidden_size, tuple(image_shape), recon_lags, recon_objects_only)
            if recon_lags
            else None
        )
        # One layer whose weight tells the policy's device, read on every acting step: a plain
        # attribute (not registered twice as a submodule), cheaper than indexing the Sequential.
        object.__setattr__(self, "_device_probe", self.critic[0])

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """The core's initial state for ``batch_size`` envs/sequences (default: on the
        policy's device)."""
        return self.core.initial_state(batch_size, self.device if device is None else device)

    @property
    def device(self) -> torch.device:
        """The device of the policy's weights; what enters :meth:`forward` is moved here."""
        return self._device_probe.weight.device

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The observation shape this policy reads (see :func:`observation_shape`)."""
        encoder = self.vector if self.vector is not None else self.image
        return tuple(encoder.input_shape)

    def encode(self, obs: Obs) -> Tensor:
        """``obs`` with leading ``[T, B]`` -> core input ``[T, B, features_size]``."""
        if self.vector is not None:
            vector = obs["vector"]  # [T, B, n]
            return self.vector(vector.flatten(0, 1)).view(*vector.shape[:2], -1)
        image = obs["image"]
        lead = image.shape[:2]
        parts = [
            self.image(image.flatten(0, 1)),  # [T*B, 64]
            self.direction(obs["direction"].flatten(0, 1)),  # [T*B, 8]
        ]
        if self.mission is not None:
            parts.append(self.mission(obs["mission"].flatten(0, 1)))  # [T*B, 32]
        return torch.cat(parts, -1).view(*lead, -1)

    def forward(self, obs: Obs, state: State, starts: Tensor) -> PolicyOutput:
        """One core call over a ``[T, B]`` block.

        :param obs: observations with leading dims ``[T, B]``.
        :param state: core state before step 0 (rows are reset where ``starts`` is true).
        :param starts: ``[T, B]`` bool, true on the first step of an episode.

        A policy off the CPU moves observations, state and starts to its device (a no-op
        where they already are), so a caller with CPU tensors need not know where it lives.
        """
        y_actor, y_critic, state = self.core_outputs(obs, state, starts)
        return PolicyOutput(self.actor(y_actor), self.critic(y_critic).squeeze(-1), state, y_actor)

    def core_outputs(self, obs: Obs, state: State, starts: Tensor) -> tuple[Tensor, Tensor, State]:
        """The encoder and core of :meth:`forward`: the actor's and critic's core outputs
        (``[T, B, H]`` each, one tensor without ``separate_critic``) and the new state."""
        device = self.device
        if device.type != "cpu":  # a GPU policy fed CPU tensors (on the CPU nothing moves)
            obs, state, starts = to_device((obs, state, starts), device)
        x = self.encode(obs)  # [T, B, D]
        if x.shape[0] == 1 and self._has_step and not torch.is_grad_enabled():
            # Acting (T = 1, no grad): the core's own step() skips the sequence machinery of
            # forward() (4x cheaper for the fused LSTM). Same contract: reset rows where
            # starts, then step; tests check it matches forward() for every core. Off the CPU
            # the masked reset runs unconditionally: reading starts.any() would make the host
            # wait for the device on every acting step.
            if device.type != "cpu" or bool(starts.any()):
                state = self.core.reset_state(state, starts[0])
            y_t, state = self.core.step(x[0], state)
            y = y_t.unsqueeze(0)  # [1, B, H]
        else:
            y, state = self.core(x, state, starts)  # y: [T, B, H]
        if self.separate_critic:
            return y[..., : self.hidden_size], y[..., self.hidden_size :], state
        return y, y, state


def sample_actions(logits: Tensor, argmax: bool = False) -> tuple[Tensor, Tensor]:
    """Sample (or take the argmax of) a categorical policy; cheaper than ``Categorical``.

    :param logits: ``[..., A]``.
    :return: actions ``[...]`` int64 and their log-probabilities ``[...]``.
    """
    log_probs = torch.log_softmax(logits, -1)
    if argmax:
        actions = log_probs.argmax(-1)
    else:
        # Gumbel-max: one fused op instead of multinomial's per-row overhead.
        u = torch.rand_like(log_probs).clamp_(1e-10, 1.0)
        actions = (log_probs - torch.log(-torch.log(u))).argmax(-1)
    return actions, log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def log_prob_entropy(logits: Tensor, actions: Tensor) -> tuple[Tensor, Tensor]:
    """Log-probability of ``actions`` and the entropy of ``Categorical(logits)``, both ``[...]``."""
    log_probs = torch.log_softmax(logits, -1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1), entropy


def obs_to_tensors(obs: dict[str, np.ndarray] | dict[str, Tensor], device: torch.device) -> Obs:
    """A vector env's batched numpy observation (or a batched env's tensors) -> tensors with a
    leading ``[1, B]``.

    ``torch.from_numpy`` shares memory (no copy on CPU); dtypes stay as the env made them
    (uint8 image, int64 ids), so one conversion per step and no float copies.
    """
    return {
        k: (v if isinstance(v, Tensor) else torch.from_numpy(np.asarray(v)))
        .to(device, non_blocking=True)
        .unsqueeze(0)
        for k, v in obs.items()
    }
