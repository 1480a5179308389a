"""RelRNN (cores/rel_lstm.py) against a line-by-line transcription of Algorithm 2 of
Kanuparthi et al.'s relevancy screening, in float64, and its options."""

from __future__ import annotations

import pytest
import torch

from memcores.cores import make_core
from memcores.cores.rel_lstm import RelLSTM, RelRNN

F64 = torch.float64


def _algorithm2(core: RelLSTM, x: torch.Tensor) -> torch.Tensor:
    """Transcription of Algorithm 2 for a RelRNN, one batch row at a time (python lists)."""
    T, B, _ = x.shape
    H = core.hidden_size
    lag = core.rho if core.screen == "rho" else core.nu
    out = torch.zeros(T, B, H, dtype=F64)
    V, U, b = core.recurrent.weight, core.input_proj.weight, core.input_proj.bias
    Wa, Ua, v = core.query.weight, core.key.weight, core.score.weight[0]
    ba = core.key.bias if core.key.bias is not None else torch.zeros(H, dtype=F64)
    for row in range(B):
        s = torch.zeros(H, dtype=F64)
        history: list[list] = []  # [h_i, beta_i] for every past step i
        relevant: list[list] = []
        for t in range(T):
            h = torch.tanh(V @ s + U @ x[t, row] + b)  # line 2
            if core.rho > 0 and t - lag >= 0:  # lines 6-7: screen h_{t-lag}
                cand = history[t - lag]
                if len(relevant) < core.rho:
                    relevant.append(list(cand))
                else:
                    low = min(range(len(relevant)), key=lambda j: relevant[j][1])
                    if cand[1] > relevant[low][1]:
                        relevant[low] = list(cand)
            history.append([h, 0.0])  # line 3
            window = history[max(0, t - core.nu + 1) :]  # lines 4-5
            memory = [w[0] for w in window] + [r_[0] for r_ in relevant]  # line 8
            e = torch.stack([v @ torch.tanh(Wa @ s + Ua @ m + ba) for m in memory])  # line 10
            z = torch.softmax(e, 0)  # line 11
            for w, a in zip(window, z[: len(window)], strict=False):
                w[1] += float(a.detach())  # beta: attention received while buffered
            s = h + sum(a * m for a, m in zip(z, memory, strict=True))  # line 12
            out[t, row] = s
    return out


@pytest.mark.parametrize(
    "nu, rho, screen, key_bias",
    [(2, 4, "rho", True), (4, 2, "rho", False), (2, 4, "exit", True), (3, 3, "rho", True)],
)
def test_rel_rnn_follows_algorithm_2(nu, rho, screen, key_bias) -> None:
    torch.manual_seed(0)
    core = make_core("rel_rnn", 2, 3, nu=nu, rho=rho, screen=screen, key_bias=key_bias).double()
    with torch.no_grad():
        core.key.weight.mul_(3.0)  # sharper attention: screening decisions differ by state
        if key_bias:
            core.key.bias.normal_()
    x = torch.randn(14, 3, 2, dtype=F64)
    y, _ = core(x, core.initial_state(3))
    torch.testing.assert_close(y, _algorithm2(core, x), rtol=1e-10, atol=1e-12)
    assert (core.key.bias is not None) == key_bias


def test_screen_rho_and_exit_differ_only_when_nu_differs_from_rho() -> None:
    x = torch.randn(20, 4, 2, dtype=F64)

    def run(nu, rho, screen):
        torch.manual_seed(0)
        core = RelRNN(2, 3, nu=nu, rho=rho, screen=screen).double()
        with torch.no_grad():
            core.key.weight.mul_(3.0)
        y, state = core(x, core.initial_state(4))
        return y, dict(zip(RelRNN.STATE_NAMES, state, strict=True))

    y_rho, _ = run(3, 3, "rho")
    y_exit, _ = run(3, 3, "exit")
    torch.testing.assert_close(y_rho, y_exit)
    y_rho, st = run(2, 5, "rho")
    y_exit, st_exit = run(2, 5, "exit")
    assert st["buffer"].shape[1] == 5 and st_exit["buffer"].shape[1] == 2
    assert not torch.allclose(y_rho, y_exit)


def test_rel_rnn_modrelu_and_options() -> None:
    core = make_core("rel_rnn", 2, 3, nonlinearity="modrelu").double()
    assert core.modrelu_bias is not None and len(core.STATE_NAMES) == 8
    x = torch.randn(4, 1, 2, dtype=F64)
    core(x, core.initial_state(1))[0].sum().backward()
    assert core.modrelu_bias.grad is not None
    assert make_core("rel_rnn", 2, 3).modrelu_bias is None
    with pytest.raises(ValueError, match="tanh, modrelu"):
        make_core("rel_rnn", 2, 3, nonlinearity="relu")
    with pytest.raises(ValueError, match="rho, exit"):
        make_core("rel_lstm", 2, 3, screen="first")
