"""``agents/torchrl_module.py``'s :class:`CoreModule` on a core whose every output is written
out by hand: which state a row starts from, where it resets, what is written to ``"next"``, in
both modes and for any batch shape; and its one-line refusals, word for word."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

pytest.importorskip("torchrl", reason="torchrl is not installed (pip install memcores[torchrl])")

from counting_core import CountingCore  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.modules import set_recurrent_mode  # noqa: E402

from memcores.agents.torchrl_module import CoreModule  # noqa: E402


def _module(recurrent: bool = False) -> CoreModule:
    return CoreModule(CountingCore(), "x", "y", "s", default_recurrent_mode=recurrent)


def _col(values: list) -> Tensor:
    """``[..., 1]`` float tensor of ``values``."""
    return torch.tensor(values, dtype=torch.float32).unsqueeze(-1)


def test_the_mode_is_torchrls_context_or_the_default():
    """``set_recurrent_mode`` decides inside its context, the default outside it."""
    single, recurrent = _module(False), _module(True)
    assert not single.recurrent_mode and recurrent.recurrent_mode
    with set_recurrent_mode(True):
        assert single.recurrent_mode and recurrent.recurrent_mode
    with set_recurrent_mode(False):
        assert not single.recurrent_mode and not recurrent.recurrent_mode
    assert single.in_keys == ["x", "s_0", "s_1", "is_init"]
    assert single.out_keys == ["y", ("next", "s_0"), ("next", "s_1")]


def test_recurrent_mode_starts_each_row_from_its_stored_first_state_and_resets_at_is_init():
    """Inputs [1, 2, 3] and [4, 5, 6]; row 0 carries its stored total 5 (is_init false at
    t = 0): 6, 8, 11; row 1 starts (is_init at t = 0) from 10 and again at t = 2: 14, 19, 16.
    Only the state stored at t = 0 is read. ``"next"`` holds zeros but at the last step: the
    final totals 11 and 16, steps 3 + 3 = 6 (row 0 had 3) and 1."""
    module = _module(True)
    data = TensorDict(
        {
            "x": _col([[1, 2, 3], [4, 5, 6]]),
            "is_init": torch.tensor([[False, False, False], [True, False, True]]).unsqueeze(-1),
            "s_0": _col([[5, 99, 99], [7, 99, 99]]),
            "s_1": torch.tensor([[3, 50, 50], [2, 50, 50]]),
        },
        [2, 3],
    )
    out = module(data)
    assert out is data
    assert out["y"].squeeze(-1).tolist() == [[6.0, 8.0, 11.0], [14.0, 19.0, 16.0]]
    assert out["next", "s_0"].squeeze(-1).tolist() == [[0.0, 0.0, 11.0], [0.0, 0.0, 16.0]]
    assert out["next", "s_1"].tolist() == [[0, 0, 6], [0, 0, 1]]
    assert out["next", "s_1"].dtype == torch.int64


def test_recurrent_mode_without_a_state_starts_every_row_from_the_initial_state():
    """No state and no is_init: each row starts once, from 10, at its first step and never
    again: 11, 13, 16 and 14, 19, 25."""
    out = _module(True)(TensorDict({"x": _col([[1, 2, 3], [4, 5, 6]])}, [2, 3]))
    assert out["y"].squeeze(-1).tolist() == [[11.0, 13.0, 16.0], [14.0, 19.0, 25.0]]
    assert out["next", "s_1"].tolist() == [[0, 0, 3], [0, 0, 3]]


def test_recurrent_mode_reads_one_row_or_rows_under_leading_dims():
    """A ``[T]`` tensordict is one row; ``[A, B, T]`` is ``A * B`` rows, written back in
    its own shape."""
    module = _module(True)
    row = module(TensorDict({"x": _col([1, 2, 3])}, [3]))
    assert row.batch_size == torch.Size([3])
    assert row["y"].squeeze(-1).tolist() == [11.0, 13.0, 16.0]
    assert row["next", "s_0"].squeeze(-1).tolist() == [0.0, 0.0, 16.0]
    x = _col([[[1, 2], [3, 4]], [[5, 6], [7, 8]]])  # [2, 2, 2, 1]
    nested = module(TensorDict({"x": x}, [2, 2, 2]))
    assert nested.batch_size == torch.Size([2, 2, 2])
    assert nested["y"].squeeze(-1).tolist() == [[[11, 13], [13, 17]], [[15, 21], [17, 25]]]
    assert nested["next", "s_1"].tolist() == [[[0, 2], [0, 2]], [[0, 2], [0, 2]]]


def test_recurrent_mode_refuses_a_tensordict_without_a_time_dimension():
    with pytest.raises(
        ValueError, match="^recurrent mode needs a tensordict with a time dimension$"
    ):
        _module(True)(TensorDict({"x": torch.ones(1)}, []))


def test_single_step_mode_carries_the_stored_state_and_resets_to_the_cores_own():
    """``[2, 2]`` entries, one step each: the stored totals 1, 2, 3, 4 carried where is_init
    is false, the core's own 10 (not the primer's zeros) where it is true; inputs 1: totals
    2, 11, 4, 11 in the entries' shape, and ``"next"`` is the new state."""
    module = _module(False)
    data = TensorDict(
        {
            "x": torch.ones(2, 2, 1),
            "is_init": torch.tensor([[False, True], [False, True]]).unsqueeze(-1),
            "s_0": _col([[1, 2], [3, 4]]),
            "s_1": torch.tensor([[5, 6], [7, 8]]),
        },
        [2, 2],
    )
    out = module(data)
    assert out["y"].squeeze(-1).tolist() == [[2.0, 11.0], [4.0, 11.0]]
    assert out["next", "s_0"].squeeze(-1).tolist() == [[2.0, 11.0], [4.0, 11.0]]
    assert out["next", "s_1"].tolist() == [[6, 1], [8, 1]]


def test_single_step_mode_with_a_state_entry_missing_starts_from_the_initial_state():
    """Only one of the state's two entries (and is_init false): the row starts from the
    core's initial state, as with no state at all."""
    data = TensorDict(
        {"x": _col([1, 2]), "s_0": _col([5, 6]), "is_init": torch.zeros(2, 1, dtype=torch.bool)},
        [2],
    )
    out = _module(False)(data)
    assert out["y"].squeeze(-1).tolist() == [11.0, 12.0]
    assert out["next", "s_1"].tolist() == [1, 1]


def test_the_refusals_are_one_exact_line_each():
    """No input, an input of another width, a state entry of another shape, a state without
    is_init: each message word for word."""
    module = _module(False)
    with pytest.raises(
        ValueError, match=r"^CoreModule: the tensordict has no 'x' \(in_key\); its keys: none$"
    ):
        module(TensorDict({}, [2]))
    with pytest.raises(
        ValueError, match=r"^CoreModule: the tensordict has no 'x' \(in_key\); its keys: a, b$"
    ):
        module(TensorDict({"a": torch.ones(2), "b": torch.ones(2)}, [2]))
    wide = (
        r"^CoreModule: 'x' \(in_key\) must be \[\.\.\., 1\] \(the core's input_size\), "
        r"got \[\.\.\., 2, 3\]$"
    )
    with pytest.raises(ValueError, match=wide):
        module(TensorDict({"x": torch.ones(2, 2, 3)}, [2]))
    state = (
        r"^CoreModule: state entry 's_0' must be \[\.\.\., 1\] \(the core's state\), "
        r"got \[\.\.\., 2, 3\]$"
    )
    with pytest.raises(ValueError, match=state):
        module(TensorDict({"x": torch.ones(2, 1), "s_0": torch.ones(2, 2, 3)}, [2]))
    scalar = (
        r"^CoreModule: state entry 's_1' must be \[\.\.\., \] \(the core's state\), "
        r"got \[\.\.\., 2\]$"
    )
    with pytest.raises(ValueError, match=scalar):
        module(TensorDict({"x": torch.ones(2, 1), "s_1": torch.ones(2, 2)}, [2]))
    no_init = (
        r"^CoreModule: the tensordict carries the state but no 'is_init': without it the state "
        r"is reset at every step; add torchrl's InitTracker transform to the env "
        r"\(TransformedEnv\(env, InitTracker\(\)\)\)$"
    )
    with pytest.raises(ValueError, match=no_init):
        module(TensorDict({"x": torch.ones(2, 1), "s_1": torch.ones(2, dtype=torch.int64)}, [2]))


def test_rows_without_a_state_start_on_the_inputs_device():
    """A tensordict on the ``meta`` device (another device than the CPU's) without state or
    is_init: the initial state and the starts are made there, so the outputs and the state
    handed on are there too."""
    data = TensorDict({"x": torch.ones(2, 3, 1)}, [2, 3]).to("meta")
    out = _module(True)(data)
    devices = {out[key].device for key in ("y", ("next", "s_0"), ("next", "s_1"))}
    assert devices == {torch.device("meta")}


def test_a_state_entry_of_several_dims_is_named_in_full():
    """mLSTM's matrix memory is ``[B, 4, 2, 2]`` per row: the refusal spells every dim."""
    from memcores.cores import make_core

    module = CoreModule(make_core("mlstm", 5, 8), "x", "y", "m")
    data = {"x": torch.ones(2, 5), "m_0": torch.ones(2, 4, 2), "is_init": torch.ones(2, 1)}
    want = (
        r"^CoreModule: state entry 'm_0' must be \[\.\.\., 4, 2, 2\] \(the core's state\), "
        r"got \[\.\.\., 4, 2\]$"
    )
    with pytest.raises(ValueError, match=want):
        module(TensorDict(data, [2]))
