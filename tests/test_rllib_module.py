"""``agents/rllib_module.py``'s :class:`CoreRLModule` with a core whose outputs are written out
by hand (tests/counting_core.py) in place of the net's core, and identity encoder and heads:
the state RLlib hands in is carried through every step of a sequence and handed back, values
are the critic's on the core's outputs; and the one-line refusals, word for word."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("ray.rllib", reason="RLlib is not installed (pip install memcores[rllib])")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from counting_core import START, CountingCore  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402

from memcores.agents.rllib_module import CoreRLModule, state_batch  # noqa: E402


def _counting_module() -> CoreRLModule:
    """One observation feature; the encoder, actor and critic are identities around the
    counting core, so logits and values are the core's running totals."""
    module = CoreRLModule(
        observation_space=gym.spaces.Box(-10, 10, (1,), np.float32),
        action_space=gym.spaces.Discrete(2),
        model_config={"core": "lstm", "hidden_size": 8, "max_seq_len": 3},
    )
    module.net.vector = nn.Identity()
    module.net.core = CountingCore()
    module.net.actor = nn.Identity()
    module.net.critic = nn.Identity()
    return module.eval()


def _obs(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).unsqueeze(-1)  # [B, T, 1], as numpy gives


def test_the_state_in_is_carried_through_the_sequence_and_handed_out():
    """STATE_IN totals 5 and 7 (steps 3 and 0), observations 1, 2, 3 and 4, 5, 6 (float64,
    read as float32): outputs 6, 8, 11 and 11, 16, 22, with no reset inside a sequence;
    STATE_OUT is the state after the last step: totals 11 and 22, steps 6 and 3."""
    module = _counting_module()
    state_in = {"s0": torch.tensor([[5.0], [7.0]]), "s1": torch.tensor([3, 0])}
    batch = {Columns.OBS: _obs([[1, 2, 3], [4, 5, 6]]), Columns.STATE_IN: state_in}
    out = module.forward_inference(batch)
    logits = out[Columns.ACTION_DIST_INPUTS]
    assert logits.dtype == torch.float32
    assert logits.squeeze(-1).tolist() == [[6.0, 8.0, 11.0], [11.0, 16.0, 22.0]]
    assert list(out[Columns.STATE_OUT]) == ["s0", "s1"]
    assert out[Columns.STATE_OUT]["s0"].tolist() == [[11.0], [22.0]]
    assert out[Columns.STATE_OUT]["s1"].tolist() == [6, 3]
    assert torch.equal(out[Columns.EMBEDDINGS], logits)


def test_values_run_the_core_or_read_the_given_embeddings():
    """Without embeddings the values are the critic's on the core's outputs from STATE_IN
    (``[B, T]``); with embeddings given, the critic's on those, the core not run."""
    module = _counting_module()
    state = state_batch(module, 2)
    assert state["s0"].tolist() == [[START], [START]] and state["s1"].tolist() == [0, 0]
    batch = {Columns.OBS: _obs([[1, 2], [3, 4]]), Columns.STATE_IN: state}
    values = module.compute_values(batch)
    assert values.shape == (2, 2)
    assert values.tolist() == [[11.0, 13.0], [13.0, 17.0]]
    given = torch.arange(4.0).view(2, 2, 1)
    assert module.compute_values(batch, given).tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_the_refusals_are_one_exact_line_each():
    """Observations of another rank or width, STATE_IN missing, not a dict, with other keys
    or rows of another shape: each message word for word."""
    module = _counting_module()
    state = state_batch(module, 2)
    obs = torch.zeros(2, 1, 1)
    rank = (
        r"^CoreRLModule: observations must be \[B, T, 1\] sequences \(T = 1 when acting: "
        r"obs\[:, None\]\), got \[2, 1\]$"
    )
    width = rank.replace(r"got \[2, 1\]", r"got \[2, 1, 3\]")
    keys = (
        r"^CoreRLModule: batch\[STATE_IN\] must hold the core's state \['s0', 's1'\] \(each row "
        r"from get_initial_state\(\) or an earlier STATE_OUT\), got "
    )
    shape = r"^CoreRLModule: STATE_IN\['s1'\] must be \[2\] for 2 sequences, got \[2, 1\]$"
    cases = [
        ({Columns.OBS: torch.zeros(2, 1), Columns.STATE_IN: state}, rank),
        ({Columns.OBS: torch.zeros(2, 1, 3), Columns.STATE_IN: state}, width),
        ({Columns.OBS: obs}, keys + "NoneType$"),
        ({Columns.OBS: obs, Columns.STATE_IN: [state["s0"]]}, keys + "list$"),
        ({Columns.OBS: obs, Columns.STATE_IN: {"s1": state["s1"]}}, keys + r"\['s1'\]$"),
        (
            {Columns.OBS: obs, Columns.STATE_IN: {**state, "s2": state["s1"]}},
            keys + r"\['s0', 's1', 's2'\]$",
        ),
        ({Columns.OBS: obs, Columns.STATE_IN: {**state, "s1": torch.zeros(2, 1)}}, shape),
    ]
    for batch, message in cases:
        with pytest.raises(ValueError, match=message):
            module.forward_inference(batch)
    rows = r"^CoreRLModule: STATE_IN\['s0'\] must be \[3, 1\] for 3 sequences, got \[2, 1\]$"
    three = {Columns.OBS: torch.zeros(3, 1, 1), Columns.STATE_IN: {**state, "s1": torch.zeros(3)}}
    with pytest.raises(ValueError, match=rows):
        module.compute_values(three)
