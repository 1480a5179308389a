"""The reset and the reference time loop of cores.base against rules written out here: which
rows reset, to what, in which dtype, at which steps, and what the loop returns."""

from __future__ import annotations

import pytest
import torch

from memcores.cores.base import MemoryCore, _expand_mask, keep_mask, reset_where, step_loop


def _decay_step(x_t, state):
    """``h <- 0.5 h + x``: the output is the new state (enough to see every reset)."""
    (h,) = state
    h = 0.5 * h + x_t
    return h, (h,)


def _hand_loop(inputs, h, starts, initial):
    outs = []
    for t in range(inputs.shape[0]):
        for b in range(inputs.shape[1]):
            if starts is not None and starts[t, b]:
                h = h.clone()
                h[b] = initial
        h = 0.5 * h + inputs[t]
        outs.append(h)
    return torch.stack(outs), h


@pytest.mark.parametrize("with_starts", [False, True])
def test_step_loop_resets_then_steps_like_a_hand_loop(with_starts: bool) -> None:
    g = torch.Generator().manual_seed(0)
    inputs = torch.randn(5, 3, 2, generator=g, dtype=torch.float64)
    h0 = torch.randn(3, 2, generator=g, dtype=torch.float64)
    starts = None
    if with_starts:
        starts = torch.zeros(5, 3, dtype=torch.bool)
        starts[0, 2] = starts[2, 0] = starts[2, 1] = starts[4, 1] = True
    y, (h,) = step_loop(_decay_step, inputs, (h0,), starts, reset_where)
    want_y, want_h = _hand_loop(inputs, h0, starts, 0.0)
    assert y.shape == (5, 3, 2)
    torch.testing.assert_close(y, want_y, rtol=0, atol=0)
    torch.testing.assert_close(h, want_h, rtol=0, atol=0)


def test_step_loop_hands_reset_the_mask_of_each_reset_step_only() -> None:
    starts = torch.zeros(4, 2, dtype=torch.bool)
    starts[1, 0] = starts[3, 1] = True
    seen = []

    def reset(state, mask):
        seen.append(mask.tolist())
        return state

    step_loop(_decay_step, torch.zeros(4, 2, 1), (torch.zeros(2, 1),), starts, reset)
    assert seen == [[True, False], [False, True]]
    devices = []

    def reset_on(state, mask):
        devices.append(mask.device.type)
        return state

    inputs = torch.zeros(4, 2, 1, device="meta")  # starts stay on the CPU
    step_loop(_decay_step, inputs, (torch.zeros(2, 1, device="meta"),), starts, reset_on)
    assert devices == ["meta", "meta"]


def test_expand_mask_broadcasts_over_trailing_dims() -> None:
    mask = torch.tensor([True, False])
    assert _expand_mask(mask, torch.zeros(2, 3, 4)).shape == (2, 1, 1)
    assert _expand_mask(mask, torch.zeros(2)).shape == (2,)
    seq = torch.zeros(3, 2, dtype=torch.bool)
    assert _expand_mask(seq, torch.zeros(3, 2, 5)).shape == (3, 2, 1)
    assert _expand_mask(mask, torch.zeros(2, 3, 4)).flatten().tolist() == [True, False]


def test_reset_where_keeps_each_tensors_dtype_and_zeroes_reset_rows_gradient() -> None:
    s = torch.ones(3, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([False, True, False])
    (out,) = reset_where((s,), mask, (torch.full((2,), 7, dtype=torch.int32),))
    assert out.dtype == torch.float64
    assert out[:, 0].tolist() == [1.0, 7.0, 1.0]
    out.sum().backward()
    assert s.grad[:, 0].tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError):
        reset_where((s, s), mask, (torch.zeros(2),))
    (narrow,) = reset_where(
        (torch.ones(3, 2),), mask, (torch.full((2,), 0.1, dtype=torch.float64),)
    )
    assert narrow.dtype == torch.float32  # a float64 initial state does not widen the state


def test_reset_where_moves_the_mask_and_initial_state_to_the_states_device() -> None:
    """The episode flags and an initial state live on the CPU while the state may not: the meta
    device stands in for a GPU (torch.where refuses tensors on two devices)."""
    state = (torch.ones(3, 2, device="meta"),)
    mask = torch.tensor([True, False, True])
    assert reset_where(state, mask)[0].device.type == "meta"
    assert reset_where(state, mask, (torch.zeros(2),))[0].device.type == "meta"
    assert _expand_mask(mask, state[0]).device.type == "meta"


def test_keep_mask_is_one_minus_starts_with_a_trailing_axis() -> None:
    assert keep_mask(None, torch.float32) is None
    starts = torch.tensor([[1, 0], [0, 1], [0, 0]])  # not bool: any integer flags
    keep = keep_mask(starts, torch.float64)
    assert keep.dtype == torch.float64 and keep.shape == (3, 2, 1)
    assert keep.flatten().tolist() == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]


class _OnesCore(MemoryCore):
    """A core whose initial state is ``tensors`` tensors of ones (a reset is not a zeroing);
    it records the device each initial state is asked for."""

    def __init__(self, tensors: int = 1) -> None:
        torch.nn.Module.__init__(self)
        self.tensors, self.asked = tensors, []

    def initial_state(self, batch_size, device=None):
        self.asked.append(None if device is None else torch.device(device).type)
        return tuple(torch.ones(batch_size, 2, device=device) for _ in range(self.tensors))


def test_reset_state_puts_the_cores_initial_state_in_masked_rows() -> None:
    core = _OnesCore()
    state = (torch.full((3, 2), 4.0),)
    (out,) = core.reset_state(state, torch.tensor([True, False, True]))
    assert out[:, 1].tolist() == [1.0, 4.0, 1.0]


def test_reset_state_builds_the_initial_state_on_the_states_device() -> None:
    """On the state's device (meta standing in for a GPU, the flags on the CPU); on the mask's
    for a core without state tensors."""
    core = _OnesCore()
    (out,) = core.reset_state((torch.ones(3, 2, device="meta"),), torch.tensor([True, False, True]))
    assert out.device.type == "meta" and core.asked == ["meta"]
    stateless = _OnesCore(tensors=0)
    assert stateless.reset_state((), torch.tensor([True], device="meta")) == ()
    assert stateless.asked == ["meta"]
