"""Self-attentive recurrent cores: RelLSTM and RelRNN (relevancy screening), MemLSTM.

All follow Kerg, Kanuparthi et al., "Untangling tradeoffs between recurrence and
self-attention in neural networks" (NeurIPS 2020, arXiv:2006.09471; the second article of
B. Kanuparthi's 2020 M.Sc. thesis, Université de Montréal). The thesis leaves several points open;
this module settles them as follows.

Step ``t`` (shapes ``[B, H]`` unless noted)::

    i, f, g, o = split(W x_t + V s_{t-1} + b)              LSTM whose recurrent input is the
    c_t = sigma(f) c_{t-1} + sigma(i) tanh(g)               macro-state s_{t-1}, not h_{t-1}
    h_t = sigma(o) tanh(c_t)
    M_t = [buffer (nu slots, h_t included) ; relevant set (rho slots)]       [B, nu + rho, H]
    e_m = v^T tanh(W_a s_{t-1} + U_a m)  for m in M_t, empty slots -> -inf   [B, nu + rho]
    alpha = softmax(e)                                     one softmax over buffer + relevant set
    context_t = sum_m alpha_m m
    s_t = h_t + context_t             (average=True: s_t = 0.5 (h_t + context_t), public code)
    y_t = s_t                         the output is the macro-state, the input of the next step

Settled ambiguities:

- **Buffer.** Following Algorithm 2, ``h_t`` enters the buffer *before* attending, so the
  buffer at step ``t`` holds ``h_{t-nu+1} .. h_t`` and ``h_t`` can attend to itself, as in the
  base model where ``c_t`` includes ``alpha_{t,t} h_t``.
- **Relevance score.** ``beta(i) = sum_{j=i}^{i+nu-1} alpha_{i,j}``: the (detached) attention
  ``h_i`` received while it sat in the buffer. Scores never carry gradient.
- **Screening.** Option ``screen``: ``rho`` (default) screens ``h_{t-rho}`` at step ``t``, as
  Algorithm 2 (lines 6-7) writes; ``exit`` screens the state *leaving the buffer*,
  ``h_{t-nu}``, with its complete ``beta``, as the public code does. They agree when
  ``nu == rho``. Under ``rho`` with ``rho < nu`` the screened state is still buffered and is
  scored with the attention it has received so far; with ``rho > nu`` the state keeps
  ``rho - nu`` extra unattended buffer slots so that ``h_{t-rho}`` is screened with its
  complete score. The screened state enters the relevant set if a slot is free, otherwise it
  replaces the stored state with the lowest score if its own score is *strictly* greater
  (ties keep the older state). Decisions are per batch row, vectorised over the batch; a state
  in the relevant set keeps its score and is never rescored.
- **Attention key bias.** The key projection is ``U_a m + b_a`` (``b_a`` zero at
  initialisation and learned); the thesis's score ``v_a^T tanh(W_a s_{t-1} + U_a m)`` has no
  bias. ``key_bias=False`` gives the thesis's score exactly.
- **Gradients.** Stored states keep their autograd graph inside one ``forward`` call (the skip
  connections are the point of the model); across calls the trainer detaches the state as for
  any core (truncated BPTT).
- **State.** Everything a step needs is in the state tuple, so it is stored, replayed, reset by
  ``starts`` and moved between devices like any other core's state (the public code keeps the
  relevant set outside the replayable state and wipes it every step). Counts are stored as
  floating-point tensors in the state's dtype so that storage allocated with one dtype, masked
  resets (``torch.where`` against the zero initial state) and ``.to(dtype)`` all work.
- ``rho = 0`` gives a buffer-only model (local attention over the last ``nu`` states).

RelRNN (:class:`RelRNN`) is the same mechanism on the vanilla-RNN base of Algorithm 2,
``h_t = phi(V s_{t-1} + U x_t + b)``, with ``phi = tanh`` or ``modrelu``.

MemLSTM is the same step with ``M_t`` = every past state of the episode (MemRNN/MemLSTM in the
thesis). Its state holds a ``[B, max_len, H]`` memory; when more than ``max_len`` states exist,
``on_full="drop"`` (default) forgets the oldest (a sliding window of the last ``max_len``
states) and ``on_full="error"`` raises. Within a call the keys ``U_a m`` are computed once per
state (memory and compute stay quadratic in T, which is what the model is meant to show).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Hashable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memcores.cores import fast_tanh
from memcores.cores._fused_rel_lstm import buffer_mask, fused_rel_lstm, relevant_mask
from memcores.cores.base import (
    MemoryCore,
    State,
    autocast_enabled,
    capturing,
    check_sequence,
    pow2_at_least,
    reset_where,
    steps_with_starts,
)

ON_FULL = ("drop", "error")


def screening_update(
    buffer: Tensor,
    buffer_scores: Tensor,
    buffer_count: Tensor,
    relevant: Tensor,
    relevant_scores: Tensor,
    relevant_count: Tensor,
    new: Tensor,
    lag: int | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Screen the state pushed ``lag`` steps ago, then push ``new`` (pure function).

    Layout: the buffer's filled slots are its last ``buffer_count`` slots (oldest first, newest
    last); the relevant set's filled slots are its first ``relevant_count`` slots. The buffer
    may be longer than the attended window (``L = max(nu, lag)``): the extra oldest slots only
    delay states until they are screened.

    :param buffer: ``[B, L, H]`` the last ``L`` states.
    :param buffer_scores: ``[B, L]`` attention received so far by each buffered state.
    :param buffer_count: ``[B]`` number of filled buffer slots (float, 0..L).
    :param relevant: ``[B, rho, H]`` relevant set (``rho`` may be 0).
    :param relevant_scores: ``[B, rho]`` the final relevance score of each stored state.
    :param relevant_count: ``[B]`` number of filled relevant slots (float, 0..rho).
    :param new: ``[B, H]`` the state entering the buffer (score 0).
    :param lag: screen ``h_{t-lag}`` (``1 <= lag <= L``); default ``L``, the state that leaves
        the buffer now.
    :return: the six updated tensors, in the same order. The screened state enters the
        relevant set if a slot is free or if its score is strictly greater than the lowest
        stored score (which it then replaces). Rows whose buffer is full drop the oldest state.
    """
    L, rho = buffer.shape[1], relevant.shape[1]
    lag = L if lag is None else int(lag)
    if not 1 <= lag <= L:
        raise ValueError(f"lag must be in [1, {L}], got {lag}")
    full = buffer_count >= lag  # [B] bool: slot L - lag holds h_{t-lag}
    if rho > 0:
        leaving, leaving_score = buffer[:, L - lag], buffer_scores[:, L - lag]  # [B, H], [B]
        slots = torch.arange(rho, device=buffer.device)
        filled = slots < relevant_count.unsqueeze(1)  # [B, rho]
        ranked = relevant_scores.masked_fill(~filled, -math.inf)
        # argmin returns the first minimum: the first free slot if any, else the lowest score.
        target = ranked.argmin(dim=1, keepdim=True)  # [B, 1]
        target_filled = filled.gather(1, target).squeeze(1)  # [B]
        target_score = ranked.gather(1, target).squeeze(1)  # [B]
        insert = full & (~target_filled | (leaving_score > target_score))  # [B]
        hit = (slots == target) & insert.unsqueeze(1)  # [B, rho] one-hot where inserting
        relevant = torch.where(hit.unsqueeze(2), leaving.unsqueeze(1), relevant)
        relevant_scores = torch.where(hit, leaving_score.unsqueeze(1), relevant_scores)
        relevant_count = relevant_count + (insert & ~target_filled).to(relevant_count.dtype)
    buffer = torch.cat([buffer[:, 1:], new.unsqueeze(1)], dim=1)
    buffer_scores = torch.cat([buffer_scores[:, 1:], buffer_scores.new_zeros(len(new), 1)], 1)
    buffer_count = (buffer_count + 1).clamp(max=L)
    return buffer, buffer_scores, buffer_count, relevant, relevant_scores, relevant_count


class _AttentiveLSTM(MemoryCore):
    """Shared parameters and maths of RelLSTM and MemLSTM (LSTM on ``s`` + additive attention)."""

    GATES = 4  # pre-activation blocks of the base cell: i, f, g, o

    def __init__(
        self, input_size: int, hidden_size: int, average: bool, key_bias: bool = True
    ) -> None:
        super().__init__(input_size, hidden_size)
        H = hidden_size
        self.average = bool(average)
        self.key_bias = bool(key_bias)
        self.input_proj = nn.Linear(input_size, self.GATES * H)  # W x + b (LSTM: i, f, g, o)
        self.recurrent = nn.Linear(H, self.GATES * H, bias=False)  # V s_{t-1}
        self.query = nn.Linear(H, H, bias=False)  # W_a s_{t-1}
        # U_a m (+ b_a): the thesis's score v^T tanh(W_a s + U_a m) has no bias; b_a (zero at
        # initialisation, learned) shifts every slot's tanh argument alike, i.e. a query bias.
        self.key = nn.Linear(H, H, bias=self.key_bias)
        self.score = nn.Linear(H, 1, bias=False)  # v_a
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """LSTM weights ``U(-1/sqrt(H), 1/sqrt(H))`` with forget bias 1; attention Xavier-normal
        (as the public code)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for w in (self.input_proj.weight, self.recurrent.weight, self.input_proj.bias):
            nn.init.uniform_(w, -bound, bound)
        H = self.hidden_size
        with torch.no_grad():
            self.input_proj.bias[H : 2 * H].fill_(1.0)
        self._reset_attention()

    def _reset_attention(self) -> None:
        for lin in (self.query, self.key, self.score):
            nn.init.xavier_normal_(lin.weight)
        if self.key.bias is not None:
            nn.init.zeros_(self.key.bias)

    def _dtype(self) -> torch.dtype:
        return self.input_proj.weight.dtype

    def _lstm(self, xp_t: Tensor, s: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        """``xp_t = W x_t + b [B, 4H]`` -> ``h_t, c_t [B, H]`` with recurrent input ``s``."""
        i, f, g, o = (xp_t + self.recurrent(s)).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def _attend(self, s_prev: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
        """Additive attention: ``[B, H]`` query state, ``[B, K, H]`` keys/values, ``[B, K]``
        bool mask -> attention weights ``[B, K]`` (zero on empty slots)."""
        logits = self.score(fast_tanh.tanh(self.query(s_prev).unsqueeze(1) + keys)).squeeze(2)
        return F.softmax(logits.masked_fill(~mask, -math.inf), dim=1)

    def _combine(self, h: Tensor, context: Tensor) -> Tensor:
        return 0.5 * (h + context) if self.average else h + context


SCREENS = ("rho", "exit")
IMPLS = ("fused", "loop")


class RelLSTM(_AttentiveLSTM):
    """LSTM attending over a short-term buffer and a relevancy-screened set of past states.

    :param input_size: size ``D`` of each input vector.
    :param hidden_size: size ``H`` of ``h``, ``c``, ``s`` and the output.
    :param nu: buffer length (``>= 1``; the buffer includes the current ``h_t``).
    :param rho: relevant-set size (``>= 0``; 0 gives attention over the buffer only).
    :param average: ``s_t = 0.5 (h_t + context_t)`` (public code) instead of ``h_t + context_t``
        (thesis, Algorithm 2).
    :param screen: which state is screened at step ``t``: ``rho`` (Algorithm 2, ``h_{t-rho}``)
        or ``exit`` (the state leaving the buffer, ``h_{t-nu}``, as the public code). They agree
        when ``nu == rho``. With ``rho`` and ``rho < nu`` the screened state is still in the
        buffer and carries the attention it received so far (``rho`` steps of it); with
        ``rho > nu`` the buffer keeps ``rho - nu`` extra, unattended slots so that ``h_{t-rho}``
        is screened with its complete score.
    :param key_bias: give the key projection ``U_a`` a bias (the thesis's score has none).
    :param impl: ``fused`` (one autograd function over the whole sequence with a hand-written
        backward, :mod:`cores._fused_rel_lstm`) or ``loop`` (the reference step loop, which
        also runs single steps and under autocast). Same maths.

    State (all batch-first, dtype of the parameters; ``L = max(nu, rho)`` for ``screen=rho``,
    ``L = nu`` for ``exit``)::

        h [B, H], c [B, H], s [B, H],
        buffer [B, L, H], buffer_scores [B, L], buffer_count [B],
        relevant [B, rho, H], relevant_scores [B, rho], relevant_count [B]

    Memory and compute per step are ``O((L + rho) H)`` and ``O((nu + rho) H^2)``: linear in T.
    """

    graph_safe = True  # no host reads inside forward: CUDA-graph capturable (cores.graphed)

    CELL_NAMES: tuple[str, ...] = ("h", "c")
    MEMORY_NAMES = (
        "s",
        "buffer",
        "buffer_scores",
        "buffer_count",
        "relevant",
        "relevant_scores",
        "relevant_count",
    )
    STATE_NAMES = CELL_NAMES + MEMORY_NAMES

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        nu: int = 5,
        rho: int = 5,
        average: bool = False,
        screen: str = "rho",
        key_bias: bool = True,
        impl: str = "fused",
    ) -> None:
        if int(nu) < 1:
            raise ValueError(f"nu (buffer length) must be >= 1, got {nu}")
        if int(rho) < 0:
            raise ValueError(f"rho (relevant-set size) must be >= 0, got {rho}")
        if screen not in SCREENS:
            raise ValueError(f"unknown screen {screen!r}; valid: {', '.join(SCREENS)}")
        if impl not in IMPLS:
            raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(IMPLS)}")
        self._init_core(input_size, hidden_size, average, key_bias)
        self.nu = int(nu)
        self.rho = int(rho)
        self.screen = screen
        self.impl = impl
        self.lag = self.rho if screen == "rho" and self.rho > 0 else self.nu
        self.length = max(self.nu, self.lag)  # buffer slots held in the state

    def _init_core(self, input_size: int, hidden_size: int, average: bool, key_bias: bool) -> None:
        _AttentiveLSTM.__init__(self, input_size, hidden_size, average, key_bias)

    def _cell(self, xp_t: Tensor, s: Tensor, cell: State) -> tuple[Tensor, State]:
        """Base recurrence on the macro-state: ``xp_t = W x_t + b``, ``s [B, H]`` -> ``h_t``."""
        h, c = self._lstm(xp_t, s, cell[1])
        return h, (h, c)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """All zeros: empty buffer and relevant set."""
        B, H, kw = batch_size, self.hidden_size, dict(device=device, dtype=self._dtype())
        return (
            *(torch.zeros(B, H, **kw) for _ in self.CELL_NAMES),
            torch.zeros(B, H, **kw),
            torch.zeros(B, self.length, H, **kw),
            torch.zeros(B, self.length, **kw),
            torch.zeros(B, **kw),
            torch.zeros(B, self.rho, H, **kw),
            torch.zeros(B, self.rho, **kw),
            torch.zeros(B, **kw),
        )

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One step: ``x_t [B, D]`` -> ``y_t = s_t [B, H]`` and the new state."""
        y, state = self.forward(x_t.unsqueeze(0), state)
        return y[0], state

    # Inside forward the buffer and the relevant set carry each state's key next to it,
    # ``payload = [m ; U_a m]`` of shape [..., 2H], so U_a is applied once per state (when it
    # is created) instead of to all nu + rho slots at every step. The state tuple holds the
    # values only; keys are recomputed from them at the start of each call, so they always
    # match the current parameters.
    def _to_carry(self, state: State) -> State:
        n = len(self.CELL_NAMES)
        s, buf, buf_sc, buf_n, rel, rel_sc, rel_n = state[n:]
        buf = torch.cat([buf, self.key(buf)], dim=2)
        rel = torch.cat([rel, self.key(rel)], dim=2)
        return (*state[:n], s, buf, buf_sc, buf_n, rel, rel_sc, rel_n)

    def _to_state(self, carry: State) -> State:
        n = len(self.CELL_NAMES)
        s, buf, buf_sc, buf_n, rel, rel_sc, rel_n = carry[n:]
        buf, rel = (p[..., : self.hidden_size].contiguous() for p in (buf, rel))
        return (*carry[:n], s, buf, buf_sc, buf_n, rel, rel_sc, rel_n)

    def _step(self, xp_t: Tensor, carry: State) -> tuple[Tensor, State]:
        """One step on the internal carry (payloads ``[B, L|rho, 2H]``)."""
        n = len(self.CELL_NAMES)
        s, buf, buf_sc, buf_n, rel, rel_sc, rel_n = carry[n:]
        H, nu, L = self.hidden_size, self.nu, self.length
        h, cell = self._cell(xp_t, s, carry[:n])
        new = torch.cat([h, self.key(h)], dim=1)  # [B, 2H]
        buf, buf_sc, buf_n, rel, rel_sc, rel_n = screening_update(
            buf, buf_sc, buf_n, rel, rel_sc, rel_n, new, self.lag
        )
        window = buf[:, L - nu :]  # the attended buffer: the last nu states
        mask = buffer_mask(buf_n, nu)
        if self.rho > 0:
            values = torch.cat([window[..., :H], rel[..., :H]], dim=1)  # [B, nu + rho, H]
            keys = torch.cat([window[..., H:], rel[..., H:]], dim=1)
            mask = torch.cat([mask, relevant_mask(rel_n, self.rho)], dim=1)
        else:
            values, keys = window[..., :H], window[..., H:]
        alpha = self._attend(s, keys, values, mask)  # [B, nu + rho]
        context = torch.bmm(alpha.unsqueeze(1), values).squeeze(1)
        # relevance: attention received while in the attended window
        received = alpha[:, :nu].detach()
        if L > nu:
            received = torch.cat([received.new_zeros(len(received), L - nu), received], 1)
        buf_sc = buf_sc + received
        s = self._combine(h, context)
        return s, (*cell, s, buf, buf_sc, buf_n, rel, rel_sc, rel_n)

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, D]`` -> ``y [T, B, H]`` (the macro-states ``s_t``) and the final state."""
        check_sequence(self, x, state, starts)
        xp = self.input_proj(x)  # [T, B, G*H]: one matmul for all input projections
        carry = self._to_carry(state)
        # the fused function writes into preallocated buffers, which autocast's dtype changes
        # would break; under autocast the reference loop runs instead
        # one step (acting) runs the loop: the fused function's setup costs more than it saves
        fused = self.impl == "fused" and x.shape[0] > 1
        if fused and not autocast_enabled(x.device.type):
            return fused_rel_lstm(self, xp, carry, starts, frozenset(steps_with_starts(starts)))
        # the initial state is all zeros (a zero key in an empty slot is never used)
        y, carry = self.scan_zero_reset(xp, carry, starts, self._step)
        return y, self._to_state(carry)

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, nu={self.nu}, rho={self.rho}, "
            f"average={self.average}, screen={self.screen}, key_bias={self.key_bias}"
            + (f", impl={self.impl}" if self.impl != "fused" else "")
        )


NONLINEARITIES = ("tanh", "modrelu")


class RelRNN(RelLSTM):
    """RelRNN: relevancy screening (Algorithm 2) on a vanilla RNN base.

    ``h_t = phi(V s_{t-1} + U x_t + b)`` replaces the LSTM; everything else (buffer, screening,
    attention, ``s_t = h_t + context_t``) is :class:`RelLSTM`'s. ``phi`` is ``tanh`` (the
    thesis's copy setting, Table 9) or ``modrelu`` (its denoise setting, Table 10:
    ``modrelu(z) = sign(z) relu(|z| + b_m)``, Arjovsky et al. 2016, with a learned ``b_m [H]``).
    The thesis gives no initialisation: ``V`` is orthogonal, ``U ~ U(-1/sqrt(H), 1/sqrt(H))``,
    ``b = 0``, ``b_m ~ U(-0.01, 0.01)``; attention as :class:`RelLSTM`.

    Options as :class:`RelLSTM` plus ``nonlinearity``. State: ``h [B, H], s [B, H]`` and the
    seven memory tensors of :class:`RelLSTM` (no cell state).
    """

    GATES = 1
    CELL_NAMES = ("h",)
    STATE_NAMES = CELL_NAMES + RelLSTM.MEMORY_NAMES

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        nu: int = 5,
        rho: int = 5,
        average: bool = False,
        screen: str = "rho",
        key_bias: bool = True,
        nonlinearity: str = "tanh",
    ) -> None:
        if nonlinearity not in NONLINEARITIES:
            raise ValueError(
                f"unknown nonlinearity {nonlinearity!r}; valid: {', '.join(NONLINEARITIES)}"
            )
        self.nonlinearity = nonlinearity
        super().__init__(
            input_size,
            hidden_size,
            nu=nu,
            rho=rho,
            average=average,
            screen=screen,
            key_bias=key_bias,
            impl="loop",  # the fused function implements the LSTM base only
        )

    def _init_core(self, input_size: int, hidden_size: int, average: bool, key_bias: bool) -> None:
        nonlinearity = self.__dict__.pop("nonlinearity")  # set before nn.Module.__init__
        _AttentiveLSTM.__init__(self, input_size, hidden_size, average, key_bias)
        self.nonlinearity = nonlinearity
        modrelu = nonlinearity == "modrelu"
        bias = nn.Parameter(torch.empty(hidden_size).uniform_(-0.01, 0.01)) if modrelu else None
        self.register_parameter("modrelu_bias", bias)

    def reset_parameters(self) -> None:
        """``V`` orthogonal, ``U ~ U(+-1/sqrt(H))``, ``b = 0``; attention Xavier-normal."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        nn.init.uniform_(self.input_proj.weight, -bound, bound)
        nn.init.zeros_(self.input_proj.bias)
        nn.init.orthogonal_(self.recurrent.weight)
        self._reset_attention()

    def _cell(self, xp_t: Tensor, s: Tensor, cell: State) -> tuple[Tensor, State]:
        z = xp_t + self.recurrent(s)
        if self.nonlinearity == "tanh":
            h = torch.tanh(z)
        else:
            h = torch.sign(z) * F.relu(z.abs() + self.modrelu_bias)
        return h, (h,)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", nonlinearity={self.nonlinearity}"


class MemLSTM(_AttentiveLSTM):
    """LSTM attending over every past state of the episode (MemLSTM; quadratic in T).

    :param input_size: size ``D`` of each input vector.
    :param hidden_size: size ``H`` of ``h``, ``c``, ``s`` and the output.
    :param max_len: the most past states kept (the state's memory is ``[B, max_len, H]``).
    :param on_full: ``drop`` the oldest state when more than ``max_len`` exist (sliding
        window), or raise an ``error``.
    :param average: ``s_t = 0.5 (h_t + context_t)`` instead of ``h_t + context_t``.

    State: ``h [B, H], c [B, H], s [B, H], memory [B, max_len, H], count [B]``; a row's valid
    states are the last ``count`` slots of its memory (oldest first), the rest are zero.
    """

    STATE_NAMES = ("h", "c", "s", "memory", "count")

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        max_len: int = 1024,
        on_full: str = "drop",
        average: bool = False,
    ) -> None:
        if int(max_len) < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        if on_full not in ON_FULL:
            raise ValueError(f"unknown on_full {on_full!r}; valid: {', '.join(ON_FULL)}")
        super().__init__(input_size, hidden_size, average)
        self.max_len = int(max_len)
        self.on_full = on_full
        # "error" reads the memory's fill on the host at every step once it is full
        self.graph_safe = on_full == "drop"
        self._recorded_columns: int | None = None

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """All zeros: an empty memory."""
        B, H, kw = batch_size, self.hidden_size, dict(device=device, dtype=self._dtype())
        return (
            torch.zeros(B, H, **kw),
            torch.zeros(B, H, **kw),
            torch.zeros(B, H, **kw),
            torch.zeros(B, self.max_len, H, **kw),
            torch.zeros(B, **kw),
        )

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One step: ``x_t [B, D]`` -> ``y_t [B, H]`` and the new state."""
        y, state = self.forward(x_t.unsqueeze(0), state)
        return y[0], state

    def _columns_in_use(self, count: Tensor) -> int:
        """How many trailing memory slots any row uses (one host sync per call)."""
        if count.device.type == "meta":
            # meta tensors hold no values (used by the memory benchmark's accounting): the
            # benchmark always starts from the empty initial state.
            return 0
        return int(count.max().item()) if count.numel() else 0

    def graph_key(self, state: State) -> int:
        """The memory columns a recorded call attends to: :meth:`_columns_in_use` rounded up
        to a power of two (at most ``max_len``), so that one graph serves every state up to
        it (a row's columns before its own count are masked, as in any call)."""
        used = self._columns_in_use(state[4])
        return 0 if used == 0 else min(self.max_len, pow2_at_least(used))

    @contextlib.contextmanager
    def recording(self, key: Hashable) -> Iterator[None]:
        """Record with ``key`` columns: the host cannot read ``count`` during a capture."""
        self._recorded_columns = int(key)  # type: ignore[call-overload]
        try:
            yield
        finally:
            self._recorded_columns = None

    def _columns(self, count: Tensor) -> int:
        """:meth:`_columns_in_use`, or while a graph records, the columns it records with."""
        if not capturing(count):
            return self._columns_in_use(count)
        if self._recorded_columns is None:
            raise RuntimeError(
                "MemLSTM reads its memory's width on the host once per call: record it "
                "through cores.graphed.GraphedCore, which keys a graph by it"
            )
        return self._recorded_columns

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, D]`` -> ``y [T, B, H]`` (the macro-states ``s_t``) and the final state.

        Within the call the memory grows by concatenation (only the columns some row uses are
        attended to; in a CUDA graph, their number rounded up to a power of two), so cost is
        quadratic in the number of stored states, not in ``max_len``.
        """
        check_sequence(self, x, state, starts)
        h, c, s, memory, count = state
        B, L = x.shape[1], self.max_len
        reset_steps = steps_with_starts(starts)
        used = self._columns(count)
        values = memory[:, L - used :]  # [B, used, H]
        keys = self.key(values)  # U_a m once per stored state
        # column j of `values` is valid for row b iff j >= first[b] (episode start)
        first = (used - count).to(torch.long)  # [B]
        xp = self.input_proj(x)
        outputs = []
        for t, xp_t in enumerate(xp.unbind(0)):
            if t in reset_steps:
                mask = starts[t].to(h.device)
                c, s = reset_where((c, s), mask)
                first = torch.where(mask, values.shape[1], first)
            h, c = self._lstm(xp_t, s, c)
            values = torch.cat([values, h.unsqueeze(1)], dim=1)
            keys = torch.cat([keys, self.key(h).unsqueeze(1)], dim=1)
            if values.shape[1] > L:  # more states than max_len: forget the oldest column
                if self.on_full == "error" and bool((first <= 0).any()):
                    raise RuntimeError(
                        f"MemLSTM memory is full (max_len={L}); raise max_len or use on_full='drop'"
                    )
                values, keys, first = values[:, 1:], keys[:, 1:], (first - 1).clamp(min=0)
            valid = torch.arange(values.shape[1], device=h.device) >= first.unsqueeze(1)
            alpha = self._attend(s, keys, values, valid)
            s = self._combine(h, torch.bmm(alpha.unsqueeze(1), values).squeeze(1))
            outputs.append(s)
        n = values.shape[1]
        valid = torch.arange(n, device=h.device) >= first.unsqueeze(1)  # [B, n]
        values = values * valid.unsqueeze(2).to(values.dtype)  # stale columns -> 0 (canonical)
        memory = torch.cat([values.new_zeros(B, L - n, self.hidden_size), values], dim=1)
        count = (n - first).to(count.dtype)
        return torch.stack(outputs, 0), (h, c, s, memory, count)

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, max_len={self.max_len}, "
            f"on_full={self.on_full!r}, average={self.average}"
        )
