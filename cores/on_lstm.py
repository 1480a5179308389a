"""Ordered and master gates: ON-LSTM and the gate ablations of the UR-gates paper.

Y. Shen, S. Tan, A. Sordoni and A. Courville, "Ordered Neurons: Integrating Tree Structures
into Recurrent Neural Networks", ICLR 2019, arXiv:1810.09536 (ON-LSTM); A. Gu, C. Gulcehre,
T. Paine, M. Hoffman and R. Pascanu, "Improving the Gating Mechanism of Recurrent Neural
Networks", ICML 2020, arXiv:1910.09890, App. B.4-B.5 (eqs. 19-37), which splits ON-LSTM's gates
into two axes and names each combination by them:

- ``main``: how the main (coarse) forget/input gates are made: ``cumax`` (ordered,
  ``cumax = cumsum o softmax``) or ``uniform`` (sigmoid with uniform gate initialisation, UGI).
- ``aux``: the auxiliary gate: ``none``, ``master`` (ON-LSTM's fine gates under master gates)
  or ``refine`` (Gu et al.'s refine gate, input tied to ``1 - g``).

Registered presets: ``o_lstm`` (cumax, none), ``om_lstm`` (cumax, master: ON-LSTM),
``um_lstm`` (uniform, master), ``or_lstm`` (cumax, refine). (``uniform, none`` and ``uniform,
refine`` are ``u_lstm`` and ``ur_lstm``; the tests check that this class reproduces them.)

Equations (``L_*(x, h) = W_* x_t + U_* h_{t-1} + b_*``; ``o = sigma(L_o)``, ``u =
tanh(L_u)``, ``c_t = f_hat c_{t-1} + i_hat u``, ``h_t = o tanh(c_t)`` throughout)::

    none    f_hat = cumax(L_f),  i_hat = 1 - cumax(L_i)                       (eqs. 28-29)
            [uniform: f_hat = sigma(L_f), i_hat = sigma(L_i), b_i = -b_f ~ -sigma^-1(U)]
    master  f~ = cumax(L_f~),  i~ = 1 - cumax(L_i~)                           (eqs. 19-20)
            [uniform: f~ = sigma(L_f~ + b), i~ = sigma(L_i~ - b), b = sigma^-1(U)] (30-33)
            f = sigma(L_f),  i = sigma(L_i)                    fine gates
            w = f~ i~,  f_hat = f w + (f~ - w),  i_hat = i w + (i~ - w)      (eqs. 21-23)
    refine  f~ = cumax(L_f~),  r = sigma(L_r)                                 (eqs. 34-35)
            f_hat = r (1 - (1 - f~)^2) + (1 - r) f~^2,  i_hat = 1 - f_hat     (eqs. 36-37)

Master gates are computed per chunk of ``chunk_size`` units (ON-LSTM's "downsize", ``C = 16``
on Gu et al.'s synthetic and image tasks) and shared by the units of the chunk: ``L_f~`` and
``L_i~`` have ``n = ceil(H / C)`` rows each, an extra ``1/(2C)`` of the LSTM's parameters. When
``C`` does not divide ``H`` the last chunk is smaller. ``cumax`` runs over the ``n`` chunks for
master gates and over all ``H`` units otherwise. Its last entry is exactly 1, so with ordered
gates the last chunk (or unit) keeps ``f_hat = 1``, ``i_hat = 0`` and never leaves its initial
zero, as in Shen et al.'s definition; with a single chunk the whole cell would be constant, so
cumax master gates use ``C = min(chunk_size, ceil(H / 2))`` (at least two chunks).

``tied_master=True`` (master gates only) is the rescaled, tied form of Gu et al.'s Proposition
4 (eqs. 24-27): ``i~ = 1 - f~``, ``i = 1 - f`` and ``f_hat = 2 f w + (f~ - w)``, ``i_hat =
2 i w + (i~ - w)``, which equals a refine gate with ``f~`` as the forget gate and ``f`` as the
refine gate.

Initialisation choices (the papers leave them open): weights ``U(-1/sqrt(H), 1/sqrt(H))``;
biases 0 except the UGI ones. Zero biases give cumax gates their ordered start (``j / n`` for
entry ``j``), leave OR-'s refine gate at ``r = 1/2`` (so ``f_hat = f~`` at the start: eqs.
34-35 give no value for ``b_f``, ``b_r``), and start the fine gates of master variants at
``f = i = 1/2``, so ``E[f + i] = 1`` as Gu et al.'s Propositions 3-4 assume (Shen et al.'s
code also adds no forget-bias offset). UGI samples one ``u ~ U[1/n, 1 - 1/n]`` per gate unit;
``b_i = -b_f`` for a separate input gate and ``b_r = -b_f`` for the refine gate, as
``u_lstm`` and ``ur_lstm`` do.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memcores.cores import gates
from memcores.cores.base import MemoryCore, State, check_sequence, reset_uniform_

MAINS = ("cumax", "uniform")
AUXES = ("none", "master", "refine")


class OrderedLSTM(MemoryCore):
    """LSTM whose forget/input gates are ordered (cumax) or UGI, with master or refine gates.

    :param input_size: size ``D`` of each input vector.
    :param hidden_size: size ``H`` of ``h`` and ``c``.
    :param main: the main gates' activation: ``cumax | uniform`` (sigmoid with UGI).
    :param aux: the auxiliary gate: ``none | master | refine``.
    :param chunk_size: units sharing one master-gate value (``aux="master"`` only).
    :param tied_master: tie master and fine gates and rescale them (Proposition 4's form;
        ``aux="master"`` only).

    State: ``(h [B, H], c [B, H])``, zero initially. Parameters: ``weight_ih [R, D]``,
    ``weight_hh [R, H]``, ``bias [R]`` stacking the gate blocks; :meth:`rows` gives a block's
    rows.
    """

    graph_safe = True  # no host reads inside forward: CUDA-graph capturable (cores.graphed)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        main: str = "cumax",
        aux: str = "master",
        chunk_size: int = 16,
        tied_master: bool = False,
    ) -> None:
        super().__init__(input_size, hidden_size)
        if main not in MAINS:
            raise ValueError(f"unknown main gate {main!r}; valid: {', '.join(MAINS)}")
        if aux not in AUXES:
            raise ValueError(f"unknown auxiliary gate {aux!r}; valid: {', '.join(AUXES)}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        if tied_master and aux != "master":
            raise ValueError("tied_master=True needs aux='master'")
        self.main = main
        self.aux = aux
        self.tied_master = bool(tied_master)
        H = hidden_size
        if aux == "master" and main == "cumax" and H > 1:
            # one chunk has constant cumax master gates (f~ = 1, i~ = 0): the cell never changes
            chunk_size = min(chunk_size, math.ceil(H / 2))
        self.chunk_size = int(chunk_size)
        self.n_chunks = math.ceil(H / self.chunk_size) if aux == "master" else H
        if aux == "master":
            n = self.n_chunks
            blocks = [("mf", n)] + ([] if self.tied_master else [("mi", n)])
            blocks += [("f", H)] + ([] if self.tied_master else [("i", H)])
        elif aux == "refine":
            blocks = [("f", H), ("r", H)]
        else:
            blocks = [("f", H), ("i", H)]
        blocks += [("o", H), ("u", H)]
        self._rows: dict[str, slice] = {}
        start = 0
        for name, size in blocks:
            self._rows[name] = slice(start, start + size)
            start += size
        self.weight_ih = nn.Parameter(torch.empty(start, input_size))
        self.weight_hh = nn.Parameter(torch.empty(start, H))
        self.bias = nn.Parameter(torch.zeros(start))
        self.reset_parameters()

    # ------------------------------------------------------------------ parameters
    def rows(self, name: str) -> slice:
        """Rows of gate block ``name`` in the stacked parameters (``mf``/``mi``: master gates)."""
        if name not in self._rows:
            raise ValueError(f"no gate block {name!r}; blocks: {', '.join(self._rows)}")
        return self._rows[name]

    def reset_parameters(self) -> None:
        """Weights ``U(-1/sqrt(H), 1/sqrt(H))``; biases 0 except UGI's (module docstring)."""
        reset_uniform_(self.weight_ih, self.weight_hh, self.bias)
        if self.main != "uniform":
            return
        with torch.no_grad():
            forget = "mf" if self.aux == "master" else "f"
            partner = {"master": "mi", "refine": "r", "none": "i"}[self.aux]
            rows = self.rows(forget)
            b = gates.uniform_bias("sigmoid", rows.stop - rows.start).to(self.bias.dtype)
            self.bias[rows] = b
            if partner in self._rows:
                self.bias[self.rows(partner)] = -b

    # ------------------------------------------------------------------ cell
    def _main(self, a: Tensor, name: str) -> Tensor:
        """The main (or master) forget-role gate of block ``name``: cumax or sigmoid."""
        z = a[:, self.rows(name)]
        return gates.cumax(z) if self.main == "cumax" else torch.sigmoid(z)

    def _main_complement(self, a: Tensor, name: str) -> Tensor:
        """The main input-role gate: ``1 - cumax`` (ordered) or a sigmoid (UGI)."""
        z = a[:, self.rows(name)]
        return 1.0 - gates.cumax(z) if self.main == "cumax" else torch.sigmoid(z)

    def _expand(self, g: Tensor) -> Tensor:
        """Master gates ``[B, n]`` -> ``[B, H]``: each chunk's value repeated over its units."""
        if self.chunk_size == 1:
            return g
        return g.repeat_interleave(self.chunk_size, dim=-1)[:, : self.hidden_size]

    def effective_gates(self, a: Tensor) -> tuple[Tensor, Tensor]:
        """Effective forget and input gates ``(f_hat, i_hat)``, each ``[B, H]``, from the
        pre-activations ``a [B, R]`` of one step."""
        if self.aux == "none":
            return self._main(a, "f"), self._main_complement(a, "i")
        if self.aux == "refine":
            g = gates.refine(self._main(a, "f"), torch.sigmoid(a[:, self.rows("r")]))
            return g, 1.0 - g
        f_master = self._main(a, "mf")
        f = torch.sigmoid(a[:, self.rows("f")])
        if self.tied_master:
            i_master, i, scale = 1.0 - f_master, 1.0 - f, 2.0
        else:
            i_master, i, scale = (
                self._main_complement(a, "mi"),
                torch.sigmoid(a[:, self.rows("i")]),
                1.0,
            )
        return gates.master_gates(self._expand(f_master), self._expand(i_master), f, i, scale)

    def cell(self, a: Tensor, c_prev: Tensor) -> tuple[Tensor, Tensor]:
        """Gate arithmetic of one step: ``a [B, R]``, ``c_prev [B, H]`` -> ``h``, ``c``."""
        f_hat, i_hat = self.effective_gates(a)
        o = torch.sigmoid(a[:, self.rows("o")])
        c = f_hat * c_prev + i_hat * torch.tanh(a[:, self.rows("u")])
        return o * torch.tanh(c), c

    # ------------------------------------------------------------------ contract
    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        return self.zero_state(batch_size, device, self.weight_hh, count=2)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """``x_t [B, D]`` -> ``h [B, H]`` and ``(h, c)``."""
        h, c = state
        a = F.linear(x_t, self.weight_ih, self.bias) + F.linear(h, self.weight_hh)
        h, c = self.cell(a, c)
        return h, (h, c)

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, D]`` -> ``y [T, B, H]`` and the final ``(h, c)``; see :class:`MemoryCore`."""
        check_sequence(self, x, state, starts)
        xproj = F.linear(x, self.weight_ih, self.bias)  # [T, B, R], one matmul for all steps
        w_hh_t = self.weight_hh.t()

        def step(a_x: Tensor, s: State) -> tuple[Tensor, State]:
            h, c = self.cell(torch.addmm(a_x, s[0], w_hh_t), s[1])
            return h, (h, c)

        return self.scan_zero_reset(xproj, state, starts, step)

    def extra_repr(self) -> str:
        master = (
            f", chunk_size={self.chunk_size}, tied_master={self.tied_master}"
            if self.aux == "master"
            else ""
        )
        return f"{self.input_size}, {self.hidden_size}, main={self.main}, aux={self.aux}{master}"
