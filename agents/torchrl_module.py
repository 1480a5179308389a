"""Any memcores core as a torchrl module (``pip install memcores[torchrl]``).

:class:`CoreModule` plays the part of torchrl's ``LSTMModule``/``GRUModule`` for every core in
:data:`cores.CORES`::

    from torchrl.envs import InitTracker, TransformedEnv
    from memcores.agents.torchrl_module import CoreModule

    core = CoreModule(make_core("ur_lstm", 64, 128), in_key="embed", out_key="memory")
    env = TransformedEnv(env, InitTracker())            # writes "is_init"
    env.append_transform(core.make_tensordict_primer())  # the collector tracks the state

Two modes, chosen like ``LSTMModule``'s, by torchrl's ``set_recurrent_mode`` context
(or ``default_recurrent_mode``):

- **single-step** (acting in a collector): any batch shape, each entry one step. The state is
  read from ``"<state_key>_<i>"`` and written to ``("next", "<state_key>_<i>")``; where
  ``is_init`` is true the row is reset to the core's *own* initial state (not zeros).
- **recurrent** (losses): a ``[B, T]`` batch, time last. The state at ``t = 0`` of each row
  seeds one core call over the row; ``is_init`` is passed to the core as its ``starts``, so
  episode boundaries inside a row reset inside the core (no split-and-pad). The state written
  to ``"next"`` is zero except at the last step, which holds the final state (``LSTMModule``'s
  convention).

Values for GAE: :func:`add_state_values` evaluates the critic at every step of a collected
batch from the states the collector stored, which is exact; build torchrl's GAE with
``value_network=None`` so that it reads these values. (Given a value network, GAE recomputes
and overwrites them: its pass over ``"next"`` copies the root's ``is_init`` there and relies on
``LSTMModule`` restarting from the stored state at those flags, where a core resets to its
initial state instead; and it needs ``vmap`` off, a core's resets being data-dependent control
flow.)
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import Tensor
from torchrl.data.tensor_specs import Unbounded
from torchrl.envs.transforms import TensorDictPrimer
from torchrl.modules import set_recurrent_mode
from torchrl.modules.tensordict_module.rnn import recurrent_mode as torchrl_recurrent_mode

from memcores.cores import MemoryCore


class CoreModule(TensorDictModuleBase):
    """A memcores core reading and writing a tensordict.

    :param core: any :class:`~cores.MemoryCore`.
    :param in_key: the ``[..., input_size]`` input entry.
    :param out_key: the ``[..., hidden_size]`` output entry.
    :param state_key: prefix of the state entries, one per state tensor
        (``"<state_key>_0"``, ``"<state_key>_1"``, ...); give two cores different prefixes.
    :param default_recurrent_mode: the mode outside torchrl's ``set_recurrent_mode``.
    """

    def __init__(
        self,
        core: MemoryCore,
        in_key: str = "embed",
        out_key: str = "memory",
        state_key: str = "recurrent_state",
        default_recurrent_mode: bool = False,
    ) -> None:
        super().__init__()
        self.core = core
        template = core.initial_state(1)
        self.state_keys = [f"{state_key}_{i}" for i in range(len(template))]
        self._state_specs = [(tuple(s.shape[1:]), s.dtype) for s in template]
        self.in_keys = [in_key, *self.state_keys, "is_init"]
        self.out_keys = [out_key, *(("next", key) for key in self.state_keys)]
        self._default_recurrent_mode = bool(default_recurrent_mode)

    @property
    def recurrent_mode(self) -> bool:
        """True inside ``torchrl.modules.set_recurrent_mode(True)`` (or by default)."""
        mode = torchrl_recurrent_mode()
        return self._default_recurrent_mode if mode is None else bool(mode)

    def make_tensordict_primer(self) -> TensorDictPrimer:
        """The transform that adds the state entries to an env's specs, so collectors carry
        the state from ``"next"`` to the root at every step. Its zeros at a reset are never
        read: ``is_init`` resets the row to the core's initial state first."""
        return TensorDictPrimer(
            {
                key: Unbounded(shape=shape, dtype=dtype)
                for key, (shape, dtype) in zip(self.state_keys, self._state_specs, strict=True)
            },
            expand_specs=True,
        )

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Run the core on ``tensordict`` (see the module docstring for the two modes)."""
        shape = tensordict.shape
        if self.recurrent_mode:
            if tensordict.ndim == 0:
                raise ValueError("recurrent mode needs a tensordict with a time dimension")
            shaped = tensordict.unsqueeze(0) if tensordict.ndim == 1 else tensordict
            shaped = shaped.flatten(0, -2) if shaped.ndim > 2 else shaped  # [B, T]
        else:
            shaped = tensordict.reshape(-1).unsqueeze(-1)  # [N, 1]: one step per entry
        x = self._input(shaped).transpose(0, 1)  # [T, B, D]
        batch = x.shape[1]
        stored = self._stored_state(shaped)
        starts = shaped.get("is_init", None)
        if starts is None:
            starts = torch.zeros(shaped.shape, dtype=torch.bool, device=x.device)
            starts[:, 0] = True  # no state tracked: every row starts an episode
        starts = starts.reshape(shaped.shape).transpose(0, 1).bool()  # [T, B]
        if any(s is None for s in stored):
            state = self.core.initial_state(batch, x.device)
        else:
            state = tuple(s[:, 0] for s in stored)  # the state before each row's first step
        y, final = self.core(x, state, starts)  # y: [T, B, H]
        shaped.set(self.out_keys[0], y.transpose(0, 1))
        for key, tensor in zip(self.out_keys[1:], final, strict=True):
            shaped.set(key, _at_last_step(tensor, shaped.shape[1]))
        if shaped is not tensordict:
            tensordict.update(shaped.reshape(shape))
        return tensordict

    def _input(self, shaped: TensorDictBase) -> Tensor:
        """The ``[B, T, input_size]`` input entry.

        :raises ValueError: no ``in_key`` entry, or one of another width than the core's.
        """
        key, want = self.in_keys[0], self.core.input_size
        x = shaped.get(key, None)
        if x is None:
            keys = ", ".join(map(str, shaped.keys())) or "none"
            raise ValueError(
                f"CoreModule: the tensordict has no {key!r} (in_key); its keys: {keys}"
            )
        if x.ndim != 3 or x.shape[-1] != want:
            raise ValueError(
                f"CoreModule: {key!r} (in_key) must be [..., {want}] (the core's input_size), "
                f"got [..., {', '.join(map(str, x.shape[2:]))}]"
            )
        return x

    def _stored_state(self, shaped: TensorDictBase) -> list[Tensor | None]:
        """The ``[B, T, ...]`` state entries (None where absent).

        :raises ValueError: a state entry of another shape than the core's, or a state
            without ``is_init``: the state would be reset at every step (a collector without
            torchrl's ``InitTracker`` would train a memoryless core).
        """
        stored = [shaped.get(key, None) for key in self.state_keys]
        for key, tensor, (shape, _) in zip(self.state_keys, stored, self._state_specs, strict=True):
            if tensor is not None and tuple(tensor.shape[2:]) != shape:
                raise ValueError(
                    f"CoreModule: state entry {key!r} must be [..., {', '.join(map(str, shape))}] "
                    f"(the core's state), got [..., {', '.join(map(str, tensor.shape[2:]))}]"
                )
        if any(s is not None for s in stored) and "is_init" not in shaped.keys():
            raise ValueError(
                "CoreModule: the tensordict carries the state but no 'is_init': without it the "
                "state is reset at every step; add torchrl's InitTracker transform to the env "
                "(TransformedEnv(env, InitTracker()))"
            )
        return stored


def _at_last_step(state: Tensor, steps: int) -> Tensor:
    """``[B, ...]`` final state -> ``[B, steps, ...]``: zeros, the state at the last step."""
    out = state.new_zeros(state.shape[0], steps, *state.shape[1:])
    out[:, -1] = state
    return out


@torch.no_grad()
def add_state_values(
    critic: TensorDictModuleBase, data: TensorDictBase, value_key: str = "state_value"
) -> TensorDictBase:
    """Write ``value_key`` and ``("next", value_key)`` into a collected ``[B, T]`` batch.

    The collector stored, at every step, the state before it (root) and after it
    (``"next"``); both were made by the parameters being evaluated, so evaluating the critic
    one step at a time from them gives exactly the values a recurrent pass would, including
    ``V(s_{t+1})`` after the last step and across episode boundaries. ``"next"`` steps are
    never reset (``is_init`` false): the stored state already follows the episode.

    :param critic: a tensordict module whose recurrent part is a :class:`CoreModule`
        (run here in single-step mode).
    :return: ``data``, for chaining; pass it to torchrl's ``GAE`` built with
        ``value_network=None``, which then reads these.
    """
    with set_recurrent_mode(False):
        root = critic(data.select(*critic.in_keys, strict=False).clone(False))
        following = data.get("next").select(*critic.in_keys, strict=False).clone(False)
        following.set("is_init", torch.zeros_like(data.get("is_init")))
        following = critic(following)
    data.set(value_key, root.get(value_key))
    data.set(("next", value_key), following.get(value_key))
    return data
