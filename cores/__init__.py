"""Memory cores: recurrent torch modules sharing the :class:`~cores.base.MemoryCore` contract.

Build any core by name::

    from memcores.cores import make_core, CORES
    core = make_core("ur_lstm", input_size=10, hidden_size=128)

A new core is one module plus one line in :data:`CORES`.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any

from memcores.cores.base import MemoryCore, State

__all__ = ["CORES", "CoreSpec", "MemoryCore", "State", "core_options", "make_core", "presets_of"]


@dataclass(frozen=True)
class CoreSpec:
    """A registry entry: where the class lives, a one-line description and its fixed options.

    :param target: ``"module:ClassName"``; imported only when the core is built.
    :param description: one line shown by ``memcores list cores``.
    :param preset: options fixed by this name (e.g. the gate activation of ``fast_lstm``).
    """

    target: str
    description: str
    preset: dict[str, Any] = field(default_factory=dict)

    def load(self) -> type[MemoryCore]:
        module_name, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module_name), attr)


_GATED = "memcores.cores.gated:GatedLSTM"
_GRU = "memcores.cores.gru:GatedGRU"


def _preset(**options: Any) -> dict[str, Any]:
    """Options fixed by a gated preset. Options that matter only for some presets (chrono's
    ``t_max``, h-detach's ``p``) are fixed in the others, so passing them there is an error
    instead of being silently ignored.
    """
    if options.get("init") != "chrono":
        options.setdefault("t_max", 1000.0)
    if "tied" in options and not options.get("hdetach"):  # an LSTM preset without h-detach
        options.update(hdetach=False, p=0.0)
    return options


CORES: dict[str, CoreSpec] = {
    # --- gated LSTM family: one cell class, presets differ only in options ------------------
    "lstm": CoreSpec(
        _GATED,
        "LSTM, untied gates, sigmoid, forget bias 1 (the standard baseline)",
        _preset(activation="sigmoid", tied=False, refine=False, init="constant"),
    ),
    "tied_lstm": CoreSpec(
        _GATED,
        "gate-tied LSTM (i = 1 - f), sigmoid forget gate: the sigmoid twin of fast/softsign",
        _preset(activation="sigmoid", tied=True, refine=False, init="constant"),
    ),
    "fast_lstm": CoreSpec(
        _GATED,
        "gate-tied LSTM with the fast gate sigma(sinh z) on the forget gate (Ohno et al.)",
        _preset(activation="fast", tied=True, refine=False, init="constant"),
    ),
    "fast2_lstm": CoreSpec(
        _GATED,
        "gate-tied LSTM with the iterated fast gate sigma(sinh(sinh z))",
        _preset(activation="fast2", tied=True, refine=False, init="constant"),
    ),
    "softsign_lstm": CoreSpec(
        _GATED,
        "gate-tied LSTM with the normalised softsign forget gate (slow-saturation reference)",
        _preset(activation="softsign", tied=True, refine=False, init="constant"),
    ),
    "uf_lstm": CoreSpec(
        _GATED,
        "gate-tied fast-gate LSTM with uniform (UGI) forget-bias initialisation",
        _preset(activation="fast", tied=True, refine=False, init="uniform"),
    ),
    "ur_lstm": CoreSpec(
        _GATED,
        "UR-LSTM: uniform gate init + refine gate, input tied to 1 - g (Gu et al.)",
        _preset(activation="sigmoid", tied=True, refine=True, init="uniform"),
    ),
    "u_lstm": CoreSpec(
        _GATED,
        "U-LSTM: uniform gate init (b_i = -b_f), no refine gate",
        _preset(activation="sigmoid", tied=False, refine=False, init="uniform"),
    ),
    "r_lstm": CoreSpec(
        _GATED,
        "R-LSTM: refine gate with standard forget bias 1, input tied to 1 - g",
        _preset(activation="sigmoid", tied=True, refine=True, init="constant"),
    ),
    "c_lstm": CoreSpec(
        _GATED,
        "chrono LSTM: b_f ~ log U[1, T_max - 1], b_i = -b_f (option t_max)",
        _preset(activation="sigmoid", tied=False, refine=False, init="chrono"),
    ),
    "hdetach_lstm": CoreSpec(
        _GATED,
        "LSTM trained with h-detach: stochastically stops gradients through h_{t-1} (option p)",
        _preset(activation="sigmoid", tied=False, refine=False, init="constant", hdetach=True),
    ),
    "o_lstm": CoreSpec(
        "memcores.cores.on_lstm:OrderedLSTM",
        "O-LSTM: cumax (ordered) forget/input gates, no auxiliary gate (Gu et al. eqs. 28-29)",
        dict(main="cumax", aux="none", chunk_size=1, tied_master=False),
    ),
    "om_lstm": CoreSpec(
        "memcores.cores.on_lstm:OrderedLSTM",
        "ON-LSTM: cumax master gates over chunks of chunk_size units + fine gates (Shen et al.)",
        dict(main="cumax", aux="master"),
    ),
    "um_lstm": CoreSpec(
        "memcores.cores.on_lstm:OrderedLSTM",
        "UM-LSTM: ON-LSTM with UGI sigmoid master gates instead of cumax (Gu et al. eqs. 30-33)",
        dict(main="uniform", aux="master"),
    ),
    "or_lstm": CoreSpec(
        "memcores.cores.on_lstm:OrderedLSTM",
        "OR-LSTM: cumax forget gate + refine gate, i = 1 - g (Gu et al. eqs. 34-37)",
        dict(main="cumax", aux="refine", chunk_size=1, tied_master=False),
    ),
    "janet": CoreSpec(
        "memcores.cores.janet:JANET",
        "JANET: forget-gate-only LSTM, h = c, chrono init (options t_max, beta)",
    ),
    "nru": CoreSpec(
        "memcores.cores.nru:NRU",
        "NRU: ReLU state + additive memory written/erased by k heads (options memory_size, heads)",
    ),
    "power_lstm": CoreSpec(
        _GATED,
        "tied_lstm with power-law cell decay c - (1-g)(c^3 - u) (Ohno & Kumagai r=2; any r: "
        "tied_lstm power=r)",
        _preset(activation="sigmoid", tied=True, refine=False, init="constant", power=2.0),
    ),
    # --- GRU family --------------------------------------------------------------------------
    "gru": CoreSpec(
        _GRU,
        "GRU (torch.nn.GRU equations), update-gate bias 1",
        _preset(activation="sigmoid", refine=False, init="constant"),
    ),
    "fast_gru": CoreSpec(
        _GRU,
        "GRU whose update gate uses the fast gate sigma(sinh z)",
        _preset(activation="fast", refine=False, init="constant"),
    ),
    "ur_gru": CoreSpec(
        _GRU,
        "GRU with uniform init + refine gate on the update gate",
        _preset(activation="sigmoid", refine=True, init="uniform"),
    ),
    "power_gru": CoreSpec(
        _GRU,
        "GRU with power-law decay h - (1-z)(h^3 - n) (Ohno & Kumagai, r=2; any r: gru power=r)",
        _preset(activation="sigmoid", refine=False, init="constant", power=2.0),
    ),
    # --- leaky / power-law RNNs (Ohno & Kumagai) ---------------------------------------------
    "leaky_rnn": CoreSpec(
        "memcores.cores.power_rnn:PowerRNN",
        "leaky RNN h += alpha (tanh(Uh + Wx + b) - h): exponential memory decay",
        dict(r=0.0),
    ),
    "power_rnn": CoreSpec(
        "memcores.cores.power_rnn:PowerRNN",
        "power-law RNN h += alpha (tanh(Uh + Wx + b) - |h|^r h): polynomial decay (option r)",
    ),
    # --- self-attentive recurrent cores (Kanuparthi et al.) ----------------------------------
    "rel_lstm": CoreSpec(
        "memcores.cores.rel_lstm:RelLSTM",
        "RelLSTM: LSTM attending over a short buffer + relevancy-screened set (options nu, rho)",
    ),
    "rel_rnn": CoreSpec(
        "memcores.cores.rel_lstm:RelRNN",
        "RelRNN: vanilla RNN (tanh|modrelu) with RelLSTM's buffer + relevancy-screened set",
    ),
    "mem_lstm": CoreSpec(
        "memcores.cores.rel_lstm:MemLSTM",
        "MemLSTM: LSTM attending over all past states (quadratic; option max_len)",
    ),
    # --- linear recurrent units with online learning (Zucchet et al.) ------------------------
    "lru": CoreSpec(
        "memcores.cores.lru:LRUCore",
        "stack of LRU blocks; grad=bptt|online|spatial|truncated (online: exact in-layer RTRL)",
    ),
    "linear_rnn": CoreSpec(
        "memcores.cores.snap:LinearRNNCore",
        "dense linear RNN in the LRU block; grad=bptt|snap1|truncated|spatial (Zucchet et al.)",
    ),
    "block_gru": CoreSpec(
        "memcores.cores.snap:BlockGRUCore",
        "GRU in the LRU block; grad=bptt|snap1|truncated|spatial (multi-layer SnAp-1)",
    ),
    # --- modern recurrences: minimal RNNs (Feng et al.) and xLSTM (Beck et al.) --------------
    "min_gru": CoreSpec(
        "memcores.cores.min_rnn:MinGRU",
        "minGRU: input-only gates, one linear recurrence solved by a scan (option layers)",
    ),
    "min_lstm": CoreSpec(
        "memcores.cores.min_rnn:MinLSTM",
        "minLSTM: normalised input-only forget/input gates, solved by a scan (option layers)",
    ),
    "slstm": CoreSpec(
        "memcores.cores.xlstm:SLSTM",
        "xLSTM sLSTM: exponential gates + stabiliser, normaliser, head-wise recurrence (heads)",
    ),
    "mlstm": CoreSpec(
        "memcores.cores.xlstm:MLSTM",
        "xLSTM mLSTM: matrix memory, covariance update, chunkwise-parallel training (heads)",
    ),
    # --- transformer memories (Parisotto et al.; Dai et al.) --------------------------------
    "gtrxl": CoreSpec(
        "memcores.cores.gtrxl:TransformerXL",
        "GTrXL: pre-LN relative-position attention over a sliding memory, GRU-type gates",
        dict(gated=True),
    ),
    "trxl": CoreSpec(
        "memcores.cores.gtrxl:TransformerXL",
        "TrXL-I: GTrXL's blocks with residual sums instead of gates (no gate_bias)",
        dict(gated=False, gate_bias=None),
    ),
}


def _signature_options(cls: type) -> dict[str, Any]:
    """Keyword options of ``cls.__init__`` beyond ``input_size``/``hidden_size``, with defaults."""
    params = inspect.signature(cls.__init__).parameters
    return {
        name: (p.default if p.default is not inspect.Parameter.empty else None)
        for name, p in params.items()
        if name not in ("self", "input_size", "hidden_size")
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }


def core_options(name: str) -> dict[str, Any]:
    """The options a user may set for core ``name``, mapped to their defaults."""
    spec = _spec(name)
    return {k: v for k, v in _signature_options(spec.load()).items() if k not in spec.preset}


def presets_of(target: str) -> list[str]:
    """The registered cores built by one class (``module:Class``, e.g. ``cores.gated:GatedLSTM``),
    in registry order."""
    return [name for name, spec in CORES.items() if spec.target == target]


def _spec(name: str) -> CoreSpec:
    if name not in CORES:
        raise ValueError(f"unknown core {name!r}; valid cores: {', '.join(sorted(CORES))}")
    return CORES[name]


def make_core(name: str, input_size: int, hidden_size: int, **options: Any) -> MemoryCore:
    """Build the core registered as ``name``.

    :param name: one of :data:`CORES`.
    :param input_size: size of each input vector ``x[t, b]``.
    :param hidden_size: size of each output vector ``y[t, b]``.
    :param options: core-specific options (see ``memcores list cores --options``).
    :raises ValueError: for an unknown name, an unknown option or an option fixed by the preset.
    """
    spec = _spec(name)
    allowed = core_options(name)
    for key in options:
        if key in spec.preset:
            raise ValueError(
                f"option {key!r} is fixed to {spec.preset[key]!r} by core {name!r}; "
                f"valid options: {', '.join(sorted(allowed)) or '(none)'}"
            )
        if key not in allowed:
            raise ValueError(
                f"unknown option {key!r} for core {name!r}; "
                f"valid options: {', '.join(sorted(allowed)) or '(none)'}"
            )
    return spec.load()(input_size, hidden_size, **spec.preset, **options)
