"""Batched approximate SVDD path (sv_core.batched) against slow references and the exact refit."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from sv_core import rbf_kernel, refit, torch_kernel
from sv_core.batched import (
    BatchedGateError,
    batched_gate,
    fista_svdd,
    lambda_max_upper,
    partition_masks,
    project_capped_simplex,
    ridged_kkt_solve,
    validate_alpha,
    warmup_threshold,
)


def sort_projection_reference(z: np.ndarray, C: float) -> np.ndarray:
    """Slow exact projection onto {sum a = 1, 0 <= a <= C}: walk the sorted breakpoints of the
    piecewise-linear f(tau) = sum clip(z - tau, 0, C) and interpolate the crossing of 1."""
    z = np.asarray(z, dtype=np.float64)
    f = lambda t: np.clip(z - t, 0.0, C).sum()  # noqa: E731
    bps = np.sort(np.concatenate([z, z - C]))[::-1]  # descending tau: f increasing
    prev_t, prev_f = bps[0], f(bps[0])
    for t in bps[1:]:
        ft = f(t)
        if ft >= 1.0:
            tau = prev_t + (1.0 - prev_f) * (t - prev_t) / (ft - prev_f) if ft != prev_f else t
            return np.clip(z - tau, 0.0, C)
        prev_t, prev_f = t, ft
    raise ValueError("infeasible (n C < 1)")


def random_keys(rng, n, d=3, scale=1.0):
    return rng.normal(size=(n, d)) * scale


# ------------------------------------------------------------------ projection


def test_projection_hand_example():
    # tau = -0.2: clip(0.7) -> 0.5, 0.3, 0.2 ; sums to 1
    z = torch.tensor([[0.5, 0.1, 0.0]], dtype=torch.float64)
    a = project_capped_simplex(z, 0.5, torch.ones_like(z, dtype=torch.bool))
    assert torch.allclose(a, torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64), atol=1e-14)


@pytest.mark.parametrize("newton", [True, False])
@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_projection_matches_sort_reference(newton, dtype, atol):
    rng = np.random.default_rng(1)
    G, n = 40, 25
    z = rng.normal(size=(G, n)) * rng.uniform(0.01, 3.0, size=(G, 1))
    nvalid = rng.integers(5, n + 1, size=G)
    mask = np.arange(n)[None, :] < nvalid[:, None]
    C = 0.3
    zt = torch.tensor(z, dtype=dtype)
    # garbage in padded slots must not matter
    zt = torch.where(torch.tensor(mask), zt, torch.tensor(1e3, dtype=dtype))
    a = project_capped_simplex(zt, C, torch.tensor(mask), newton=newton).double().numpy()
    for g in range(G):
        ref = sort_projection_reference(z[g, : nvalid[g]], C)
        np.testing.assert_allclose(a[g, : nvalid[g]], ref, atol=atol)
        assert np.all(a[g, nvalid[g]:] == 0.0)


def test_projection_warm_start_same_answer():
    rng = np.random.default_rng(2)
    z = torch.tensor(rng.normal(size=(8, 3, 30)))
    mask = torch.ones_like(z, dtype=torch.bool)
    a0, tau = project_capped_simplex(z, 0.1, mask, return_tau=True)
    a1 = project_capped_simplex(z, 0.1, mask, tau0=tau + 0.05)
    assert torch.allclose(a0, a1, atol=1e-13)


def test_lambda_max_is_upper_bound():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(5, 30, 4))
    K = torch.tensor(np.stack([rbf_kernel(x, x, 2.0) for x in X]))
    mask = torch.ones(5, 30, dtype=torch.bool)
    mask[0, 12:] = False
    lam = lambda_max_upper(K, mask).numpy()
    lam1 = lambda_max_upper(K, mask, iters=1, nonnegative=True).numpy()  # FISTA's default
    for g in range(5):
        nv = int(mask[g].sum())
        true = np.linalg.eigvalsh(K[g, :nv, :nv].numpy())[-1]
        assert true <= lam[g] <= 1.05 * true
        assert true <= lam1[g] <= 1.2 * true


# ------------------------------------------------------------------ ridged KKT solve


def test_ridgeless_solve_on_exact_partition_reproduces_refit():
    """With the exact partition and ridge 0 the bordered system returns the exact optimum."""
    rng = np.random.default_rng(4)
    X = random_keys(rng, 30)
    C = 0.1
    alpha, rho = refit(X, C=C, sigma=2.0)
    K = torch.tensor(rbf_kernel(X, X, 2.0))[None]
    S = torch.tensor((alpha > 1e-9) & (alpha < C - 1e-9))[None]
    E = torch.tensor(alpha >= C - 1e-9)[None]
    a, r = ridged_kkt_solve(K, C, S, E, ridge=0.0)
    np.testing.assert_allclose(a[0].numpy(), alpha, atol=1e-8)
    assert abs(float(r[0]) - rho) < 1e-8


def test_ridged_solve_gradcheck_float64():
    rng = np.random.default_rng(5)
    X = torch.tensor(random_keys(rng, 9, d=2), requires_grad=True)
    C = 0.25
    with torch.no_grad():
        K0 = torch_kernel(X, X, 2.0)[None]
        a0 = fista_svdd(K0, C, torch.ones(1, 9, dtype=torch.bool), iters=2000, tol=1e-12)
        S, E = partition_masks(a0, C, torch.ones(1, 9, dtype=torch.bool))
    assert S.sum() >= 2

    def f(X):
        K = torch_kernel(X, X, 2.0)[None]
        a, r = ridged_kkt_solve(K, C, S, E, ridge=1e-3)
        return a, r

    assert torch.autograd.gradcheck(f, (X,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("solver", ["lu", "cholesky"])
def test_empty_margin_rho_from_kkt_interval(solver):
    # 4 keys, C = 0.25: every alpha = C, S empty; rho is the midpoint of [max_R h, min_E h] = min_E h
    rng = np.random.default_rng(6)
    X = random_keys(rng, 4)
    K = torch.tensor(rbf_kernel(X, X, 2.0))[None]
    E = torch.ones(1, 4, dtype=torch.bool)
    a, r = ridged_kkt_solve(K, 0.25, torch.zeros_like(E), E, solver=solver)
    h = np.diag(K[0].numpy()) - 2 * 0.25 * K[0].numpy().sum(1)
    assert np.allclose(a.numpy(), 0.25)
    assert abs(float(r[0]) - h.min()) < 1e-12


# ------------------------------------------------------------------ against the exact refit


def _problems(seed, G=6, n=40, d=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(G, n, d))
    nvalid = rng.integers(20, n + 1, size=G)
    K = torch.tensor(np.stack([rbf_kernel(x, x, 2.0) for x in X]))
    mask = torch.tensor(np.arange(n)[None, :] < nvalid[:, None])
    return X, K, mask, nvalid


@pytest.mark.parametrize(
    "iters,tol,dtype,alpha_bound,score_bound",
    [
        (80, None, torch.float32, 2e-3, 2e-3),  # the seed's setting (fp32 finder, 80 steps)
        (400, 1e-7, torch.float64, 1e-3, 1e-3),  # converged finder: only the ridge remains
    ],
)
def test_batched_alpha_vs_exact_refit(iters, tol, dtype, alpha_bound, score_bound, capsys):
    X, K, mask, nvalid = _problems(7)
    C = 0.1
    res = batched_gate(K, C, mask, iters=iters, tol=tol, fista_dtype=dtype)
    max_da, max_ds, same_part = 0.0, 0.0, 0
    rng = np.random.default_rng(0)
    for g in range(K.shape[0]):
        nv = int(nvalid[g])
        x = X[g, :nv]
        alpha, rho = refit(x, C=C, sigma=2.0)
        a = res.alpha[g, :nv].double().numpy()
        max_da = max(max_da, np.abs(a - alpha).max())
        probes = np.concatenate([x, x + 0.1 * rng.normal(size=x.shape)])
        Kp = rbf_kernel(probes, x, 2.0)
        s_exact = 2 * Kp @ alpha - rho
        s_batched = 2 * Kp @ a - float(res.rho[g])
        max_ds = max(max_ds, np.abs(s_exact - s_batched).max())
        S_ex = (alpha > 1e-7) & (alpha < C - 1e-7)
        same_part += int(np.array_equal(S_ex, res.S[g, :nv].numpy()))
    with capsys.disabled():
        print(f"\n[batched vs refit] iters={iters} tol={tol} {dtype}: max|dalpha|={max_da:.3e} "
              f"max|dscore|={max_ds:.3e} exact-partition {same_part}/{K.shape[0]} "
              f"fista_its={res.fista.iterations}")
    assert max_da < alpha_bound
    assert max_ds < score_bound
    assert max_da > 0.0  # the ridge always moves alpha a little: the comparison is real
    assert res.report.max_sum < 1e-6 and res.report.max_padding == 0.0


def test_padding_invariance_and_shared_gram_form():
    X, K, mask, nvalid = _problems(8, G=3, n=30)
    C = 0.1
    g = 0
    nv = int(nvalid[g])
    small = batched_gate(K[g : g + 1, :nv, :nv], C, mask[g : g + 1, :nv], iters=300, tol=1e-9)
    Kpad = K[g : g + 1].clone()
    Kpad[:, nv:, :] = 7.0  # garbage in the padding
    Kpad[:, :, nv:] = 7.0
    padded = batched_gate(Kpad, C, mask[g : g + 1], iters=300, tol=1e-9)
    assert torch.allclose(small.alpha, padded.alpha[:, :nv], atol=1e-10)
    assert torch.all(padded.alpha[:, nv:] == 0)
    assert torch.allclose(small.rho, padded.rho, atol=1e-10)
    # nested prefixes sharing one Gram == separately solved prefixes
    prefixes = [20, 25, 30]
    nested = torch.stack([torch.arange(30) < p for p in prefixes])[None]
    shared = batched_gate(K[1:2], C, nested, iters=300, tol=1e-9)
    for j, p in enumerate(prefixes):
        solo = batched_gate(K[1:2, :p, :p], C, torch.ones(1, p, dtype=torch.bool), iters=300, tol=1e-9)
        assert torch.allclose(shared.alpha[0, j, :p], solo.alpha[0], atol=1e-10)


def test_warmup_rule():
    assert warmup_threshold(0.25) == 6 and warmup_threshold(0.1) == 12 and warmup_threshold(0.3) == 6
    rng = np.random.default_rng(9)
    X = random_keys(rng, 8)
    K = torch.tensor(rbf_kernel(X, X, 2.0))
    mask = torch.stack([torch.arange(8) < 5, torch.arange(8) < 6])
    res = batched_gate(K.expand(2, 8, 8), 0.25, mask, iters=200)
    assert res.warmup.tolist() == [True, False]
    assert torch.allclose(res.alpha[0], torch.tensor([0.2] * 5 + [0.0] * 3, dtype=torch.float64))
    assert torch.isnan(res.rho[0]) and torch.isfinite(res.rho[1])
    alpha, _ = refit(X[:6], C=0.25, sigma=2.0)
    np.testing.assert_allclose(res.alpha[1, :6].numpy(), alpha, atol=5e-3)


def test_validate_alpha_hand_values():
    a = torch.tensor([[0.5, 0.6, -0.1, 0.3]])
    mask = torch.tensor([[True, True, True, False]])
    rep = validate_alpha(a, 0.5, mask)
    assert rep.max_box == pytest.approx(0.1)
    assert rep.max_sum == pytest.approx(0.0, abs=1e-7)  # 0.5 + 0.6 - 0.1 = 1
    assert rep.max_padding == pytest.approx(0.3)
    assert not rep.ok()


def test_fista_early_exit_and_residual():
    X, K, mask, _ = _problems(10)
    a, info = fista_svdd(K, 0.1, mask, iters=500, tol=1e-6, return_info=True)
    assert info.converged and info.iterations < 500
    assert float(info.residual.max()) < 1e-6
    b = fista_svdd(K, 0.1, mask, iters=info.iterations)
    assert torch.allclose(a, b)  # the check does not perturb the iterates


def test_bad_input_raises_typed_errors():
    K = torch.eye(4)[None]
    with pytest.raises(BatchedGateError):
        batched_gate(K, 0.25, torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(BatchedGateError):
        batched_gate(K, -1.0, torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(BatchedGateError):
        fista_svdd(torch.ones(4, 4), 0.5, torch.ones(4, dtype=torch.bool))
    with pytest.raises(BatchedGateError):
        ridged_kkt_solve(K, 0.5, torch.ones(1, 4, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool))


# ------------------------------------------------------------------ fast paths vs references


def test_bordered_spd_solve_hand_example():
    # A = diag(2, 4), s = (1, 1), c = (1; 1, 1): x1 = A^-1 s = (1/2, 1/4), d = 3/4,
    # rho = (s.x2 - c0) / d = (3/4 - 1) / (3/4) = -1/3, a = x2 - rho x1 = (2/3, 1/3)
    from sv_core.batched import bordered_spd_solve

    A = torch.tensor([[[2.0, 0.0], [0.0, 4.0]]], dtype=torch.float64)
    s = torch.ones(1, 2, dtype=torch.float64)
    rho, a = bordered_spd_solve(A, s, torch.tensor([1.0], dtype=torch.float64),
                                torch.ones(1, 2, dtype=torch.float64), torch.tensor([False]))
    assert abs(float(rho[0]) + 1.0 / 3.0) < 1e-15
    assert torch.allclose(a[0], torch.tensor([2.0 / 3.0, 1.0 / 3.0], dtype=torch.float64), atol=1e-15)


def test_bordered_spd_solve_matches_linalg_solve_and_falls_back_when_indefinite():
    from sv_core.batched import bordered_matrix, bordered_spd_solve

    rng = np.random.default_rng(11)
    G, m = 5, 6
    R = rng.normal(size=(G, m, m))
    A = torch.tensor(R @ R.transpose(0, 2, 1) + 0.1 * np.eye(m))
    s = torch.ones(G, m, dtype=torch.float64)
    s[1, 4:] = 0.0  # padded slots: identity rows, zero right-hand side
    A[1, 4:, :] = 0.0
    A[1, :, 4:] = 0.0
    A[1, 4, 4] = A[1, 5, 5] = 1.0
    hc = torch.tensor(rng.normal(size=(G, m))) * s
    c0 = torch.tensor(rng.normal(size=G))
    empty = torch.zeros(G, dtype=torch.bool)
    empty[2] = True
    s[2] = 0.0
    hc[2] = torch.tensor(rng.normal(size=m))
    for AA in (A, A - 30.0 * torch.eye(m, dtype=torch.float64)):  # SPD, then indefinite
        rho, a = bordered_spd_solve(AA, s, c0, hc, empty)
        u = torch.linalg.solve(bordered_matrix(AA, s, empty),
                               torch.cat([c0[:, None], hc], -1).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(rho, u[:, 0], atol=1e-9) and torch.allclose(a, u[:, 1:], atol=1e-9)
    assert float(rho[2]) == float(c0[2])  # empty margin: rho is the given c0


@pytest.mark.parametrize("with_bound", [False, True])
def test_cholesky_kkt_solve_matches_lu_reference_values_and_gradients(with_bound):
    rng = np.random.default_rng(12)
    X0 = rng.normal(size=(3, 30, 3))
    C = 0.1 if with_bound else 0.25
    X = torch.tensor(X0, requires_grad=True)
    mask = torch.stack([torch.arange(30) < p for p in (18, 24, 30)]).expand(3, 3, 30)
    with torch.no_grad():
        a0 = fista_svdd(torch_kernel(X, X, 2.0), C, mask, iters=400, tol=1e-10)
    S, E = partition_masks(a0, C, mask)
    S[0, 0] = False  # one problem with an empty margin set (rho from the KKT interval)
    assert bool(E.any()) == with_bound
    w = torch.tensor(rng.normal(size=(3, 3, 30)))
    out = {}
    for solver in ("lu", "cholesky"):
        K = torch_kernel(X, X, 2.0)
        alpha, rho = ridged_kkt_solve(K, C, S, E, ridge=1e-3, mask=mask, solver=solver)
        (g,) = torch.autograd.grad((alpha * w).sum() + 0.3 * rho.sum(), X)
        out[solver] = (alpha.detach(), rho.detach(), g)
    for ref, fast in zip(out["lu"], out["cholesky"]):
        assert torch.allclose(ref, fast, atol=1e-10, rtol=0)
    assert out["lu"][2].abs().max() > 1e-3  # gradients are really there


def test_cholesky_kkt_solve_gradcheck_float64():
    rng = np.random.default_rng(5)
    X = torch.tensor(random_keys(rng, 9, d=2), requires_grad=True)
    C = 0.25
    with torch.no_grad():
        K0 = torch_kernel(X, X, 2.0)[None]
        a0 = fista_svdd(K0, C, torch.ones(1, 9, dtype=torch.bool), iters=2000, tol=1e-12)
        S, E = partition_masks(a0, C, torch.ones(1, 9, dtype=torch.bool))
    assert S.sum() >= 2

    def f(X):
        return ridged_kkt_solve(torch_kernel(X, X, 2.0)[None], C, S, E, solver="cholesky")

    assert torch.autograd.gradcheck(f, (X,), eps=1e-6, atol=1e-6)


def fista_reference(K, C, mask, iters):
    """Slow, obvious FISTA (001 Algorithm 1): form K y at every step, plain projection."""
    K = K.double()
    m = mask.double()
    diagK = torch.diagonal(K, dim1=-2, dim2=-1).unsqueeze(1)
    L = 2.0 * lambda_max_upper(K, mask, iters=1)  # fista_svdd's step for non-negative K
    a = m / m.sum(-1, keepdim=True)
    y, t = a, 1.0
    for _ in range(iters):
        g = 2.0 * torch.einsum("pij,pkj->pki", K, y) - diagK
        a_new = project_capped_simplex(y - g / L.unsqueeze(-1), C, mask)
        t_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        y = a_new + (t - 1.0) / t_new * (a_new - a)
        a, t = a_new, t_new
    return a


def test_fista_gradient_recurrence_matches_direct_reference():
    X, K, _, _ = _problems(13, G=4, n=30)
    mask = torch.stack([torch.arange(30) < p for p in (15, 22, 30)]).expand(4, 3, 30)
    for iters in (1, 7, 60):
        fast = fista_svdd(K, 0.1, mask, iters=iters)
        ref = fista_reference(K, 0.1, mask, iters)
        assert torch.allclose(fast, ref, atol=1e-11, rtol=0), iters
    with pytest.raises(BatchedGateError):
        fista_svdd(K, 0.1, mask, iters=5, tol=1e-6, check_every=0)
    with pytest.raises(BatchedGateError):
        ridged_kkt_solve(K, 0.1, mask, ~mask, solver="qr")


def test_batched_gate_cholesky_solver_equals_reference():
    X, K, mask, nvalid = _problems(7)
    ref = batched_gate(K, 0.1, mask, iters=80, fista_dtype=torch.float32)
    fast = batched_gate(K, 0.1, mask, iters=80, fista_dtype=torch.float32, kkt_solver="cholesky")
    assert torch.equal(ref.S, fast.S) and torch.equal(ref.E, fast.E)
    assert torch.allclose(ref.alpha, fast.alpha, atol=1e-10)
    assert torch.allclose(ref.rho, fast.rho, atol=1e-10)


# ------------------------------------------------------------------ compiled loops vs the torch references
compiled = pytest.mark.skipif(not __import__("sv_core.batched.common").batched.common.compiled_batch_available(),
                              reason="sv_core._batchfast is not built")


def _nested(seed, G=5, n=40, d=3, scale=1.0):
    """Nested prefixes (the causal layer's problems), one problem with holes (a deletion mask:
    the compiled loop's copy path) and one empty (warm-up) problem."""
    rng = np.random.default_rng(seed)
    X = torch.tensor(rng.normal(size=(G, n, d)) * scale)
    mask = torch.stack([torch.arange(n) < p for p in (0, 10, 25, n)]).expand(G, 4, n).clone()
    mask[1, 3, ::3] = False
    return X, mask


@contextlib.contextmanager
def _threads(k):
    before = torch.get_num_threads()
    torch.set_num_threads(k)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@compiled
@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_compiled_fista_equals_the_torch_reference(dtype, atol):
    from sv_core.batched.fista import _fista_compiled, fista_lipschitz

    for seed, scale in ((21, 1.0), (22, 0.3)):  # spread keys (many zeros), tight keys (many margin keys)
        X, mask = _nested(seed, scale=scale)
        K = torch_kernel(X, X, 2.0).to(dtype)
        for C in (0.1, 0.25):
            ref = fista_svdd(K, C, mask, iters=60, backend="torch")
            fast = fista_svdd(K, C, mask, iters=60, backend="compiled")
            assert torch.allclose(fast, ref, atol=atol, rtol=0), (seed, C)
            assert torch.equal(partition_masks(fast, C, mask)[0], partition_masks(ref, C, mask)[0])
            assert torch.all(fast[~mask] == 0) and torch.all(fast[:, 0] == 0)
            # the loop's own Lipschitz bound is the torch bound (same formula; rounding apart)
            L_ref = fista_lipschitz(K, mask)
            a_own, L_own = _fista_compiled(K, mask, None, C, 60)
            rel = float(((L_own - L_ref).abs() / L_ref).max())
            print(f"compiled Lipschitz bound vs torch ({dtype}): max rel diff {rel:.1e}")
            assert rel <= (1e-12 if dtype == torch.float64 else 1e-5)
            assert torch.equal(a_own, fast)
            # leaving a problem at a bit-for-bit fixed point changes nothing
            for iters in (3, 60, 300):
                assert torch.equal(_fista_compiled(K, mask, L_ref, C, iters, stop_when_fixed=True)[0],
                                   _fista_compiled(K, mask, L_ref, C, iters, stop_when_fixed=False)[0])
            # nor does forming K a' over the iterate's non-zero entries only (the vectorised
            # projection and min / max are lane by lane those of the scalar loops: the sparse and
            # dense products are compared bit for bit, and both with the torch reference above)
            for iters in (1, 7, 60):
                assert torch.equal(_fista_compiled(K, mask, L_ref, C, iters, sparse=True)[0],
                                   _fista_compiled(K, mask, L_ref, C, iters, sparse=False)[0])
            # nor does splitting the batch over threads (problems of different Grams are independent)
            with _threads(3):
                assert torch.equal(fista_svdd(K, C, mask, iters=60, backend="compiled"), fast)
    # a Gram with a negative entry: the loop leaves the bound to the torch reference (Rayleigh, 4 steps)
    Kn = K.clone()
    Kn[0, 1, 2] = Kn[0, 2, 1] = -0.01
    a_n, L_n = _fista_compiled(Kn, mask, None, 0.25, 20)
    assert torch.equal(L_n, fista_lipschitz(Kn, mask))
    assert torch.allclose(a_n, fista_svdd(Kn, 0.25, mask, iters=20, backend="torch"), atol=atol, rtol=0)
    # a non-finite Gram entry: the sparse product would drop inf * 0 = nan, so that block is
    # multiplied in full and the NaN reaches the estimate as in the torch reference
    Ki = K.clone()
    Ki[0, 1, 2] = Ki[0, 2, 1] = float("inf")
    L_fin = fista_lipschitz(K, mask)
    a_i = _fista_compiled(Ki, mask, L_fin, 0.25, 5)[0]
    assert torch.equal(a_i.isnan(), _fista_compiled(Ki, mask, L_fin, 0.25, 5, sparse=False)[0].isnan())
    assert bool(a_i[0].isnan().any()) and not bool(a_i[1:].isnan().any())
    with pytest.raises(BatchedGateError):
        fista_svdd(K, 0.1, mask, iters=5, backend="fortran")


@compiled
@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_compiled_fista_early_exit_stops_where_the_reference_stops(dtype, atol):
    """With ``tol`` the compiled loop runs in segments of ``check_every`` iterations and stops at the
    reference's lockstep checkpoint; segments change no bit of the estimate."""
    from sv_core.batched.fista import _fista_compiled

    for seed, scale in ((21, 1.0), (22, 0.3)):
        X, mask = _nested(seed, scale=scale)
        K = torch_kernel(X, X, 2.0).to(dtype)
        for C, tol, every in ((0.1, 1e-3, 2), (0.25, 1e-4, 2), (0.25, 1e-5, 3), (0.1, 1e-4, 1)):
            ref, ir = fista_svdd(K, C, mask, iters=80, tol=tol, check_every=every, return_info=True, backend="torch")
            fast, ic = fista_svdd(K, C, mask, iters=80, tol=tol, check_every=every, return_info=True,
                                  backend="compiled")
            assert (ic.iterations, ic.converged) == (ir.iterations, ir.converged), (seed, C, tol)
            assert torch.allclose(fast, ref, atol=atol, rtol=0)
            assert torch.allclose(ic.residual, ir.residual, atol=atol, rtol=0)
            assert torch.equal(partition_masks(fast, C, mask)[0], partition_masks(ref, C, mask)[0])
            # the same bits as the one-shot loop run for the same number of iterations, on any thread count
            assert torch.equal(fast, _fista_compiled(K, mask, None, C, ic.iterations)[0])
            with _threads(3):
                assert torch.equal(fista_svdd(K, C, mask, iters=80, tol=tol, check_every=every,
                                              backend="compiled"), fast)
        # tol = 0 never converges: every segment up to iters, bit for bit the one-shot loop
        a0, i0 = fista_svdd(K, 0.25, mask, iters=17, tol=0.0, check_every=4, return_info=True, backend="compiled")
        assert (i0.iterations, i0.converged) == (17, False)
        assert torch.equal(a0, _fista_compiled(K, mask, None, 0.25, 17)[0])
    # a Gram with a negative entry: the Rayleigh bound of the reference, through every segment
    Kn = K.clone()
    Kn[0, 1, 2] = Kn[0, 2, 1] = -0.01
    an, inn = fista_svdd(Kn, 0.25, mask, iters=40, tol=1e-4, return_info=True, backend="compiled")
    ar, irn = fista_svdd(Kn, 0.25, mask, iters=40, tol=1e-4, return_info=True, backend="torch")
    assert inn.iterations == irn.iterations and torch.allclose(an, ar, atol=atol, rtol=0)
    assert torch.equal(inn.lipschitz, irn.lipschitz)
    # a NaN Gram entry: its residual is NaN, so neither loop ever stops early
    Ki = K.clone()
    Ki[0, 1, 2] = Ki[0, 2, 1] = float("nan")
    _, ii = fista_svdd(Ki, 0.25, mask, iters=9, tol=1e-1, return_info=True, backend="compiled")
    _, ir = fista_svdd(Ki, 0.25, mask, iters=9, tol=1e-1, return_info=True, backend="torch")
    assert (ii.iterations, ii.converged) == (ir.iterations, ir.converged) == (9, False)
    # no iteration: the start, no check
    a_z, iz = fista_svdd(K, 0.25, mask, iters=0, tol=1e-4, return_info=True, backend="compiled")
    assert iz.iterations == 0 and torch.equal(a_z, fista_svdd(K, 0.25, mask, iters=0, backend="torch"))


@compiled
@pytest.mark.parametrize("interval", [False, True])
@pytest.mark.parametrize("with_bound", [False, True])
def test_compiled_kkt_solve_equals_the_lu_reference_values_and_gradients(with_bound, interval, monkeypatch):
    """Without an interval problem the compiled solve forms the right-hand side itself (E mode, one
    call each way); with one (no margin key, some valid key) it takes h and c0 from torch."""
    from sv_core.batched import kkt as batched_kkt

    X0, mask = _nested(23)
    C = 0.1 if with_bound else 0.25
    with torch.no_grad():
        a0 = fista_svdd(torch_kernel(X0, X0, 2.0), C, mask, iters=400, tol=1e-10)
    S, E = partition_masks(a0, C, mask)
    if interval:
        S[2, 2] = False  # a problem whose margin set is empty (rho from the KKT interval)
    else:  # every problem with keys gets a margin key (any partition is a valid system)
        for p, j in (mask.any(-1) & ~S.any(-1)).nonzero().tolist():
            i = int(mask[p, j].nonzero()[0])
            S[p, j, i], E[p, j, i] = True, False
    assert bool(S.any()) and (bool(E.any()) or not with_bound)
    w = torch.randn(S.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    modes = []
    real = batched_kkt._CompiledKKT.forward
    monkeypatch.setattr(batched_kkt._CompiledKKT, "forward",
                        staticmethod(lambda ctx, *a: modes.append(len(a) > 5 and a[5] is not None) or real(ctx, *a)))
    out = {}
    for solver in ("lu", "compiled"):
        X = X0.clone().requires_grad_(True)
        alpha, rho = ridged_kkt_solve(torch_kernel(X, X, 2.0), C, S, E, ridge=1e-3, mask=mask, solver=solver)
        (g,) = torch.autograd.grad((alpha * w).sum() + 0.3 * rho.sum(), X)
        out[solver] = (alpha.detach(), rho.detach(), g)
    assert modes == [not interval]
    for ref, fast in zip(out["lu"], out["compiled"]):
        assert torch.allclose(ref, fast, atol=1e-10, rtol=0)
    assert out["lu"][2].abs().max() > 1e-3
    # a margin block that is not positive definite: the whole batch falls back to the reference
    K = torch_kernel(X0, X0, 2.0) - 3.0 * torch.eye(X0.shape[1], dtype=torch.float64)
    a_lu, r_lu = ridged_kkt_solve(K, C, S, E, ridge=1e-3, mask=mask, solver="lu")
    a_c, r_c = ridged_kkt_solve(K, C, S, E, ridge=1e-3, mask=mask, solver="compiled")
    assert torch.equal(a_lu, a_c) and torch.equal(r_lu, r_c)
    with pytest.raises(BatchedGateError):
        ridged_kkt_solve(K.float().to("meta"), C, S, E, solver="compiled")


def test_slot_groups_bound_the_padding():
    from sv_core.batched.kkt import slot_groups

    assert slot_groups([8, 15, 21, 25, 29, 33, 37, 40, 43, 46, 49]) == [[10, 9, 8, 7, 6, 5, 4, 3], [2, 1], [0]]
    assert slot_groups([0, 3, 0, 5, 2, 9]) == [[5, 3], [1, 4], [0, 2]]
    assert slot_groups([]) == []
    sizes = list(np.random.default_rng(0).integers(0, 60, 40))
    for g in slot_groups(sizes):
        assert sizes[g[-1]] * 2 >= sizes[g[0]] and sorted(g, key=lambda j: -sizes[j]) == g
    assert sorted(j for g in slot_groups(sizes) for j in g) == list(range(40))


def test_without_the_compiled_loops_auto_is_the_torch_reference(monkeypatch):
    import sv_core.batched.common as bc

    monkeypatch.setattr(bc, "batchfast", None)  # as on an install without a C compiler
    assert not bc.compiled_batch_available() and not bc.compiled_applicable(torch.zeros(1, 2, 2))
    X, mask = _nested(24)
    K = torch_kernel(X, X, 2.0)
    assert torch.equal(fista_svdd(K, 0.25, mask, iters=30), fista_svdd(K, 0.25, mask, iters=30, backend="torch"))
    S, E = partition_masks(fista_svdd(K, 0.25, mask, iters=30), 0.25, mask)
    a_auto, r_auto = ridged_kkt_solve(K, 0.25, S, E, mask=mask, solver="auto")
    a_ch, r_ch = ridged_kkt_solve(K, 0.25, S, E, mask=mask, solver="cholesky")
    assert torch.equal(a_auto, a_ch) and torch.equal(r_auto, r_ch)
    with pytest.raises(BatchedGateError, match="compiled"):
        fista_svdd(K, 0.25, mask, iters=5, backend="compiled")
    with pytest.raises(BatchedGateError, match="compiled"):
        ridged_kkt_solve(K, 0.25, S, E, solver="compiled")


@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_rbf_gram_equals_torch_kernel_values_and_gradients(dtype, atol):
    """The batch's Gram with its hand-written backward against the reference torch_kernel (autograd)."""
    from sv_core.batched import rbf_gram

    g = torch.Generator().manual_seed(5)
    X0 = torch.randn(3, 2, 9, 4, generator=g, dtype=torch.float64).to(dtype)
    X0[0, 0, 3] = X0[0, 0, 1]  # a duplicate key: D = 0 off the diagonal
    up = torch.randn(3, 2, 9, 9, generator=g, dtype=torch.float64).to(dtype)
    out = []
    for f in (lambda x: torch_kernel(x, x, 1.5), lambda x: rbf_gram(x, 1.5)):
        X = X0.clone().requires_grad_(True)
        K = f(X)
        (gX,) = torch.autograd.grad((K * up).sum(), X)
        out.append((K.detach(), gX))
    dK = float((out[0][0] - out[1][0]).abs().max())
    dg = float((out[0][1] - out[1][1]).abs().max())
    print(f"rbf_gram vs torch_kernel ({dtype}): max |dK| {dK:.1e}, max |dX grad| {dg:.1e}")
    assert dK <= atol and dg <= atol and float(out[0][1].abs().max()) > 0.1
    if dtype == torch.float64:
        X = X0[:1, :1, :5].clone().requires_grad_(True)
        X.data[0, 0, 3] += 0.3  # gradcheck away from the duplicate's kink
        assert torch.autograd.gradcheck(lambda x: rbf_gram(x, 1.5), (X,), eps=1e-6, atol=1e-6)
    with pytest.raises(BatchedGateError):
        rbf_gram(X0, 0.0)
    with pytest.raises(BatchedGateError):
        rbf_gram(torch.zeros(3, dtype=torch.int64), 1.0)
