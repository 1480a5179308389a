"""The memory-core contract shared by every recurrent module in memcores.

A core maps a time-major input sequence to a time-major output sequence and carries a state
between calls. The state is a flat tuple of batch-first tensors, so trainers can store it per
environment, index it per sequence, reset it with a mask and move it between devices without
knowing which core produced it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
from collections.abc import Callable, Hashable
from typing import ClassVar

import torch
from torch import Tensor, nn

State = tuple[Tensor, ...]
"""A core's recurrent state: a flat tuple of tensors, each of shape ``[B, ...]``."""


class MemoryCore(nn.Module):
    """Base class of every memory core.

    Subclasses set ``input_size`` and ``hidden_size`` and implement :meth:`initial_state` and
    either :meth:`step` (one time step; the default :meth:`forward` loops over it) or a faster
    :meth:`forward` of their own that honours the same ``starts`` semantics.

    Training-only behaviour (h-detach's stochastic detaching, the LRU's online gradient rule)
    follows ``self.training``; evaluation is deterministic.

    Capabilities are declared, never probed: ``has_step`` (the core implements :meth:`step`,
    which acting calls for ``T = 1``), ``has_fused`` (its :meth:`forward` runs a fused
    whole-sequence kernel on CUDA tensors), ``state_arity`` (how many tensors its state
    holds; :func:`check_sequence` checks it) and ``graph_safe`` (its :meth:`forward` can be
    recorded as a CUDA graph).
    """

    input_size: int
    hidden_size: int
    has_step: ClassVar[bool] = True
    """Whether :meth:`step` is implemented (False: the core only runs whole sequences)."""
    has_fused: bool = False
    """Whether :meth:`forward` dispatches CUDA tensors to a fused whole-sequence kernel."""
    state_arity: int | None = None
    """The number of tensors in the state, checked by :func:`check_sequence` (None: any)."""
    graph_safe: ClassVar[bool] = False
    """Whether :meth:`forward` can be recorded as a CUDA graph (:mod:`cores.graphed`): no host
    synchronisation besides :func:`steps_with_starts`, no shapes that depend on the data."""

    def graph_key(self, state: State) -> Hashable:
        """What a CUDA graph of :meth:`forward` holds fixed beyond the input shapes, read from
        ``state`` on the host once per call (:class:`cores.graphed.GraphedCore` records one
        graph per key, under :meth:`recording`). ``None``: the shapes alone fix the graph."""
        return None

    def recording(self, key: Hashable) -> contextlib.AbstractContextManager[None]:
        """The context a graph for ``key`` (:meth:`graph_key`) is recorded under."""
        return contextlib.nullcontext()

    def draws_on_host(self) -> bool:
        """Whether a training :meth:`forward` draws random numbers on the host (h-detach's
        per-step choice): a CUDA graph of the training step would replay the recorded draws
        (:mod:`agents.update_graph` refuses such a core)."""
        return False

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        if input_size <= 0 or hidden_size <= 0:
            raise ValueError(
                f"input_size and hidden_size must be positive, got {input_size} and {hidden_size}"
            )
        self.input_size = int(input_size)
        self.hidden_size = int(hidden_size)

    # ------------------------------------------------------------------ contract
    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """The state before the first step: a tuple of ``[batch_size, ...]`` tensors."""
        raise NotImplementedError

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """Run the core over a sequence.

        :param x: ``[T, B, input_size]`` inputs.
        :param state: the state before ``x[0]``, as returned by :meth:`initial_state` or a
            previous call.
        :param starts: optional ``[T, B]`` bool; where ``starts[t, b]`` is true, row ``b`` of
            the state is reset to the initial state before ``x[t, b]`` is read.
        :return: ``y`` of shape ``[T, B, hidden_size]`` and the state after step ``T``.
        """
        check_sequence(self, x, state, starts)
        return step_loop(self.step, x, state, starts, self.reset_state)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One time step: ``x_t [B, input_size]`` -> ``y_t [B, hidden_size]`` and the new state."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement step() or override forward()"
        )

    # ------------------------------------------------------------------ helpers
    def zero_state(
        self, batch_size: int, device: torch.device | str | None, like: Tensor, count: int = 1
    ) -> State:
        """``count`` zero ``[batch_size, hidden_size]`` tensors of ``like``'s dtype, on
        ``device`` (default: ``like``'s), for cores whose whole state is such tensors."""
        device = like.device if device is None else device
        return tuple(
            torch.zeros(batch_size, self.hidden_size, dtype=like.dtype, device=device)
            for _ in range(count)
        )

    def scan_zero_reset(
        self,
        xproj: Tensor,
        state: State,
        starts: Tensor | None,
        step: Callable[[Tensor, State], tuple[Tensor, State]],
    ) -> tuple[Tensor, State]:
        """Loop ``step`` over inputs already projected for every step at once.

        For cores whose initial state is all zeros: where ``starts[t, b]``, row ``b`` of every
        state tensor (of any dtype) is set to zero before step ``t``.

        :param xproj: ``[T, B, n]`` projected inputs (one matmul for the whole sequence).
        :param state: the state before step 0 (any flat tuple of ``[B, ...]`` tensors).
        :param starts: optional ``[T, B]`` bool episode starts.
        :param step: ``(xproj_t [B, n], state) -> (y_t [B, H], state)``.
        :return: ``y [T, B, H]`` and the state after step ``T``.
        """
        return step_loop(step, xproj, state, starts, reset_where)

    def reset_state(self, state: State, mask: Tensor) -> State:
        """Replace the rows of ``state`` where ``mask [B]`` is true by the initial state."""
        device = state[0].device if state else mask.device
        return reset_where(state, mask, self.initial_state(mask.shape[0], device))


@functools.cache
def triton_available() -> bool:
    """Whether ``triton`` is installed (CUDA builds of torch ship it); fused Triton paths run
    on CUDA tensors only then. Checked without importing it: ``cores`` imports only torch."""
    return importlib.util.find_spec("triton") is not None


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (False for device types autocast does not
    know, such as ``meta``, where ``torch.is_autocast_enabled`` raises)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return False


def _expand_mask(mask: Tensor, like: Tensor) -> Tensor:
    """``mask`` (``[B]`` or ``[T, B]``) viewed so it broadcasts against ``like`` (``[B, ...]`` or
    ``[T, B, ...]``)."""
    return mask.to(device=like.device).view(*mask.shape, *([1] * (like.dim() - mask.dim())))


def reset_where(state: State, mask: Tensor, initial: State | None = None) -> State:
    """The episode reset, written once: rows where ``mask`` is true take the initial state.

    Every core's step loop, every fused path and every kernel's reference resets through this
    function (kernels apply the same rule inside their time loop, from the same ``starts``).

    :param state: tensors ``[B, ...]`` (one step) or ``[T, B, ...]`` (whole sequences).
    :param mask: bool ``[B]`` or ``[T, B]``, true where a row restarts.
    :param initial: the initial state, broadcastable to ``state``'s tensors; ``None`` means
        all zeros (a gradient flowing back into a reset row is zeroed the same way).
    :return: the state with the masked rows replaced.
    """
    if initial is None:
        return tuple(torch.where(_expand_mask(mask, s), s.new_zeros(()), s) for s in state)
    return tuple(
        torch.where(_expand_mask(mask, s), i.to(dtype=s.dtype, device=s.device), s)
        for s, i in zip(state, initial, strict=True)
    )


def keep_mask(starts: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """``[T, B, 1]`` multipliers ``1 - starts`` (0 where a row restarts) for code that applies
    :func:`reset_where`'s zero reset to whole-sequence buffers by a product; ``None`` without
    starts."""
    return None if starts is None else (~starts.bool()).to(dtype).unsqueeze(-1)


def step_loop(
    step: Callable[[Tensor, State], tuple[Tensor, State]],
    inputs: Tensor,
    state: State,
    starts: Tensor | None,
    reset: Callable[[State, Tensor], State],
) -> tuple[Tensor, State]:
    """The reference time loop: reset rows where ``starts``, then step, for every step.

    :param step: ``(input_t [B, ...], state) -> (y_t [B, H], state)``.
    :param inputs: ``[T, B, ...]`` per-step inputs (raw or already projected).
    :param state: the state before step 0.
    :param starts: optional ``[T, B]`` bool episode starts.
    :param reset: ``(state, mask [B]) -> state``, e.g. :func:`reset_where` (zero initial state)
        or :meth:`MemoryCore.reset_state`.
    :return: ``y [T, B, H]`` and the state after step ``T``.
    """
    reset_steps = steps_with_starts(starts)
    outputs = []
    # unbind once: indexing inputs[t] inside the loop makes backward quadratic in T
    for t, x_t in enumerate(inputs.unbind(0)):
        if t in reset_steps:
            state = reset(state, starts[t].to(inputs.device))
        y_t, state = step(x_t, state)
        outputs.append(y_t)
    return torch.stack(outputs, 0), state


def reset_uniform_(weight_ih: Tensor, weight_hh: Tensor, bias: Tensor) -> None:
    """PyTorch's RNN initialisation: weights ``U(-1/sqrt(H), 1/sqrt(H))``, zero bias.

    ``H`` is ``weight_hh``'s column count (the hidden size). ``weight_ih`` is drawn before
    ``weight_hh``; that order fixes the values for a given seed. Callers then set gate biases.
    """
    bound = 1.0 / math.sqrt(weight_hh.shape[1])
    with torch.no_grad():
        weight_ih.uniform_(-bound, bound)
        weight_hh.uniform_(-bound, bound)
        bias.zero_()


def capturing(like: Tensor) -> bool:
    """Whether a CUDA graph is being recorded on the current stream of ``like``'s device."""
    return like.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def pow2_at_least(n: int) -> int:
    """The smallest power of two ``>= n`` (for ``n >= 1``)."""
    return 1 << max(0, (n - 1).bit_length())


def steps_with_starts(starts: Tensor | None) -> set[int]:
    """The time indices at which at least one batch row resets (one host sync per call).

    While a CUDA graph is being recorded (:mod:`cores.graphed`) the host cannot read
    ``starts``: every step is returned, so the masked reset runs at every step and the graph
    is right for whatever ``starts`` it is replayed with."""
    if starts is None:
        return set()
    if capturing(starts):
        return set(range(starts.shape[0]))
    return set(torch.nonzero(starts.any(dim=1)).flatten().tolist())


def check_sequence(core: MemoryCore, x: Tensor, state: State, starts: Tensor | None) -> None:
    """Raise a clear ``ValueError`` when ``x``/``state``/``starts`` do not fit the contract."""
    if x.dim() != 3 or x.shape[-1] != core.input_size:
        raise ValueError(
            f"{type(core).__name__} expects x of shape [T, B, {core.input_size}], "
            f"got {tuple(x.shape)}"
        )
    if not isinstance(state, tuple):
        raise TypeError(f"state must be a tuple of tensors, got {type(state).__name__}")
    batch = x.shape[1]
    if core.state_arity is not None and len(state) != core.state_arity:
        raise ValueError(
            f"{type(core).__name__} expects {core.state_arity} state tensors, got {len(state)}"
        )
    for s in state:
        if s.shape[0] != batch:
            raise ValueError(
                f"state tensors must be batch-first with B={batch}, got shape {tuple(s.shape)}"
            )
    if starts is not None and tuple(starts.shape) != tuple(x.shape[:2]):
        raise ValueError(
            f"starts must have shape [T, B]={tuple(x.shape[:2])}, got {tuple(starts.shape)}"
        )
