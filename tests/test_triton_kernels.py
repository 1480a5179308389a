"""The fused Triton kernels of the gated LSTM and GRU families and of sLSTM
(cores/triton_kernels.py, launched by cores/triton_engine.py), and the cuDNN route of the
presets that are nn.LSTM/nn.GRU maths (cores/cudnn.py), against the reference step loops.

Without a GPU the kernels run under Triton's interpreter (``tests/conftest.py`` sets
``TRITON_INTERPRET=1``), so shapes stay tiny; with one they run compiled on CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton", reason="triton is in the dev extra")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from memcores.cores import make_core, presets_of, triton_engine  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# on a GPU every test here runs the compiled kernels: `pytest -m cuda` selects them
pytestmark = [pytest.mark.cuda] if torch.cuda.is_available() else []
T, B, D, H = 6, 3, 3, 12
# every preset of the gated LSTM (the registry's, so a new one is tested too)
PRESETS = presets_of("memcores.cores.gated:GatedLSTM")
GRU_PRESETS = presets_of("memcores.cores.gru:GatedGRU")
OTHER = ["slstm"]
# one preset per compiled specialisation (activation, tied, refine, power)
KERNEL_VARIANTS = ["lstm", "tied_lstm", "fast_lstm", "fast2_lstm", "softsign_lstm", "ur_lstm"]
KERNEL_VARIANTS += ["power_lstm"]
KERNEL_VARIANTS += GRU_PRESETS + OTHER
TOL = {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-5)}
# cuDNN's LSTM sums its float32 products in its own order: on an H200 its weight gradients
# (magnitudes up to ~23 here) differ from the reference loop's by up to 1.4e-5 on elements
# near zero; a wrong gate or reset differs by 1e-2 and more
CUDNN_TOL = {torch.float64: TOL[torch.float64], torch.float32: dict(rtol=1e-4, atol=1e-4)}
# float64 where the kernels allow it: under the interpreter; Triton compiles no float64 dot for
# NVIDIA GPUs, so on CUDA the tight tests run in float32
EXACT = torch.float64 if DEVICE == "cpu" else torch.float32


def _pair(name: str, dtype: torch.dtype, hidden: int = H, **options):
    """The reference loop and the Triton path of one preset, with the same weights."""
    torch.manual_seed(0)
    ref = make_core(name, D, hidden, impl="loop", **options).to(DEVICE, dtype).train()
    tri = make_core(name, D, hidden, impl="triton", **options).to(DEVICE, dtype).train()
    if hasattr(ref, "bias_hn"):  # a GRU: a nonzero b_hn so its gradient path is exercised
        with torch.no_grad():
            ref.bias_hn.uniform_(-0.5, 0.5)
    tri.load_state_dict(ref.state_dict())
    return ref, tri


def _run(core, x, state, starts, seed: int = 5, params=None):
    """Forward+backward of a loss reading every output; returns values and all gradients
    (of ``params``, by default the core's parameters)."""
    params = list(core.parameters() if params is None else params)
    for p in params:
        p.grad = None
    x = x.clone().requires_grad_(True)
    state = tuple(s.clone().requires_grad_(True) for s in state)
    torch.manual_seed(seed)  # the same h-detach draws in both paths
    y, final = core(x, state, starts)
    (y.sin().sum() + sum((s * s.cos()).sum() for s in final)).backward()
    grads = [x.grad, *(s.grad for s in state)]
    grads += [p.grad for p in params]
    return [y, *final], grads


def _assert_all_close(got, expected, **tolerance) -> None:
    """Every value and gradient of two ``_run`` results agree within ``tolerance``."""
    (values, grads), (values_expected, grads_expected) = got, expected
    for a, b in zip(values + grads, values_expected + grads_expected, strict=True):
        torch.testing.assert_close(a, b, **tolerance)


def _assert_paths_match(tri, ref, x, state, starts, **tolerance) -> None:
    """Forward+backward through the reference and the fused path agree (see ``_run``)."""
    expected = _run(ref, x, state, starts)
    _assert_all_close(_run(tri, x, state, starts), expected, **tolerance)


def _inputs(dtype: torch.dtype, steps: int = T, n_state: int = 2):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(steps, B, D, generator=gen, dtype=torch.float64)
    state = tuple(torch.randn(B, H, generator=gen, dtype=torch.float64) for _ in range(n_state))
    starts = torch.zeros(steps, B, dtype=torch.bool)
    starts[2, 1] = True  # a reset inside the sequence
    starts[steps - 2, 0] = True
    starts[0, 2] = True  # and one before the first step
    return (
        x.to(DEVICE, dtype),
        tuple(s.to(DEVICE, dtype) for s in state),
        starts.to(DEVICE),
    )


def _assert_match(name: str, dtype: torch.dtype, starts_on: bool = True, **options) -> None:
    ref, tri = _pair(name, dtype, **options)
    x, _, starts = _inputs(dtype)
    with torch.no_grad():  # a state the core can reach (sLSTM's normaliser stays positive)
        _, state = ref(x.flip(0), ref.initial_state(B))
    starts = starts if starts_on else None
    _assert_paths_match(tri, ref, x, state, starts, **TOL[dtype])


@pytest.mark.parametrize("name", PRESETS + GRU_PRESETS + OTHER)
def test_kernel_matches_the_reference_loop_in_float64_where_possible(name: str) -> None:
    """Outputs, final state and the gradients of inputs, state and every weight, with resets."""
    _assert_match(name, EXACT)


@pytest.mark.parametrize("name", KERNEL_VARIANTS)
def test_kernel_matches_the_reference_loop_in_float32(name: str) -> None:
    _assert_match(name, torch.float32)


@pytest.mark.parametrize("name", ["ur_lstm", "ur_gru"])
def test_kernel_without_starts_and_with_a_batch_over_one_tile(name: str) -> None:
    ref, tri = _pair(name, EXACT)
    gen = torch.Generator().manual_seed(2)
    batch = triton_engine.BLOCK_B + 2  # two programs, the second partly masked
    x = torch.randn(3, batch, D, generator=gen, dtype=torch.float64).to(DEVICE, EXACT)
    state = tuple(
        torch.randn(batch, H, generator=gen).to(DEVICE, EXACT) for _ in range(ref.state_arity)
    )
    _assert_paths_match(tri, ref, x, state, None, **TOL[EXACT])


@pytest.mark.parametrize("name", ["ur_lstm", "ur_gru", "slstm"])
def test_kernel_over_several_unit_chunks(name: str) -> None:
    """H = 40 spans two chunks of 32 units, the second partly masked, in both the gate and
    the recurrent-product loops."""
    hidden = 40
    assert triton_engine.block_meta(hidden)["BLOCK_N"] < hidden
    ref, tri = _pair(name, EXACT, hidden=hidden)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 2, D, generator=gen, dtype=torch.float64).to(DEVICE, EXACT)
    starts = torch.tensor([[False, False], [False, True], [False, False], [True, False]])
    with torch.no_grad():
        _, state = ref(x.flip(0), ref.initial_state(2))
    _assert_paths_match(tri, ref, x, state, starts.to(DEVICE), **TOL[EXACT])


@pytest.mark.parametrize(
    "name, options", [("power_lstm", {}), ("power_gru", {}), ("tied_lstm", {"power": 1.5}),
                      ("gru", {"power": 0.5})]
)  # fmt: skip
def test_power_law_cell_is_clipped_as_the_reference_clips_it(name: str, options) -> None:
    """The power-law cell from a state at the edge of [-1, 1] and large inputs, so the clip
    holds some entries at +-1 (no gradient through those) and resets bring exact zeros into
    the decay: values and gradients match the reference. An ``r`` other than 2 takes the
    kernel's ``|x|^r`` through exp2/log2."""
    ref, tri = _pair(name, EXACT, **options)
    forget = "z" if "z" in ref.gate_names else "f"
    with torch.no_grad():  # a forget gate near 0.2, so the decay's step can pass the bound
        for core in (ref, tri):
            core.bias[core._block(forget)] -= 2.0
    x, state, starts = _inputs(EXACT)
    x = 3.0 * x
    state = (torch.tanh(state[0]), 0.97 * torch.sign(state[-1]))[-ref.state_arity :]
    clipped, s = 0, state
    with torch.no_grad():  # the reference's cells, step by step: some sit on the clip
        for t in range(x.shape[0]):
            _, s = ref(x[t : t + 1], s, starts[t : t + 1])
            clipped += int((s[-1].abs() == 1.0).sum())
    assert clipped > 0
    _assert_paths_match(tri, ref, x, state, starts, **TOL[EXACT])


def test_hdetach_draws_are_the_same_and_change_the_gradient() -> None:
    """With p = 0.5 the kernel stops the gradient into h_{t-1} at exactly the reference's
    steps; the gradient then differs from the undetached one (so the mask is really used)."""
    _assert_match("hdetach_lstm", EXACT, p=0.5)
    _, tri = _pair("hdetach_lstm", EXACT, p=0.5)
    x, state, starts = _inputs(EXACT)
    _, grads_detached = _run(tri, x, state, starts)
    _, grads_plain = _run(tri.eval(), x, state, starts)  # eval: no detaching
    assert not torch.allclose(grads_detached[0], grads_plain[0])


@pytest.mark.parametrize(
    "name", ["ur_lstm", "lstm", "fast2_lstm", "hdetach_lstm", "gru", "ur_gru", "fast_gru", "slstm"]
)
def test_unit_split_kernel_over_several_parts(name: str) -> None:
    """H = 40 over three programs of 16 units (the last partly masked), each reading every
    unit's state and gradient: one step, which needs no barrier, so it runs under the
    interpreter's one-program-at-a-time launches too (longer sequences over several parts:
    :func:`test_split_kernels_meet_at_every_barrier_with_their_programs_side_by_side`)."""
    hidden, batch, steps = 40, 3, 1 if DEVICE == "cpu" else 7
    plan = triton_engine.split_plan(steps, batch, hidden, torch.device(DEVICE))
    assert plan is not None and plan.parts == 3
    ref, tri = _pair(name, EXACT, hidden=hidden, **({"p": 0.5} if "hdetach" in name else {}))
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(steps, batch, D, generator=gen, dtype=torch.float64).to(DEVICE, EXACT)
    starts = torch.zeros(steps, batch, dtype=torch.bool)
    starts[0, 1] = True
    with torch.no_grad():
        _, state = ref(x.flip(0), ref.initial_state(batch, DEVICE))
    _assert_paths_match(tri, ref, x, state, starts.to(DEVICE), **TOL[EXACT])


SIDE_BY_SIDE_CASES = [(name, 40) for name in ("ur_lstm", "fast_gru", "slstm", "hdetach_lstm")]
# nine parts of 16 units at 144, the last half masked
SIDE_BY_SIDE_CASES += [(name, 144) for name in ("ur_lstm", "fast_gru", "slstm")]


def _gpu_cut(steps: int, batch: int, hidden: int, device: torch.device):
    """The cut :func:`~cores.triton_engine.split_plan` makes on an H100 (132 multiprocessors),
    at full float32 products."""
    return triton_engine.resident_cut(batch, hidden, slots=132, precision="ieee")


def _side_by_side_case(name: str, hidden: int, batch: int = 18, steps: int = 5):
    """A reference core and its fused twin at ``hidden`` units in float64, and an input of
    ``steps`` steps and ``batch`` rows with resets (one in the masked tile's last row)."""
    ref, tri = _pair(
        name, torch.float64, hidden=hidden, **({"p": 0.5} if "hdetach" in name else {})
    )
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(steps, batch, D, generator=gen, dtype=torch.float64)
    starts = torch.rand(steps, batch, generator=gen) < 0.15
    starts[2, batch - 1] = True
    with torch.no_grad():
        _, state = ref(x.flip(0), ref.initial_state(batch))
    return ref, tri, x, state, starts


@pytest.mark.skipif(
    DEVICE != "cpu", reason="the interpreter's run; CUDA runs the same cut compiled"
)
@pytest.mark.parametrize(("name", "hidden"), SIDE_BY_SIDE_CASES)
def test_split_kernels_meet_at_every_barrier_with_their_programs_side_by_side(
    name: str, hidden: int, monkeypatch
) -> None:
    """The GPU's cut under the interpreter, every program of a launch in its own thread
    (``tests/side_by_side.py``), each stalling at random before its stores so the parts drift
    apart: ``hidden`` units over parts of 16 (the last partly masked: three at 40, nine at
    144) and 18 rows over two batch tiles (the second partly masked), five steps with resets,
    forward and backward meeting at the barrier after every step. Each must give the reference
    loop's values and gradients in float64; a barrier that let a part read one step early
    fails here (checked by breaking the wait)."""
    from side_by_side import programs_side_by_side

    monkeypatch.setattr(triton_engine, "split_plan", _gpu_cut)
    plan = _gpu_cut(5, 18, hidden, torch.device("cpu"))
    assert (plan.tiles, plan.parts) == (2, -(-hidden // 16))
    ref, tri, x, state, starts = _side_by_side_case(name, hidden)
    expected = _run(ref, x, state, starts)
    with programs_side_by_side():
        got = _run(tri, x, state, starts)
    _assert_all_close(got, expected, **TOL[torch.float64])


@triton.jit
def _flag_of(flag_ptr):
    """A device function (each call patches Triton's language again under the interpreter):
    the flag at ``flag_ptr``."""
    return tl.atomic_max(flag_ptr, 0)


@triton.jit
def _wait_for_flag(flag_ptr, SETS: tl.constexpr):
    """Program 0 waits for the flag that program 1 sets where ``SETS``."""
    if tl.program_id(0) == 0:
        while _flag_of(flag_ptr) == 0:
            pass
    elif SETS:
        tl.atomic_max(flag_ptr, 1)


@pytest.mark.skipif(DEVICE != "cpu", reason="a check of the interpreter's helper")
def test_side_by_side_names_a_launch_whose_programs_never_meet_and_ends_them(monkeypatch):
    """Program 0 waits for a flag program 1 never sets: the helper gives up after its limit,
    names the program still waiting, and that program's thread ends (spinning through a device
    function, which patches Triton's language again at each call, it would otherwise spin for
    the rest of the test run); with the flag set by program 1 the same launch returns."""
    import threading

    import side_by_side

    monkeypatch.setattr(side_by_side, "WAIT_LIMIT_S", 2.0)
    threads_before = threading.active_count()
    flag = torch.zeros(1, dtype=torch.int32)
    with side_by_side.programs_side_by_side():
        _wait_for_flag[(2,)](flag, SETS=True)
        assert flag.item() == 1
        flag.zero_()
        with pytest.raises(TimeoutError, match=r"programs \[\(0, 0, 0\)\] of _wait_for_flag"):
            _wait_for_flag[(2,)](flag, SETS=False)
    assert threading.active_count() == threads_before


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's run of a part that never starts")
@pytest.mark.parametrize("name", ["ur_lstm", "fast_gru", "slstm"])
def test_a_part_that_never_starts_ends_the_launch_with_an_error_within_the_bound(
    name: str, monkeypatch
) -> None:
    """A GPU whose multiprocessors are held by other work may never start some part of a
    split launch: here part 1 of batch tile 0 never runs (``tests/side_by_side.py``). The
    parts waiting for it give up after ``SPIN_LIMIT`` rounds, and the launch ends with a
    RuntimeError naming the kernel, the core and the shape, well before the harness's own
    limit would call it hung; every later wait of those parts is skipped."""
    import side_by_side

    monkeypatch.setattr(triton_engine, "split_plan", _gpu_cut)
    monkeypatch.setattr(triton_engine, "SPIN_LIMIT", 40)
    monkeypatch.setattr(side_by_side, "WAIT_LIMIT_S", 60.0)
    _, tri, x, state, starts = _side_by_side_case(name, 40)
    with side_by_side.programs_side_by_side(absent={(0, 1, 0)}):
        with pytest.raises(
            RuntimeError, match=r"forward_split_kernel of \w+\(.*\) at T=5, B=18, H=40"
        ):
            tri(x, state, starts)
    # the same launch with every part present runs through (at the product's bound: the
    # interpreter's stalls make a legitimate wait last many rounds)
    monkeypatch.undo()
    monkeypatch.setattr(triton_engine, "split_plan", _gpu_cut)
    with side_by_side.programs_side_by_side():
        y, _ = tri(x, state, starts)
    assert y.shape == (5, 18, 40)


@pytest.mark.parametrize("failing", ["forward_split_kernel", "backward_split_kernel"])
@pytest.mark.parametrize("name", ["hdetach_lstm", "ur_gru", "slstm"])
def test_a_gpu_short_of_the_split_kernels_shared_memory_runs_one_program_per_tile(
    name: str, failing: str, monkeypatch
) -> None:
    """Triton refuses, before launching it, a kernel whose programs need more shared memory
    than the GPU gives a block (``OutOfResources``; the split kernels at 256 units on a T4).
    The wrapper then runs the one-program-per-tile kernel instead, whether the forward or
    only the backward was refused: the same values and gradients, one warning, and later
    calls at that width go straight to the unsplit kernels."""
    from triton.runtime.errors import OutOfResources

    from memcores.cores import triton_kernels

    monkeypatch.setattr(triton_engine, "_UNFIT", set())
    monkeypatch.setattr(triton_engine, "_WARNED", set())
    refused = {getattr(triton_kernels, failing)}
    split = {triton_kernels.forward_split_kernel, triton_kernels.backward_split_kernel}
    launched = []
    launch = triton_engine.launch

    def short_of_shared_memory(kernel, grid, *args, **meta):
        launched.append(kernel)
        if kernel in refused:
            raise OutOfResources(200_000, 65_536, "shared memory")
        return launch(kernel, grid, *args, **meta)

    monkeypatch.setattr(triton_engine, "launch", short_of_shared_memory)
    options = {"p": 0.5} if "hdetach" in name else {}
    with pytest.warns(RuntimeWarning, match="one program per batch tile") as caught:
        _assert_match(name, EXACT, **options)
    fallbacks = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(fallbacks) == 1 and launched[0] in split and set(launched) & refused
    launched.clear()
    with warnings.catch_warnings(record=True) as later:
        warnings.simplefilter("always")
        _assert_match(name, EXACT, **options)
    assert not [w for w in later if issubclass(w.category, RuntimeWarning)]
    assert launched and not set(launched) & split


@pytest.mark.parametrize("name", ["hdetach_lstm", "ur_gru", "slstm"])
def test_a_sequence_past_32_bit_offsets_runs_in_chunks_of_steps(name: str, monkeypatch) -> None:
    """The kernels address their buffers with 32-bit offsets, so a longer sequence runs as
    several launches, the state carried across: the same values and gradients (resets and
    h-detach draws included). The limit is lowered here so that T=6 needs three runs."""
    # the largest buffer a launch addresses: the saved gate blocks (the GRU's U_n h + b_hn too)
    # or sLSTM's four states
    core = make_core(name, D, H)
    blocks = 4 if name == "slstm" else core.weight_ih.shape[0] // H + ("gru" in name)
    per_step = B * blocks * H
    monkeypatch.setattr(triton_engine, "MAX_OFFSET", 3 * per_step)  # runs of two steps
    assert triton_engine.time_chunks(T, per_step) == [slice(0, 2), slice(2, 4), slice(4, 6)]
    launches = []
    launch = triton_engine.launch
    monkeypatch.setattr(
        triton_engine, "launch", lambda *a, **k: (launches.append(a[0]), launch(*a, **k))
    )
    _assert_match(name, EXACT, **({"p": 0.5} if "hdetach" in name else {}))
    assert len(launches) == 2 * 3  # a forward and a backward per run
    with pytest.raises(ValueError, match="32-bit offsets; valid instead: impl='loop'"):
        triton_engine.time_chunks(T, 4 * per_step)


def test_recurrent_precision_follows_pytorchs_switch_for_its_rnns(monkeypatch) -> None:
    """On CUDA the kernels' products take the precision PyTorch gives its cuDNN RNNs: from
    PyTorch 2.9 ``torch.backends.cudnn.rnn.fp32_precision``, inheriting through ``none`` from
    ``torch.backends.cudnn`` and then ``torch.backends``; before 2.9
    ``torch.backends.cudnn.allow_tf32``. Elsewhere, and in the split plan on a CPU, full
    float32. (Both APIs through stand-ins, so every PyTorch checks both.)"""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")

    def switches(rnn=None, cudnn="none", backends="none", allow_tf32=False) -> None:
        fake = types.SimpleNamespace(fp32_precision=cudnn, allow_tf32=allow_tf32)
        if rnn is not None:  # PyTorch 2.9 on
            fake.rnn = types.SimpleNamespace(fp32_precision=rnn)
        monkeypatch.setattr(torch.backends, "cudnn", fake)
        monkeypatch.setattr(torch.backends, "fp32_precision", backends, raising=False)

    for value in ("tf32", "ieee"):
        switches(rnn=value, cudnn="ieee" if value == "tf32" else "tf32")
        assert triton_engine.recurrent_precision(cuda) == value
        assert triton_engine.recurrent_precision(cpu) == "ieee"
    switches(rnn="none", cudnn="tf32")
    assert triton_engine.recurrent_precision(cuda) == "tf32"  # inherited from cuDNN's switch
    switches(rnn="none", backends="tf32")
    assert triton_engine.recurrent_precision(cuda) == "tf32"  # and from PyTorch's own
    switches(rnn="none")
    assert triton_engine.recurrent_precision(cuda) == "ieee"
    for allow_tf32, expected in ((True, "tf32"), (False, "ieee")):  # before PyTorch 2.9
        switches(allow_tf32=allow_tf32, cudnn="tf32" if expected == "ieee" else "ieee")
        assert triton_engine.recurrent_precision(cuda) == expected
    monkeypatch.undo()
    if hasattr(torch.backends.cudnn, "rnn"):  # the real switch is where the stand-in has it
        assert torch.backends.cudnn.rnn.fp32_precision in ("none", "tf32", "ieee")
    plan = triton_engine.split_plan(T, B, H, torch.device(DEVICE))
    if DEVICE == "cpu":  # under the interpreter
        assert plan is not None and plan.precision == plan.meta()["PREC"] == "ieee"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: TF32 is a GPU mode")
@pytest.mark.parametrize("name", ["ur_lstm", "fast_gru", "slstm"])
def test_with_tf32_products_the_kernels_stay_near_the_reference(name: str, monkeypatch) -> None:
    """PyTorch's default for its RNNs (TF32 products) on the fused kernels: within TF32's
    rounding of the full-float32 reference loop (the other tests run full float32)."""
    monkeypatch.setattr(torch.backends.cudnn.rnn, "fp32_precision", "tf32")
    assert triton_engine.recurrent_precision(torch.device("cuda")) == "tf32"
    ref, tri = _pair(name, torch.float32)
    x, _, starts = _inputs(torch.float32)
    # a state the core can reach: from random states sLSTM's normaliser can sit near zero, and
    # h = c / n turns TF32's rounding into gradients 1e5 apart
    with torch.no_grad():
        _, state = ref(x.flip(0), ref.initial_state(B, DEVICE))
    _assert_paths_match(tri, ref, x, state, starts, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("hidden", "warps"), [(16, 4), (64, 4), (100, 8), (128, 8), (256, 8)])
def test_split_programs_run_the_warps_that_hold_their_weights(hidden: int, warps: int) -> None:
    """The warps follow the hidden size (4 up to 64 units, 8 above, where 4 would spill the
    forward's weights: see the compile test)."""
    # one program per batch tile: 8 warps with 32-wide chunks, 4 with 16-wide ones
    meta = triton_engine.block_meta(hidden)
    assert meta["num_warps"] == (4 if meta["BLOCK_N"] == 16 else 8)
    plan = triton_engine.split_plan(T, B, hidden, torch.device(DEVICE))
    if plan is not None:  # the split exists under the interpreter and on CUDA
        assert triton_engine.split_warps(plan.block_h) == plan.meta()["num_warps"] == warps


@pytest.mark.parametrize("name", ["ur_lstm", "tied_lstm", "hdetach_lstm", "gru", "ur_gru", "slstm"])
def test_kernel_with_one_program_per_tile_when_the_split_is_off(name: str, monkeypatch) -> None:
    """MEMCORES_TRITON_SPLIT=0 (and shapes the GPU cannot hold split) run every unit of a
    step in one program per batch tile: the same values and gradients."""
    monkeypatch.setenv(triton_engine.SPLIT_ENV, "0")
    assert triton_engine.split_plan(T, B, H, torch.device(DEVICE)) is None
    _assert_match(name, EXACT)


def test_split_plan_keeps_every_program_resident(monkeypatch) -> None:
    """On a GPU the parts of a tile wait for each other, so the grid never exceeds the
    multiprocessors: wider batch tiles first, then no split, with a warning once."""
    from types import SimpleNamespace

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(triton_engine, "_WARNED", set())
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda _: SimpleNamespace(multi_processor_count=132)
    )
    cuda = torch.device("cuda")
    plan = triton_engine.split_plan(256, 64, 128, cuda)
    assert (plan.block_b, plan.tiles, plan.parts, plan.block_h) == (16, 4, 8, 128)
    assert triton_engine.split_plan(256, 512, 128, cuda).block_b == 32  # 16 tiles x 8 parts
    assert triton_engine.split_plan(256, 1024, 128, cuda).block_b == 64
    with pytest.warns(RuntimeWarning, match="batch 4096 at hidden 128 needs more unit-split"):
        assert triton_engine.split_plan(256, 4096, 128, cuda) is None  # 64 tiles x 8 parts > 132
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per shape
        assert triton_engine.split_plan(256, 4096, 128, cuda) is None
    assert triton_engine.split_plan(256, 64, 512, cuda) is None  # weights beyond registers
    assert triton_engine.split_plan(256, 64, 128, torch.device("cpu")) is None


class _OpCounter(TorchDispatchMode):
    """Counts torch operator calls, except those inside a kernel launch (the interpreter's)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.launches = 0
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.ops += 1
        return func(*args, **(kwargs or {}))


_LAUNCH = triton_engine.launch


def _count(core, steps: int, monkeypatch) -> _OpCounter:
    counter = _OpCounter()

    def counting_launch(*args, **kwargs):
        counter.launches += 1
        counter.paused = True
        try:
            _LAUNCH(*args, **kwargs)
        finally:
            counter.paused = False

    monkeypatch.setattr(triton_engine, "launch", counting_launch)
    x, state, starts = _inputs(EXACT, steps, core.state_arity)
    with counter:
        _run(core, x, state, starts)
    return counter


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_launches_per_forward_backward_do_not_grow_with_sequence_length(
    name: str, monkeypatch
) -> None:
    """The fused path: two kernel launches and the same torch ops at T=4 and T=8; the
    reference loop's ops grow with T (the launch-bound pattern on a GPU)."""
    ref, tri = _pair(name, EXACT)
    short, long = _count(tri, 4, monkeypatch), _count(tri, 8, monkeypatch)
    assert short.launches == long.launches == 2
    assert short.ops == long.ops
    ref_short, ref_long = _count(ref, 4, monkeypatch), _count(ref, 8, monkeypatch)
    assert ref_short.launches == ref_long.launches == 0
    assert ref_long.ops > ref_short.ops + 4 * 5


@pytest.mark.skipif(DEVICE == "cuda", reason="checks the CPU's default dispatch")
def test_cpu_default_keeps_the_cpu_fused_function(monkeypatch) -> None:
    def no_launch(*args, **kwargs):
        raise AssertionError("the Triton kernel ran on CPU tensors by default")

    monkeypatch.setattr(triton_engine, "launch", no_launch)
    core = make_core("lstm", D, H)
    assert core.has_fused
    x, state, starts = _inputs(torch.float32)
    y, _ = core(x, state, starts)
    assert y.shape == (T, B, H)
    gru = make_core("gru", D, H)
    assert gru.has_fused
    assert gru(x, state[:1], starts)[0].shape == (T, B, H)
    assert not make_core("lstm", D, H, impl="loop").has_fused
    for name in ("power_lstm", "power_gru"):  # Triton on CUDA, the reference loop on the CPU
        core = make_core(name, D, H)
        assert core.has_fused
        assert core(x, state[: core.state_arity], starts)[0].shape == (T, B, H)


@pytest.mark.slow
def test_kernels_compile_for_a_gpu_within_its_shared_memory() -> None:
    """Every kernel compiles for an sm_90 GPU (the interpreter never runs Triton's compiler),
    specialised as a launch at T=256, B=64 is (``tests/triton_compile.py``), at full float32
    and TF32 products, and needs under the 99 KiB of shared memory a block gets on consumer
    GPUs at H=128 and H=256; at their default warps the kernels keep their working set in
    registers (``ptxas -v``: no spill in a split forward, a few bytes at most elsewhere), where
    4 warps would spill in the LSTM and GRU split forwards. No unit-split kernel holds an
    asynchronous copy from global memory in its ``ttgir``: Triton's software pipeliner, where
    a time loop allows it, issues a later step's read of the values the parts exchange before
    this step's wait (``SPLIT_LOOP_STAGES``)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("triton_compile.py")
    env["PYTHONPATH"] = os.pathsep.join([str(script.parent.parent), env.get("PYTHONPATH", "")])

    def compiled(*args: str) -> dict[str, list[int]]:
        out = subprocess.run(
            [sys.executable, str(script), *args],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return {
            name: [int(v) for v in values] for name, *values in map(str.split, out.splitlines())
        }

    kernels = compiled("128", "--spills")
    # 5 families x 2 precisions x (forward, backward), and 3 split cuts x (forward, backward):
    # full float32, TF32, 4 warps
    assert len(kernels) == 50
    wide = compiled("256")
    for name, (shared, copies, *_) in [*kernels.items(), *wide.items()]:
        assert shared <= 99 * 1024, (name, shared)
        # no split kernel reads ahead: a read of another part's values issued before the wait
        # (an asynchronous copy into shared memory) would find them unwritten
        assert copies == 0 or "_split" not in name, (name, copies)
    for family in ("lstm", "gru", "slstm", "lstm_power", "gru_power"):
        for precision in ("", "_tf32"):
            # the split forwards: none; the tile forwards (the fallback): a register's worth
            # at most (the LSTM's at TF32 spills 4 bytes with Triton 3.9)
            assert kernels[f"{family}.forward_split{precision}"][2:] == [0, 0], kernels
            assert max(kernels[f"{family}.forward{precision}"][2:]) <= 8, kernels
            for split in ("", "_split"):
                assert max(kernels[f"{family}.backward{split}{precision}"][2:]) <= 32, kernels
    for family in ("lstm", "gru", "lstm_power", "gru_power"):
        assert min(kernels[f"{family}.forward_split_4_warps"][2:]) > 0, kernels


@pytest.mark.parametrize("name", ["lstm", "u_lstm", "c_lstm", "hdetach_lstm", "gru"])
def test_cudnn_route_matches_the_reference_loop(name: str, monkeypatch) -> None:
    """The presets that are nn.LSTM's / nn.GRU's maths give the reference's values and
    gradients through PyTorch's RNN kernels (cuDNN on CUDA), a reset at step 0 included."""
    from memcores.cores import cudnn

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # full float32 products
    ref, _ = _pair(name, EXACT)
    ref.eval()  # hdetach_lstm is nn.LSTM's maths only outside training
    x, state, starts = _inputs(EXACT, n_state=ref.state_arity)
    first_only = torch.zeros_like(starts)
    first_only[0] = starts[0]
    applies = cudnn.lstm_applies if ref.state_arity == 2 else cudnn.gru_applies
    run = cudnn.lstm if ref.state_arity == 2 else cudnn.gru
    assert applies(ref, first_only.cpu()) and not applies(ref, starts.cpu())
    assert applies(ref, starts[:1]) and applies(ref, None)
    # starts on a GPU are not read back (no host sync): beyond one step, the fused kernel
    assert applies(ref, first_only) == (DEVICE == "cpu")
    expected = _run(ref, x, state, first_only)
    via_dnn = lambda *args: run(ref, *args)  # noqa: E731
    got = _run(via_dnn, x, state, first_only, params=ref.parameters())
    _assert_all_close(got, expected, **CUDNN_TOL[EXACT])
    assert not cudnn.lstm_applies(make_core("ur_lstm", D, H), None)
    assert not cudnn.gru_applies(make_core("fast_gru", D, H), None)


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_cudnn_route_keeps_its_backward_for_an_eval_core_with_gradients(name, monkeypatch):
    """cuDNN refuses a backward of a call made with ``train=False`` ("cudnn RNN backward can
    only be called in training mode"), so the flag follows autograd, not ``core.training``:
    an eval-mode core differentiated (the memory probe) keeps its backward."""
    from memcores.cores import cudnn

    fn = "lstm" if name == "lstm" else "gru"
    flags: list[bool] = []
    real = getattr(torch._VF, fn)

    def spy(*args):
        flags.append(args[-3])  # (..., dropout, train, bidirectional, batch_first)
        return real(*args)

    monkeypatch.setattr(torch._VF, fn, spy)
    core = make_core(name, D, H).eval()
    x, state, _ = _inputs(torch.float32, n_state=core.state_arity)
    core.to(DEVICE)
    y, _ = getattr(cudnn, fn)(core, x, state, None)
    y.sum().backward()
    with torch.no_grad():
        getattr(cudnn, fn)(core, x, state, None)
    assert flags == [True, False]
    assert all(p.grad is not None for p in core.parameters() if p.requires_grad)


TRAINING_SHAPE_PRESETS = ["fast_lstm", "ur_lstm", "tied_lstm", "hdetach_lstm", "fast_gru", "ur_gru"]
TRAINING_SHAPE_PRESETS += ["slstm"]
TRAINING_SHAPE_CASES = [("1", name) for name in TRAINING_SHAPE_PRESETS]
TRAINING_SHAPE_CASES += [("0", name) for name in ("ur_lstm", "ur_gru", "slstm")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: compiled tile cuts")
@pytest.mark.parametrize(("split", "name"), TRAINING_SHAPE_CASES)
def test_kernels_match_the_reference_loop_at_a_training_shape_on_cuda(
    split: str, name: str, monkeypatch
) -> None:
    """At H=128 the split runs 8 parts per batch tile over 24 steps, meeting after each step,
    and with the split off one program per batch tile runs every unit: each must give the
    reference loop's values and gradients."""
    monkeypatch.setenv(triton_engine.SPLIT_ENV, split)
    steps, batch, width, hidden = 24, 40, 16, 128
    assert (triton_engine.split_plan(steps, batch, hidden, torch.device("cuda")) is None) == (
        split == "0"
    )
    torch.manual_seed(0)
    ref = make_core(name, width, hidden, impl="loop").to("cuda").train()
    tri = make_core(name, width, hidden, impl="triton").to("cuda").train()
    tri.load_state_dict(ref.state_dict())
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(steps, batch, width, generator=gen).cuda()
    starts = (torch.rand(steps, batch, generator=gen) < 0.1).cuda()
    with torch.no_grad():
        _, state = ref(x.flip(0), ref.initial_state(batch, "cuda"))
    compiled: list = []
    real_launch = triton_engine.launch

    def recorded_launch(kernel, grid, *args, **meta):
        compiled.append(real_launch(kernel, grid, *args, **meta))
        return compiled[-1]

    monkeypatch.setattr(triton_engine, "launch", recorded_launch)
    _assert_paths_match(tri, ref, x, state, starts, rtol=2e-3, atol=2e-4)
    # as launched here (this GPU's Triton, the launch's own specialization), no split kernel
    # reads another part's values ahead of its wait (triton_engine.SPLIT_LOOP_STAGES)
    split_kernels = [k for k in compiled if "split_kernel" in k.name]
    assert len(split_kernels) == (2 if split == "1" else 0)
    for kernel in split_kernels:
        assert "async_copy_global_to_local" not in kernel.asm["ttgir"], kernel.name


SHARED_GPU_RUN = """
import torch
from memcores.cores import make_core
core = make_core("ur_lstm", 16, 128, impl="triton").cuda()
sms = torch.cuda.get_device_properties(0).multi_processor_count
batch = 16 * (sms // 8)  # a grid of one program per multiprocessor: 8 parts x batch / 16 tiles
x = torch.randn(256, batch, 16, device="cuda", requires_grad=True)
for _ in range(20):
    y, _ = core(x, core.initial_state(batch, "cuda"))
    y.sum().backward()
torch.cuda.synchronize()
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: two processes on one GPU")
def test_two_processes_sharing_a_gpu_never_hang(tmp_path) -> None:
    """Two processes each launch split kernels whose grids fill every multiprocessor, at once
    on one GPU (as two sweep trials sharing it): each finishes, or (where the GPU runs both
    side by side, under MPS, and a part never starts) ends with the bounded wait's error;
    neither hangs."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    script = tmp_path / "run.py"
    script.write_text(SHARED_GPU_RUN)
    runs = [
        subprocess.Popen([sys.executable, str(script)], env=env, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        for run in runs:
            _, err = run.communicate(timeout=300)
            assert run.returncode == 0 or "never reached step" in err, err
    finally:
        for run in runs:
            run.kill()
