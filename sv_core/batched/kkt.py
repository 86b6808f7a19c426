"""Ridged bordered KKT solve of the batched SVDD gate (:mod:`sv_core.batched`), differentiable:
the reference (full bordered matrix, ``torch.linalg.solve``) and the Schur-complement Cholesky
path with an analytic backward."""
from __future__ import annotations

import numpy as np
import torch

from sv_core.batched import common as batched_common
from sv_core.batched.common import BatchedGateError, any_true, as_problems, check_box, compiled_applicable, kmul

# --------------------------------------------------------------------------------------------
# ridged bordered KKT solve (differentiable)
# --------------------------------------------------------------------------------------------


KKT_SOLVERS = ("lu", "cholesky", "compiled", "auto")


def bordered_matrix(A: torch.Tensor, s: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
    """The full bordered matrix ``[[empty, s^T], [s, A]]`` of shape (..., m+1, m+1).

    ``empty`` puts a 1 in the corner of problems without a margin set, so that their system
    reads ``rho = c0`` (the reference formulation of `ridged_kkt_solve`).
    """
    top = torch.cat([empty.to(A.dtype).unsqueeze(-1), s], dim=-1).unsqueeze(-2)
    lower = torch.cat([s.unsqueeze(-1), A], dim=-1)
    return torch.cat([top, lower], dim=-2)


def _schur_solve(L, x1, d, s, empty, r0, rhs):
    """Solve ``[[empty, s^T], [s, A]] [r; y] = [r0; rhs]`` given ``A = L L^T``, ``x1 = A^{-1} s``
    and ``d = s^T x1`` (Schur complement ``-d`` of the zero corner):
    ``r = (s^T A^{-1} rhs - r0) / d``, ``y = A^{-1} rhs - r x1``; empty problems: ``r = r0``."""
    x2 = torch.cholesky_solve(rhs.unsqueeze(-1), L).squeeze(-1)
    r = torch.where(empty, r0, ((s * x2).sum(-1) - r0) / torch.where(empty, torch.ones_like(d), d))
    return r, x2 - r.unsqueeze(-1) * x1


class _BorderedSPDSolve(torch.autograd.Function):
    """Autograd wrapper of the Schur-complement solve (see `bordered_spd_solve`).

    The bordered matrix M is symmetric, so with ``u = M^{-1} c`` and upstream gradient
    ``g_u``: ``g_c = M^{-1} g_u`` (one more Cholesky solve with the saved factor) and
    ``g_M = -g_c u^T``, whose margin block is ``g_A = -g_alpha alpha^T``. The border (``s``,
    ``empty``) is constant.
    """

    @staticmethod
    def forward(ctx, A, L, s, c0, hc, empty):
        x1 = torch.cholesky_solve(s.unsqueeze(-1), L).squeeze(-1)
        d = (s * x1).sum(-1)
        rho, a = _schur_solve(L, x1, d, s, empty, c0, hc)
        ctx.save_for_backward(L, x1, d, s, empty, a)
        return rho, a

    @staticmethod
    def backward(ctx, g_rho, g_a):
        L, x1, d, s, empty, a = ctx.saved_tensors
        if g_rho is None:
            g_rho = torch.zeros_like(d)
        if g_a is None:
            g_a = torch.zeros_like(a)
        g_c0, g_hc = _schur_solve(L, x1, d, s, empty, g_rho, g_a)
        g_A = (-g_hc).unsqueeze(-1) * a.unsqueeze(-2) if ctx.needs_input_grad[0] else None
        return g_A, None, None, g_c0, g_hc, None


def bordered_spd_solve(
    A: torch.Tensor, s: torch.Tensor, c0: torch.Tensor, hc: torch.Tensor, empty: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve ``[[e, s^T], [s, A]] [rho; a] = [c0; hc]`` for SPD A by the Schur complement.

    Mathematically identical to ``torch.linalg.solve(bordered_matrix(A, s, empty), [c0; hc])``
    (the reference of `ridged_kkt_solve`): with ``A = L L^T`` (batched Cholesky),
    ``x1 = A^{-1} s``, ``x2 = A^{-1} hc``::

        rho = (s^T x2 - c0) / (s^T x1),   a = x2 - rho x1          (e = 0, s != 0)
        rho = c0,                         a = A^{-1} hc             (e = 1, empty margin)

    One Cholesky factorisation (m^3/3 flops against 2 m^3/3 for LU of the bordered matrix) and
    an analytic backward that reuses the factor. Problems whose A is not numerically positive
    definite make the whole batch fall back to the reference LU solve (autograd through
    ``torch.linalg.solve``).

    Parameters
    ----------
    A : tensor (..., m, m), symmetric positive definite (padding rows/columns: identity).
    s : tensor (..., m), 1 on margin slots, 0 on padding.
    c0 : tensor (...), first right-hand side entry.
    hc : tensor (..., m), remaining right-hand side (0 on padding).
    empty : bool tensor (...), problems without margin slots (``s == 0``).

    Returns
    -------
    rho : tensor (...)
    a : tensor (..., m)
    """
    L, info = torch.linalg.cholesky_ex(A.detach())
    if bool((info != 0).any()):
        M = bordered_matrix(A, s, empty)
        c = torch.cat([c0.unsqueeze(-1), hc], dim=-1).unsqueeze(-1)
        u = torch.linalg.solve(M, c).squeeze(-1)
        return u[..., 0], u[..., 1:]
    return _BorderedSPDSolve.apply(A, L, s, c0, hc, empty)


def _pack_margin(S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Indices of the margin slots packed to the front (padded to m = max |S|), their validity
    mask and m. S : bool (..., n) -> order (..., m) long, sb (..., m) bool."""
    m = int(S.sum(-1).max()) if S.numel() else 0
    order = torch.argsort((~S).to(torch.int8), dim=-1, stable=True)[..., :m]
    return order, S.gather(-1, order), m


def _packed_solve_lu(K, S, h, c0, empty, ridge):
    """Reference: gather K_SS row- then column-wise for every (P, J) problem, build the full
    bordered matrix and call ``torch.linalg.solve`` (autograd through everything)."""
    P, J, n = S.shape
    dt = K.dtype
    order, sb, m = _pack_margin(S)  # (P, J, m)
    s = sb.to(dt)
    hc = h.gather(-1, order) * s
    pair = sb.unsqueeze(-1) & sb.unsqueeze(-2)
    rows = torch.gather(
        K.unsqueeze(1).expand(P, J, n, n), 2, order.unsqueeze(-1).expand(P, J, m, n)
    )
    Kc = torch.gather(rows, 3, order.unsqueeze(-2).expand(P, J, m, m))  # (P, J, m, m)
    block = (2.0 * Kc).masked_fill(~pair, 0.0) + torch.diag_embed(ridge * s + (1.0 - s))
    M = bordered_matrix(block, s, empty)  # (P, J, m+1, m+1)
    c = torch.cat([c0.unsqueeze(-1), hc], dim=-1).unsqueeze(-1)  # (P, J, m+1, 1)
    u = torch.linalg.solve(M, c).squeeze(-1)
    alpha = torch.zeros(P, J, n, dtype=dt, device=K.device).scatter(-1, order, u[..., 1:] * s)
    return alpha, u[..., 0]


def _packed_solve_cholesky(K, S, h, c0, empty, ridge):
    """Fast path for a group of problem slots: S, h (P, Jb, n), c0, empty (P, Jb). One flat gather
    of every K_SS (its backward is a single scatter_add into (P, n*n)), then `bordered_spd_solve`."""
    P, Jb, n = S.shape
    dt = K.dtype
    order, sb, m = _pack_margin(S)  # (P, Jb, m)
    if m == 0:
        return torch.zeros(P, Jb, n, dtype=dt, device=K.device), c0
    s = sb.to(dt)
    hc = h.gather(-1, order) * s
    flat_idx = (order.unsqueeze(-1) * n + order.unsqueeze(-2)).reshape(P, Jb * m * m)
    Kc = K.reshape(P, n * n).gather(1, flat_idx).view(P, Jb, m, m)
    A = Kc * ((2.0 * s).unsqueeze(-1) * s.unsqueeze(-2))  # 2 K_SS, zero on padded pairs
    A.diagonal(dim1=-2, dim2=-1).add_(ridge * s + (1.0 - s))
    rho, a_packed = bordered_spd_solve(A, s, c0, hc, empty)
    alpha = torch.zeros(P, Jb, n, dtype=dt, device=K.device).scatter(-1, order, a_packed * s)
    return alpha, rho


def slot_groups(sizes: list[int]) -> list[list[int]]:
    """Problem slots grouped for the padded Cholesky solves: slots sorted by their largest margin
    set ``sizes[j]`` (descending), a new group whenever a slot's size is below half of its group's
    first — so padding costs at most 8x the flops of a slot's own solve — and empty slots last."""
    order = sorted(range(len(sizes)), key=lambda j: -sizes[j])
    groups: list[list[int]] = []
    for j in order:
        if groups and (2 * sizes[j] >= sizes[groups[-1][0]] or sizes[j] == 0 == sizes[groups[-1][-1]]):
            groups[-1].append(j)
        else:
            groups.append([j])
    return groups


def needs_interval_rho(S: torch.Tensor, mask: torch.Tensor | None = None) -> bool:
    """Some problem (S (P, J, n) margin masks) has a valid key (``mask``; None: every slot, n > 0) but
    no margin key: its rho comes from its KKT interval, which the compiled solve does not form
    (counts, not bool reductions: see `any_true`)."""
    empty = S.sum(-1) == 0
    if mask is None:
        return S.shape[-1] > 0 and any_true(empty)
    return any_true((mask.sum(-1) > 0) & empty)


class FactorFailed(Exception):
    """A margin block was not numerically positive definite in the compiled solve (`compiled_kkt_forward`);
    callers then solve the batch by the reference."""


def compiled_kkt_forward(K: torch.Tensor, S: torch.Tensor, ridge: float, E: torch.Tensor | None = None,
                         C: float | None = None, h: torch.Tensor | None = None, c0: torch.Tensor | None = None):
    """The ridged bordered solve of every (P, J) problem in ``sv_core._batchfast``, without autograd:
    ``(alpha (P, J, n), rho (P, J), state)``; ``state`` is what `compiled_kkt_backward` takes. With
    ``E`` and ``C`` (and no ``h``, ``c0``) the right-hand side is formed in the loop (see
    `_CompiledKKT`). Raises :class:`FactorFailed` when a factorisation fails."""
    ext = batched_common.batchfast
    assert ext is not None
    P, J, n = S.shape
    dt = K.dtype
    Sk = S.to(torch.uint8).contiguous()
    Ek = E.to(torch.uint8).contiguous() if E is not None else torch.empty(0, dtype=torch.uint8)
    none = torch.empty(0, dtype=dt)
    m = Sk.sum(-1, dtype=torch.int64).reshape(-1).numpy().astype(np.intp)
    off = np.empty((P * J, 2), dtype=np.intp)
    off[:, 0] = np.cumsum(m * m) - m * m
    off[:, 1] = np.cumsum(m) - m
    Lst = torch.empty(int((m * m).sum()) + 1, dtype=dt)
    x1st = torch.empty(int(m.sum()) + 1, dtype=dt)
    dst = torch.empty(P * J, dtype=dt)
    alpha = torch.empty(P, J, n, dtype=dt)
    rho = torch.empty(P, J, dtype=dt)
    hh = none if h is None else h.detach().contiguous()
    cc = none if c0 is None else c0.detach().contiguous()
    code = ext.kkt_forward(K.detach().contiguous().numpy(), Sk.numpy(), Ek.numpy(), float(C or 0.0), hh.numpy(),
                           cc.numpy(), alpha.numpy(), rho.numpy(), Lst.numpy(), x1st.numpy(), dst.numpy(), off, P,
                           J, n, float(ridge), dt == torch.float64, batched_common.compiled_threads())
    if code:
        raise FactorFailed
    return alpha, rho, (Sk, Ek, float(C or 0.0), Lst, x1st, dst, off, P, J, n)


def compiled_kkt_backward(state: tuple, alpha: torch.Tensor, g_alpha: torch.Tensor | None,
                          g_rho: torch.Tensor | None, need_K: bool = True):
    """The backward of `compiled_kkt_forward` from its ``state`` and ``alpha``: ``(gK (P, n, n) or None,
    gh (P, J, n) or None, gc0 (P, J) or None)`` - ``gK`` when ``need_K`` (always, with the bound masks
    given: their part of the right-hand side is in it), ``gh`` and ``gc0`` when ``h`` and ``c0`` were given."""
    ext = batched_common.batchfast
    assert ext is not None
    Sk, Ek, C, Lst, x1st, dst, off, P, J, n = state
    dt = alpha.dtype
    emode = Ek.numel() > 0
    ga = torch.zeros_like(alpha) if g_alpha is None else g_alpha.to(dt).contiguous()
    gr = torch.zeros(P, J, dtype=dt) if g_rho is None else g_rho.to(dt).contiguous()
    gK = torch.zeros(P, n, n, dtype=dt) if need_K else None
    if emode and gK is None:
        return None, None, None
    gh = torch.empty(0 if emode else P * J * n, dtype=dt)
    gc0 = torch.empty(0 if emode else P * J, dtype=dt)
    ext.kkt_backward(Sk.numpy(), Ek.numpy(), C, alpha.numpy(), ga.numpy(), gr.numpy(), Lst.numpy(), x1st.numpy(),
                     dst.numpy(), off, gh.numpy(), gc0.numpy(), None if gK is None else gK.numpy(), P, J, n,
                     dt == torch.float64, batched_common.compiled_threads())
    if emode:
        return gK, None, None
    return gK, gh.view(P, J, n), gc0.view(P, J)


class _CompiledKKT(torch.autograd.Function):
    """The ridged bordered solve of every (P, J) problem by ``sv_core._batchfast`` (one Cholesky
    factor per problem on its own margin keys, kept for the backward); same system and gradients
    as `_packed_solve_cholesky` / `_packed_solve_lu`. With ``E`` (bound masks) and ``h = c0 = None``
    the right-hand side ``h_S = diag(K)_S - 2 C K_SE 1``, ``c0 = 1 - C |E|`` and ``alpha_E = C`` are
    formed in the loop and the backward adds their part of ``dL/dK`` (``dL/dK_ii += g_h_i``,
    ``dL/dK_ie -= 2 C g_h_i``) - what autograd of the reference's right-hand side gives - so the
    whole solve is one call each way; problems without margin keys then get ``rho = 0`` (the
    caller sends only those without any valid key). Raises `FactorFailed` when a factorisation
    fails (the caller then solves the batch by the reference). The loops: `compiled_kkt_forward`,
    `compiled_kkt_backward`."""

    @staticmethod
    def forward(ctx, K, h, c0, S, ridge, E=None, C=None):
        alpha, rho, ctx.state = compiled_kkt_forward(K, S, ridge, E, C, h, c0)
        ctx.save_for_backward(alpha)
        return alpha, rho

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_alpha, g_rho):
        (alpha,) = ctx.saved_tensors
        gK, gh, gc0 = compiled_kkt_backward(ctx.state, alpha, g_alpha, g_rho, ctx.needs_input_grad[0])
        return gK, gh, gc0, None, None, None, None


def ridged_kkt_solve(
    K: torch.Tensor,
    C: float,
    S_mask: torch.Tensor,
    E_mask: torch.Tensor,
    ridge: float = 1e-3,
    mask: torch.Tensor | None = None,
    solver: str = "lu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve the bordered KKT systems of fixed partitions (SPEC §1, 001 eq. 7), autograd-ready.

    For each problem with margin set S and bound set E::

        M~ = [[0, 1_S^T], [1_S, 2 K_SS + ridge I_S]],   u = [rho; alpha_S],
        c  = [1 - |E| C;  diag(K)_S - 2 C K_SE 1]

    The margin indices of every problem are packed to the front and all systems padded to the
    largest |S| (padding rows are identity, ``u = 0``), so the whole batch is one
    ``torch.linalg.solve`` call of size ``max|S| + 1``; autograd differentiates the solve, the
    gathers and the scatter back. (The "cholesky" path pads per group of problem slots j of
    similar ``max_p |S_pj|`` instead, `slot_groups`.) A problem with empty S cannot fix rho
    from the system; rho is then the midpoint of its KKT interval ``[max_R h_i, min_E h_i]``
    with ``h_i = K_ii - 2 C (K_{:,E} 1)_i``, also differentiable.

    Parameters
    ----------
    K : tensor (P, n, n)
    C : float box
    S_mask, E_mask : disjoint bool tensors (P, n) or (P, J, n).
    ridge : float, added to the margin diagonal (1e-3 in the seed).
    mask : optional bool tensor like S_mask, the valid keys; only used to pick the reserve set
        of empty-S problems (default: every slot outside S and E).
    solver : "lu" (default, the SPEC reference: the full bordered matrix through
        ``torch.linalg.solve``) or "cholesky" (fast path, same system: the Schur complement of
        the SPD margin block ``A = 2 K_SS + ridge I`` solved by batched Cholesky, with an
        analytic backward - see `bordered_spd_solve`; problems whose Cholesky fails fall back to
        the reference solve), "compiled" (``sv_core._batchfast``: one Cholesky factor per problem
        on its own margin keys, kept for an analytic backward; CPU float32/float64 only; a failed
        factorisation solves the whole batch by the reference) or "auto" (compiled when built and
        applicable, else "cholesky").

    Returns
    -------
    alpha : tensor shaped like S_mask: C on E, the solved alpha_S on S, 0 elsewhere.
    rho : tensor S_mask.shape[:-1]
    """
    if solver not in KKT_SOLVERS:
        raise BatchedGateError(f"solver must be one of {KKT_SOLVERS}, got {solver!r}")
    if solver == "compiled" and not compiled_applicable(K):
        raise BatchedGateError("the compiled KKT solve needs sv_core._batchfast built and a CPU float32/float64 K")
    S, flat = as_problems(K, S_mask)
    E, _ = as_problems(K, E_mask)
    if S.shape != E.shape:
        raise BatchedGateError("S_mask and E_mask must have the same shape")
    if any_true(S & E):
        raise BatchedGateError("S_mask and E_mask must be disjoint")
    C = check_box(C)
    P, J, n = S.shape
    dt = K.dtype
    if solver in ("compiled", "auto") and compiled_applicable(K):
        # one compiled call each way when no problem needs the KKT-interval rho (no margin key but
        # some valid key); the right-hand side is formed in the loop
        valid = as_problems(K, mask)[0] if mask is not None else None
        if not needs_interval_rho(S, valid):
            try:
                alpha, rho = _CompiledKKT.apply(K, None, None, S, float(ridge), E, C)
                return (alpha.squeeze(1), rho.squeeze(1)) if flat else (alpha, rho)
            except FactorFailed:
                pass
    e = E.to(dt)
    diagK = torch.diagonal(K, dim1=-2, dim2=-1).unsqueeze(1)  # (P, 1, n)
    has_E = bool(E.any())
    h = diagK - 2.0 * C * kmul(K, e) if has_E else diagK.expand(P, J, n)  # (P, J, n)
    nE = e.sum(-1)
    empty = ~S.any(-1)

    # rho fallback for problems with empty S (value used only where empty is True).
    if bool(empty.any()):
        big = torch.finfo(dt).max / 8
        R = ~S & ~E
        if mask is not None:
            R = R & as_problems(K, mask)[0]
        lowR = torch.where(R, h, torch.full_like(h, -big)).amax(-1)
        upE = torch.where(E, h, torch.full_like(h, big)).amin(-1)
        lowR_ok, upE_ok = lowR > -big / 2, upE < big / 2
        rho_fb = torch.where(
            lowR_ok & upE_ok,
            0.5 * (lowR + upE),
            torch.where(upE_ok, upE, torch.where(lowR_ok, lowR, torch.zeros_like(lowR))),
        )
        c0 = torch.where(empty, rho_fb, 1.0 - C * nE)
    else:
        c0 = 1.0 - C * nE

    if solver in ("compiled", "auto") and compiled_applicable(K):
        try:
            alpha, rho = _CompiledKKT.apply(K, h, c0, S, float(ridge))
        except FactorFailed:
            alpha, rho = _packed_solve_lu(K, S, h, c0, empty, ridge)
    elif solver == "lu":
        alpha, rho = _packed_solve_lu(K, S, h, c0, empty, ridge)
    else:
        # nested prefixes have very different |S|: padding every slot to the global max |S| would
        # waste up to (m / m_j)^3 of the work, one solve per slot costs a call each; slots of
        # similar size share one solve (`slot_groups`)
        groups = slot_groups(S.sum(-1).amax(0).tolist())
        out = []
        for js in groups:
            ix = torch.tensor(js, device=K.device)
            out.append(_packed_solve_cholesky(K, S[:, ix], h[:, ix], c0[:, ix], empty[:, ix], ridge))
        inv = torch.empty(J, dtype=torch.long, device=K.device)
        inv[torch.tensor([j for js in groups for j in js], device=K.device)] = torch.arange(J, device=K.device)
        alpha = torch.cat([o[0] for o in out], dim=1).index_select(1, inv)
        rho = torch.cat([o[1] for o in out], dim=1).index_select(1, inv)
    if has_E:
        alpha = alpha + C * e
    if flat:
        return alpha.squeeze(1), rho.squeeze(1)
    return alpha, rho
