"""cuDNN for the presets whose maths is exactly ``torch.nn.LSTM``'s or ``torch.nn.GRU``'s.

``lstm``, ``u_lstm`` and ``c_lstm`` (sigmoid gates, untied, no refine gate; differing only in
their bias initialisation), ``hdetach_lstm`` outside training, and ``gru`` are the equations
of PyTorch's own cells with the gate blocks in another order. On CUDA tensors, for a call
without an episode start after its first step (cuDNN cannot reset inside a sequence; starts
held on the GPU are not read back, see :func:`_no_inner_starts`), they run through PyTorch's
cuDNN kernels: the weights are reordered with autograd on every call (a few
small copies), so gradients reach this core's own parameters.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from memcores.cores.base import State, reset_where

# the weights are reordered into new tensors on every call by design (so gradients reach the
# core's own parameters); PyTorch's advice to flatten them does not apply
warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous")


def _keeps_backward() -> bool:
    """cuDNN's ``train`` flag (keep what the backward needs): not the module's ``training``,
    since eval-mode cores are differentiated too (the memory probe) and cuDNN refuses a backward
    of a call made with ``train=False``."""
    return torch.is_grad_enabled()


def lstm_applies(core: Any, starts: Tensor | None) -> bool:
    """Whether :func:`lstm` computes exactly what ``core``'s reference loop computes."""
    plain = core.activation == "sigmoid" and not core.tied and not core.refine
    detaching = core.hdetach and core.training and core.p > 0.0
    return plain and core.power == 0.0 and not detaching and _no_inner_starts(starts)


def gru_applies(core: Any, starts: Tensor | None) -> bool:
    """Whether :func:`gru` computes exactly what ``core``'s reference loop computes."""
    plain = core.activation == "sigmoid" and not core.refine and core.power == 0.0
    return plain and _no_inner_starts(starts)


def _no_inner_starts(starts: Tensor | None) -> bool:
    """No episode starts after the first step. Starts on a GPU are not read (the host would
    wait for the queued kernels): there ``starts`` over several steps count as inner ones."""
    if starts is None or starts.shape[0] <= 1:
        return True
    return starts.device.type == "cpu" and not bool(starts[1:].any())


def _start_state(state: State, starts: Tensor | None) -> State:
    """The state the first step reads: rows starting an episode there take zeros."""
    return state if starts is None else reset_where(state, starts[0].to(state[0].device))


def _reordered(core: Any, names: tuple[str, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """``weight_ih, weight_hh, bias`` with their gate blocks in the order ``names``."""
    order = [core._block(name) for name in names]
    return tuple(
        torch.cat([w[b] for b in order]) for w in (core.weight_ih, core.weight_hh, core.bias)
    )


def lstm(core: Any, x: Tensor, state: State, starts: Tensor | None) -> tuple[Tensor, State]:
    """``x [T, B, D]`` through ``torch._VF.lstm`` (cuDNN on CUDA) with ``core``'s weights.

    The core's blocks are ``o, f, i, u``; PyTorch's are ``i, f, g, o``.
    """
    w_ih, w_hh, b_ih = _reordered(core, ("i", "f", "u", "o"))
    h0, c0 = _start_state(state, starts)
    weights = [w_ih, w_hh, b_ih, torch.zeros_like(b_ih)]
    # biases, layers, dropout, train, bidirectional, batch_first
    flags = (True, 1, 0.0, _keeps_backward(), False, False)
    y, h, c = torch._VF.lstm(x, (h0.unsqueeze(0), c0.unsqueeze(0)), weights, *flags)
    return y, (h[0], c[0])


def gru(core: Any, x: Tensor, state: State, starts: Tensor | None) -> tuple[Tensor, State]:
    """``x [T, B, D]`` through ``torch._VF.gru`` (cuDNN on CUDA) with ``core``'s weights.

    The core's blocks are ``z, r, n`` and ``b_hn``; PyTorch's are ``r, z, n`` with ``b_hh``.
    """
    w_ih, w_hh, b_ih = _reordered(core, ("r", "z", "n"))
    b_hh = torch.cat([core.bias_hn.new_zeros(2 * core.hidden_size), core.bias_hn])
    (h0,) = _start_state(state, starts)
    y, h = torch._VF.gru(
        x, h0.unsqueeze(0), [w_ih, w_hh, b_ih, b_hh], True, 1, 0.0, _keeps_backward(), False, False
    )
    return y, (h[0],)
