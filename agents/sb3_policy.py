"""Use any memcores core inside sb3-contrib's ``RecurrentPPO``.

::

    from sb3_contrib import RecurrentPPO
    from memcores.agents.sb3_policy import CorePolicy

    model = RecurrentPPO(CorePolicy, env, policy_kwargs=dict(core="fast_lstm"))
    model.learn(100_000)

:class:`CorePolicy` is sb3-contrib's ``RecurrentActorCriticPolicy`` (the ``MlpLstmPolicy``)
with its ``nn.LSTM`` replaced by a memcores core: features -> core -> SB3's MLP heads.
RecurrentPPO stores recurrent state as an LSTM-shaped pair ``(h, c)``, each
``[n_layers=1, n_envs, state_size]``, and replays it for its (padded) training sequences.

- Cores whose state is ``(h, c)`` with both ``[B, H]`` (the whole gated-LSTM family: ``lstm``,
  ``fast_lstm``, ``ur_lstm``, ``hdetach_lstm``, ``c_lstm``, ...) map onto it one-to-one:
  ``state_size = hidden_size``, nothing is packed.
- Any other core (``gru``, ``power_rnn``, ``lru``, ``rel_lstm``...) works too: its state tensors
  are flattened and packed into the two halves ``h``/``c`` (``state_size`` = half the total,
  rounded up; integer parts are stored as floats, exact below 2**24). Only memory grows with
  big states (``rel_lstm`` keeps its attention buffer in the state).

Episode starts reset the state with the core's own ``starts`` rule (its initial state, not
SB3's zeroing), so cores with a non-zero initial state behave as in memcores.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from torch import Tensor, nn

from memcores.cores import MemoryCore, State, make_core


class CoreAsLSTM(nn.Module):
    """Wrap a core so RecurrentPPO sees an ``nn.LSTM``-like module.

    Exposes ``input_size``, ``hidden_size`` (the size of each packed state half, which
    RecurrentPPO uses to allocate its state buffers) and ``num_layers = 1``.
    """

    def __init__(self, core: MemoryCore) -> None:
        super().__init__()
        self.core = core
        self.input_size = core.input_size
        self.num_layers = 1
        template = core.initial_state(1)
        self._shapes = [tuple(s.shape[1:]) for s in template]
        self._dtypes = [s.dtype for s in template]
        self._sizes = [math.prod(shape) for shape in self._shapes]
        self.is_lstm_state = len(template) == 2 and all(
            shape == (core.hidden_size,) and dtype.is_floating_point
            for shape, dtype in zip(self._shapes, self._dtypes, strict=True)
        )
        total = sum(self._sizes)
        self.hidden_size = core.hidden_size if self.is_lstm_state else max(1, -(-total // 2))

    def pack(self, state: State) -> tuple[Tensor, Tensor]:
        """Core state (each ``[B, ...]``) -> ``(h, c)`` each ``[1, B, hidden_size]``."""
        if self.is_lstm_state:
            return state[0].unsqueeze(0), state[1].unsqueeze(0)
        batch = state[0].shape[0]
        flat = torch.cat([s.reshape(batch, -1).float() for s in state], dim=1)
        flat = nn.functional.pad(flat, (0, 2 * self.hidden_size - flat.shape[1]))
        h, c = flat.split(self.hidden_size, dim=1)
        return h.unsqueeze(0), c.unsqueeze(0)

    def unpack(self, h: Tensor, c: Tensor) -> State:
        """Inverse of :meth:`pack`."""
        if self.is_lstm_state:
            return (h[0], c[0])
        flat = torch.cat([h[0], c[0]], dim=1)
        batch = flat.shape[0]
        out, offset = [], 0
        for shape, dtype, size in zip(self._shapes, self._dtypes, self._sizes, strict=True):
            part = flat[:, offset : offset + size].reshape(batch, *shape)
            out.append(part.round().to(dtype) if not dtype.is_floating_point else part.to(dtype))
            offset += size
        return tuple(out)


class CorePolicy(RecurrentActorCriticPolicy):
    """sb3-contrib ``RecurrentActorCriticPolicy`` running a memcores core instead of nn.LSTM.

    Takes every argument of ``RecurrentActorCriticPolicy`` plus:

    :param core: registered core name (``memcores list cores``), default ``lstm``.
    :param core_options: options for :func:`cores.make_core` (e.g. ``{"p": 0.25}``).

    ``lstm_hidden_size`` is the core's ``hidden_size``. A separate critic core is built when
    ``enable_critic_lstm=True`` (sb3's default); ``shared_lstm=True`` shares one core.
    """

    def __init__(
        self,
        *args: Any,
        core: str = "lstm",
        core_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        options = dict(core_options or {})
        hidden = self.lstm_output_dim
        self.core_name = core
        self.lstm_actor = CoreAsLSTM(make_core(core, self.features_dim, hidden, **options))
        if self.lstm_critic is not None:
            self.lstm_critic = CoreAsLSTM(make_core(core, self.features_dim, hidden, **options))
        # predict() sizes its initial state from this
        self.lstm_hidden_state_shape = (1, 1, self.lstm_actor.hidden_size)
        # the parent built its optimiser over the nn.LSTM it created; rebuild it over the core
        self.to(self.device)
        self.optimizer = self.optimizer_class(
            self.parameters(), lr=self._initial_lr, **self.optimizer_kwargs
        )

    def _build(self, lr_schedule: Any) -> None:
        self._initial_lr = lr_schedule(1)
        super()._build(lr_schedule)

    @staticmethod
    def _process_sequence(
        features: Tensor,
        lstm_states: tuple[Tensor, Tensor],
        episode_starts: Tensor,
        lstm: nn.Module,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One core call over RecurrentPPO's ``(n_seq * T, D)`` batch (sb3's layout)."""
        if not isinstance(lstm, CoreAsLSTM):
            return RecurrentActorCriticPolicy._process_sequence(
                features, lstm_states, episode_starts, lstm
            )
        n_seq = lstm_states[0].shape[1]
        # (n_seq * T, D) -> (T, n_seq, D); starts (n_seq * T,) -> (T, n_seq)
        x = features.reshape((n_seq, -1, lstm.input_size)).swapaxes(0, 1)
        starts = episode_starts.reshape((n_seq, -1)).swapaxes(0, 1).bool()
        y, state = lstm.core(x, lstm.unpack(*lstm_states), starts)  # y: (T, n_seq, H)
        # (T, n_seq, H) -> (n_seq * T, H), sequence-major as sb3 expects
        return torch.flatten(y.transpose(0, 1), start_dim=0, end_dim=1), lstm.pack(state)
