"""NRU (Chandar et al., "Towards Non-saturating Recurrent Units for Modelling Long-term
Dependencies", AAAI 2019, arXiv:1902.06704) checked against its equations in float64."""

from __future__ import annotations

import pytest
import torch
from equation_helpers import B, D, build, inputs

from memcores.cores import make_core


def _pnorm_normalise(v: list[float], p: float) -> list[float]:
    norm = sum(abs(a) ** p for a in v) ** (1.0 / p)
    return [a / max(norm, 1e-12) for a in v]


def _reference_nru(core, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chandar et al. eqs. 1-2: h = relu(W_i x + W_h h + W_c m); k write and k erase heads with
    strengths alpha, beta and p-normalised outer-product vectors v, u; m += (1/k) sum_j
    (alpha_j v_j - beta_j u_j)."""
    H, M, k, s = core.hidden_size, core.memory_size, core.heads, core.side
    h = torch.zeros(B, H, dtype=torch.float64)
    m = torch.zeros(B, M, dtype=torch.float64)
    ys = []
    for x_t in x:
        h = torch.relu(
            x_t @ core.weight_ih.T + h @ core.weight_hh.T + m @ core.weight_mh.T + core.bias
        )
        z = torch.cat([h, m], dim=1) @ core.weight_head.T + core.bias_head  # [B, 2k + 4s]
        new_m = m.clone()
        for b in range(B):
            row = z[b].tolist()
            alpha, beta = row[:k], row[k : 2 * k]
            pv, qv = row[2 * k : 2 * k + s], row[2 * k + s : 2 * k + 2 * s]
            pu, qu = row[2 * k + 2 * s : 2 * k + 3 * s], row[2 * k + 3 * s :]
            flat_v = [a * c for a in pv for c in qv]  # outer product, row-major, k*M entries
            flat_u = [a * c for a in pu for c in qu]
            for j in range(k):
                v_j = _pnorm_normalise(flat_v[j * M : (j + 1) * M], core.p)
                u_j = _pnorm_normalise(flat_u[j * M : (j + 1) * M], core.p)
                for n in range(M):
                    new_m[b, n] += (alpha[j] * v_j[n] - beta[j] * u_j[n]) / k
        m = new_m
        ys.append(h)
    return torch.stack(ys), h, m


def test_nru_matches_its_equations() -> None:
    core = build("nru", 6, memory_size=16, heads=4)  # s = sqrt(4 * 16) = 8
    x = inputs(steps=5)
    y, (h, m) = core(x, core.initial_state(B))
    y_ref, h_ref, m_ref = _reference_nru(core, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m, m_ref, rtol=1e-12, atol=1e-12)
    assert m.abs().sum() > 0 and (y >= 0).all()  # the memory moved; the state is a ReLU


def test_nru_options_are_checked() -> None:
    core = make_core("nru", D, 8)
    assert (core.memory_size, core.heads, core.side) == (64, 4, 16)  # Ohno et al.'s memory 64
    assert [s.shape for s in core.initial_state(2)] == [(2, 8), (2, 64)]
    with pytest.raises(ValueError, match="perfect square"):
        make_core("nru", D, 8, memory_size=10)
    with pytest.raises(ValueError, match="positive"):
        make_core("nru", D, 8, heads=0)
