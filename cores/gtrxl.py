"""Transformer memories: TrXL-I and GTrXL, a stack of attention blocks over a sliding memory.

Parisotto et al., "Stabilizing Transformers for Reinforcement Learning" (ICML 2020,
arXiv:1910.06764), on the relative-position attention of Dai et al., "Transformer-XL:
Attentive Language Models Beyond a Fixed-Length Context" (ACL 2019, arXiv:1901.02860).

Layer ``l`` (``E`` is the layer's input, ``d = hidden_size``; ``E^0 = W_in x``)::

    Ybar = RelMHA(LayerNorm([M, E]))           queries: the chunk; keys/values: memory + chunk
    Y    = E + ReLU(Ybar)                      trxl (identity map reordering, "TrXL-I")
    Y    = g_mha(E, ReLU(Ybar))                gtrxl: the GRU-type gate replaces the residual
    Ebar = W_2 ReLU(W_1 LayerNorm(Y) + b_1) + b_2
    E'   = Y + ReLU(Ebar)   |   g_mlp(Y, ReLU(Ebar))

GRU-type gate (Parisotto et al. eq. for ``g(x, y)``), ``x`` the stream, ``y`` the sub-layer::

    r = sigma(W_r y + U_r x)
    z = sigma(W_z y + U_z x - b_g)             b_g = gate_bias (2 in the paper), learned
    h = tanh(W_g y + U_g (r * x))
    g(x, y) = (1 - z) * x + z * h              z ~ sigma(-2) = 0.12 at init: near the identity

Relative attention of query ``i`` to key ``j`` at distance ``k = i - j`` (Dai et al. eq. (3),
per head, ``R_k`` the sinusoid of distance ``k``, ``u``/``v`` learned per head)::

    score(i, j) = [(q_i + u) . k_j + (q_i + v) . (W_R R_k)] / sqrt(head_size)

The first term is what :func:`torch.nn.functional.scaled_dot_product_attention` computes from
``q + u`` and ``k``; the second, gathered per distance, enters as its additive float mask, with
``-inf`` where a key is hidden. So a GPU takes PyTorch's fused attention kernels that accept a
mask, with no kernel of ours.

**Memory and the sliding window.** Each query attends to itself and to the ``memory_len`` layer
inputs before it, no further (distances ``0 .. memory_len``), whether they come from the state
or from earlier steps of the same chunk. This is the window of a per-env sliding memory
(CleanRL's PPO-TrXL), and it makes a chunk of ``T`` steps compute exactly what ``T`` single steps
compute. Transformer-XL's own segments let a later query of a chunk see up to ``memory_len + T``
steps back, so the result would depend on how a sequence is cut into chunks. Queries are
processed in blocks of :data:`QUERY_BLOCK`, each against the ``memory_len + block`` keys it can
see, so time and memory grow linearly in ``T``.

**State.** Per layer, ``memory [B, memory_len, d]`` (the layer's last ``memory_len`` inputs, oldest
first, un-normalised) and ``count [B]`` (how many of its last slots belong to the current
episode, stored as a float in the state's dtype so masked resets and ``.to(dtype)`` treat it
like any state tensor); empty slots hold zeros. The state is the flat tuple
``(memory_0, count_0, memory_1, count_1, ...)``. A reset (``starts``) zeroes a row: its count
becomes 0, so the attention mask hides every earlier step; a reset inside a chunk hides, for
the queries from that step on, every key before it. Gradients flow through the memory inside
a call; trainers detach the state between calls, which is Transformer-XL's ``StopGrad(M)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memcores.cores.base import MemoryCore, State, check_sequence, reset_where

QUERY_BLOCK = 64
"""Queries attended together: each block of ``n`` queries scores ``memory_len + n`` keys, so a
long chunk costs ``T (memory_len + QUERY_BLOCK)`` scores instead of ``T (memory_len + T)``."""


def relative_sinusoid(distances: int, size: int) -> Tensor:
    """Transformer-XL's sinusoidal embedding ``R_k`` of distances ``k = 0 .. distances - 1``.

    :return: ``[distances, size]``: ``[sin(k w), cos(k w)]`` with ``w_m = 10000^(-2m / size)``
        (Vaswani et al.'s frequencies); for an odd ``size`` the last cosine is dropped.
    """
    half = (size + 1) // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 2 * half, 2, dtype=torch.float64) / size))
    angles = torch.arange(distances, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)[:, :size].float()


class GRUGate(nn.Module):
    """The GRU-type gating layer ``g(x, y)`` of GTrXL (module docstring), on ``[..., d]``.

    :param size: ``d``, the size of ``x``, ``y`` and the output.
    :param bias: ``b_g``; the update gate starts at ``sigma(-b_g)`` so the layer starts close to
        ``g(x, y) = x`` (2 in the paper).
    """

    def __init__(self, size: int, bias: float) -> None:
        super().__init__()
        self.size = size
        self.from_y = nn.Linear(size, 3 * size)  # W_r, W_z, W_g; bias: 0, -b_g, 0
        self.from_x = nn.Linear(size, 2 * size, bias=False)  # U_r, U_z
        self.reset_x = nn.Linear(size, size, bias=False)  # U_g, applied to r * x
        with torch.no_grad():
            self.from_y.bias.zero_()
            self.from_y.bias[size : 2 * size].fill_(-float(bias))

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """``x, y [..., d]`` -> ``[..., d]``."""
        wr, wz, wg = self.from_y(y).chunk(3, dim=-1)
        ur, uz = self.from_x(x).chunk(2, dim=-1)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz)
        h = torch.tanh(wg + self.reset_x(r * x))
        return torch.lerp(x, h, z)  # (1 - z) x + z h


class RelativeAttention(nn.Module):
    """Multi-head self-attention with Transformer-XL's relative positions (module docstring).

    :param size: model width ``d``.
    :param heads: number of heads ``h``.
    :param head_size: width of each head (queries, keys and values are ``h * head_size`` wide).
    :param memory_len: the most steps back a query sees (distances ``0 .. memory_len``).
    """

    def __init__(self, size: int, heads: int, head_size: int, memory_len: int) -> None:
        super().__init__()
        self.heads, self.head_size, self.memory_len = heads, head_size, memory_len
        inner = heads * head_size
        self.query = nn.Linear(size, inner, bias=False)
        self.key_value = nn.Linear(size, 2 * inner, bias=False)
        self.position = nn.Linear(size, inner, bias=False)  # W_R
        self.out = nn.Linear(inner, size, bias=False)
        self.content_bias = nn.Parameter(torch.zeros(heads, head_size))  # u
        self.position_bias = nn.Parameter(torch.zeros(heads, head_size))  # v
        self.scale = 1.0 / math.sqrt(head_size)
        # R_k for k = 0 .. memory_len: a function of the sizes only, rebuilt rather than saved
        sinusoid = relative_sinusoid(memory_len + 1, size)
        self.register_buffer("sinusoid", sinusoid, persistent=False)
        self.register_buffer("sinusoid_reversed", sinusoid.flip(0), persistent=False)

    def forward(self, z: Tensor, start: Tensor) -> Tensor:
        """Attend from the last ``T`` rows of ``z`` to the rows each can see.

        :param z: ``[B, M + T, d]`` normalised memory (``M = memory_len`` rows) then chunk.
        :param start: ``[B, T]`` long: for the query of chunk step ``t``, the first row of
            ``z`` in its episode (keys before it are hidden).
        :return: ``[B, T, d]`` the attention output (after the output projection).
        """
        B, M = z.shape[0], self.memory_len
        T = z.shape[1] - M
        h, dh = self.heads, self.head_size
        q = self.query(z[:, M:]).view(B, T, h, dh)
        k, v = self.key_value(z).view(B, M + T, 2, h, dh).unbind(2)
        r = self.position(self.sinusoid).view(M + 1, h, dh)  # W_R R_k, k = 0 .. M
        q_content = (q + self.content_bias).transpose(1, 2)  # [B, h, T, dh]
        q_position = q + self.position_bias  # [B, T, h, dh]
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, h, M + T, dh]
        outputs = []
        for lo in range(0, T, QUERY_BLOCK):
            n = min(QUERY_BLOCK, T - lo)
            # keys lo .. lo + M + n - 1 of z: query ii (chunk step lo + ii, row M + lo + ii of
            # z) is at distance M + ii - jj from key jj of the block
            rows = torch.arange(n, device=z.device)[:, None]
            cols = torch.arange(M + n, device=z.device)[None, :]
            distance = M + rows - cols  # [n, M + n]
            in_window = (distance >= 0) & (distance <= M)
            in_episode = (cols + lo)[None] >= start[:, lo : lo + n, None]  # [B, n, M + n]
            visible = (in_window & in_episode).unsqueeze(1)  # [B, 1, n, M + n]
            by_distance = torch.einsum("bnhd,khd->bhnk", q_position[:, lo : lo + n], r)
            index = distance.clamp(0, M).expand(B, h, n, M + n)
            position_term = by_distance.gather(-1, index) * self.scale  # [B, h, n, M + n]
            mask = position_term.masked_fill(~visible, -math.inf)
            outputs.append(
                F.scaled_dot_product_attention(
                    q_content[:, :, lo : lo + n],
                    k[:, :, lo : lo + M + n],
                    v[:, :, lo : lo + M + n],
                    attn_mask=mask,
                    scale=self.scale,
                )
            )
        attended = torch.cat(outputs, dim=2) if len(outputs) > 1 else outputs[0]
        return self.out(attended.transpose(1, 2).reshape(B, T, h * dh))

    def step(self, z: Tensor, visible: Tensor) -> Tensor:
        """The last row of ``z`` attends to all ``M + 1`` rows (one acting step).

        :param z: ``[B, M + 1, d]`` normalised memory then the current input.
        :param visible: ``[B, M + 1]`` bool, false on empty memory slots.
        :return: ``[B, d]``, what :meth:`forward` returns for ``T = 1``.
        """
        B, M, h, dh = z.shape[0], self.memory_len, self.heads, self.head_size
        k, v = self.key_value(z).view(B, M + 1, 2, h, dh).transpose(1, 3).unbind(2)
        q = self.query(z[:, -1]).view(B, h, dh)
        # key j of the window is at distance M - j: the sinusoids in reverse order
        r = self.position(self.sinusoid_reversed).view(M + 1, h, dh)
        q_position = (q + self.position_bias).transpose(0, 1)  # [h, B, dh]
        position_term = torch.bmm(q_position, r.permute(1, 2, 0)).transpose(0, 1)  # [B, h, M+1]
        mask = (position_term * self.scale).masked_fill(~visible[:, None], -math.inf)
        attended = F.scaled_dot_product_attention(
            (q + self.content_bias).unsqueeze(2),
            k,
            v,
            attn_mask=mask.unsqueeze(2),
            scale=self.scale,
        )  # [B, h, 1, dh]
        return self.out(attended.view(B, h * dh))


class TransformerBlock(nn.Module):
    """One pre-layer-norm block: relative attention then a position-wise MLP, each joined to
    the stream by a GRU-type gate (``gated``) or a residual sum, after a ReLU."""

    def __init__(
        self,
        size: int,
        heads: int,
        head_size: int,
        memory_len: int,
        ff_size: int,
        gate_bias: float | None,
    ) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(size)
        self.attention = RelativeAttention(size, heads, head_size, memory_len)
        self.mlp_norm = nn.LayerNorm(size)
        self.mlp = nn.Sequential(nn.Linear(size, ff_size), nn.ReLU(), nn.Linear(ff_size, size))
        gated = gate_bias is not None
        self.attention_gate = GRUGate(size, gate_bias) if gated else None
        self.mlp_gate = GRUGate(size, gate_bias) if gated else None

    def _join(self, gate: GRUGate | None, x: Tensor, y: Tensor) -> Tensor:
        y = torch.relu(y)
        return x + y if gate is None else gate(x, y)

    def forward(self, memory: Tensor, e: Tensor, start: Tensor) -> Tensor:
        """``memory [B, M, d]`` and this layer's chunk input ``e [B, T, d]`` -> ``[B, T, d]``;
        ``start`` as in :meth:`RelativeAttention.forward`."""
        z = self.attention_norm(torch.cat([memory, e], dim=1))
        y = self._join(self.attention_gate, e, self.attention(z, start))
        return self._join(self.mlp_gate, y, self.mlp(self.mlp_norm(y)))

    def step(self, window: Tensor, visible: Tensor) -> Tensor:
        """One step: ``window [B, M + 1, d]`` (memory then the input ``e``) -> ``[B, d]``."""
        e = window[:, -1]
        attended = self.attention.step(self.attention_norm(window), visible)
        y = self._join(self.attention_gate, e, attended)
        return self._join(self.mlp_gate, y, self.mlp(self.mlp_norm(y)))


class TransformerXL(MemoryCore):
    """A TrXL-I (``gated=False``) or GTrXL (``gated=True``) memory core (module docstring).

    :param input_size: size ``D`` of each input vector (embedded by one linear layer).
    :param hidden_size: model width ``d`` and output size.
    :param gated: GRU-type gates instead of residual sums (fixed by the ``gtrxl``/``trxl``
        names).
    :param layers: number of blocks.
    :param heads: attention heads.
    :param memory_len: steps each layer remembers; a query sees itself and ``memory_len``
        steps back.
    :param head_size: width of each head; default ``ceil(hidden_size / heads)``.
    :param ff_size: hidden width of each block's MLP; default ``4 * hidden_size``.
    :param gate_bias: ``b_g`` of the gates (gtrxl only; ``trxl`` fixes it to ``None``).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        gated: bool = True,
        layers: int = 1,
        heads: int = 4,
        memory_len: int = 64,
        head_size: int | None = None,
        ff_size: int | None = None,
        gate_bias: float | None = 2.0,
    ) -> None:
        super().__init__(input_size, hidden_size)
        head_size = (
            -(-hidden_size // heads) if head_size is None and _positive(heads) else head_size
        )
        ff_size = 4 * hidden_size if ff_size is None else ff_size
        for name, value in (
            ("layers", layers),
            ("heads", heads),
            ("memory_len", memory_len),
            ("head_size", head_size),
            ("ff_size", ff_size),
        ):
            if not _positive(value):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if gated and not isinstance(gate_bias, int | float):
            raise ValueError(f"gate_bias must be a number for a gated core, got {gate_bias!r}")
        if not gated and gate_bias is not None:
            raise ValueError(f"gate_bias applies only to gtrxl (gated), got {gate_bias!r}")
        self.gated, self.layers, self.heads = bool(gated), int(layers), int(heads)
        self.memory_len, self.head_size, self.ff_size = int(memory_len), int(head_size), ff_size
        self.gate_bias = float(gate_bias) if gated else None
        self.embed = nn.Linear(input_size, hidden_size)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                hidden_size, self.heads, self.head_size, self.memory_len, ff_size, self.gate_bias
            )
            for _ in range(self.layers)
        )
        # slot indices of a step's window [memory, e]: slot j is filled iff j >= M - count
        self.register_buffer("_slots", torch.arange(self.memory_len + 1.0), persistent=False)

    @property
    def state_arity(self) -> int:  # type: ignore[override]
        """A memory and a count per layer."""
        return 2 * self.layers

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """Empty memories: per layer zeros ``[B, memory_len, d]`` and a zero count ``[B]``."""
        like = self.embed.weight
        kw = dict(dtype=like.dtype, device=like.device if device is None else device)
        state: list[Tensor] = []
        for _ in range(self.layers):
            state += [
                torch.zeros(batch_size, self.memory_len, self.hidden_size, **kw),
                torch.zeros(batch_size, **kw),
            ]
        return tuple(state)

    def reset_state(self, state: State, mask: Tensor) -> State:
        """The initial state is all zeros: reset by :func:`cores.base.reset_where`."""
        return reset_where(state, mask)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One step: ``x_t [B, D]`` -> ``y_t [B, d]`` and the new state.

        What :meth:`forward` computes for ``T = 1`` in fewer operations (acting is launch-
        and dispatch-bound): the window is the whole ``[memory, e]``, key ``j`` is at distance
        ``M - j``, and a state whose empty slots hold zeros (every state this core returns)
        keeps them zero by shifting.
        """
        M = self.memory_len
        e = self.embed(x_t)  # [B, d]
        new_state: list[Tensor] = []
        for i, block in enumerate(self.blocks):
            memory, count = state[2 * i], state[2 * i + 1]
            window = torch.cat([memory, e.unsqueeze(1)], dim=1)  # [B, M + 1, d]
            visible = self._slots.to(count.device) >= (M - count).unsqueeze(1)  # [B, M + 1]
            new_state += [window[:, 1:], (count + 1).clamp(max=M)]
            e = block.step(window, visible)
        return e, tuple(new_state)

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, D]`` -> ``y [T, B, d]`` (the last block's output) and the new state."""
        check_sequence(self, x, state, starts)
        return self._run(x, state, starts)

    def _run(self, x: Tensor, state: State, starts: Tensor | None) -> tuple[Tensor, State]:
        T, B = x.shape[0], x.shape[1]
        M = self.memory_len
        steps = torch.arange(T, device=x.device)
        # the last episode start at or before each step, -1 where none is in this chunk; no
        # value is read on the host, so acting never waits for a device
        if starts is None:
            last = steps.new_full((T, B), -1)
        else:
            last = torch.where(starts.to(x.device), steps[:, None], -1).cummax(0).values
        last = last.t()  # [B, T]
        e = self.embed(x).transpose(0, 1)  # [B, T, d]
        slots = torch.arange(M, device=x.device)
        new_state: list[Tensor] = []
        for i, block in enumerate(self.blocks):
            memory, count = state[2 * i], state[2 * i + 1]
            # first row of [memory, chunk] in each query's episode
            start = torch.where(last >= 0, M + last, (M - count.long())[:, None])  # [B, T]
            # the next memory: the last M rows of [memory, chunk], rows before the episode
            # of the last step zeroed (as a fresh state holds them)
            kept = torch.cat([memory, e], dim=1)[:, T:]  # [B, M, d]
            valid = (slots + T)[None, :] >= start[:, -1:]  # [B, M]
            new_state += [
                kept * valid.unsqueeze(-1).to(kept.dtype),
                (M + T - start[:, -1]).clamp(max=M).to(count.dtype),
            ]
            e = block(memory, e, start)
        return e.transpose(0, 1), tuple(new_state)


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
