"""Custom VJP on the exact path: gradcheck in float64 and a student-teacher fit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sv_core import calibrate_C, refit
from sv_core.kernels import torch_kernel
from sv_core.vjp import ExactSVReadout, gate_score, sv_readout, svdd_from_keys, svdd_solve


def _problem(seed=0, n=14, d=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64)


def test_forward_matches_refit():
    X = _problem()
    C = calibrate_C(0.4, 14)
    a, rho = svdd_from_keys(X, C, 1.5)
    a_ref, rho_ref = refit(X.numpy(), C=C, sigma=1.5)
    np.testing.assert_allclose(a.numpy(), a_ref, atol=1e-10)
    assert abs(float(rho) - rho_ref) < 1e-10


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradcheck_alpha_rho_wrt_gram(seed):
    X = _problem(seed)
    K = torch_kernel(X, X, 1.5).detach().requires_grad_(True)
    C = calibrate_C(0.4, 14)
    f = lambda K: svdd_solve(0.5 * (K + K.T), C)  # noqa: E731 - symmetric parametrisation
    assert torch.autograd.gradcheck(f, (K,), eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("seed", [0, 3])
def test_gradcheck_scores_and_readout(seed):
    X = _problem(seed).requires_grad_(True)
    C = calibrate_C(0.4, 14)
    g = torch.Generator().manual_seed(seed + 10)
    P = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    V = torch.randn(14, 2, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda X, P: gate_score(P, X, C, 1.5), (X, P), eps=1e-6, atol=1e-5)
    assert torch.autograd.gradcheck(lambda Q, X, V: sv_readout(Q, X, V, C, 1.5), (P, X, V), eps=1e-6, atol=1e-5)


def test_gradient_is_nonzero_only_through_margin():
    X = _problem(4, n=20)
    C = calibrate_C(0.4, 20)
    K = torch_kernel(X, X, 1.5).detach().requires_grad_(True)
    a, rho = svdd_solve(K, C)
    (a.sum() * 0 + rho).backward()
    assert K.grad is not None and torch.isfinite(K.grad).all() and K.grad.abs().sum() > 0
    reserve = (a == 0).nonzero().ravel()
    assert K.grad[reserve].abs().max() == 0  # rows of reserve keys receive nothing


def test_student_layer_learns_teacher_mapping():
    torch.manual_seed(0)
    d_in, n, m = 4, 12, 8
    C = calibrate_C(0.5, n)
    teacher = ExactSVReadout(d_in, 3, 2, C, 2.0, seed=1)
    student = ExactSVReadout(d_in, 3, 2, C, 2.0, seed=2)
    data = [(torch.randn(n, d_in, dtype=torch.float64), torch.randn(m, d_in, dtype=torch.float64)) for _ in range(8)]
    with torch.no_grad():
        targets = [teacher(xc, xq) for xc, xq in data]
    opt = torch.optim.Adam(student.parameters(), lr=0.05)

    def loss_all():
        return sum(((student(xc, xq) - y) ** 2).mean() for (xc, xq), y in zip(data, targets)) / len(data)

    with torch.no_grad():
        l0 = float(loss_all())
    for _ in range(120):
        opt.zero_grad()
        loss = loss_all()
        loss.backward()
        opt.step()
    with torch.no_grad():
        l1 = float(loss_all())
    assert l1 < 0.2 * l0, (l0, l1)
