"""Token-selection policies behind one interface (a KV-cache "press").

A policy scores every key of one context; :func:`select_top_k` turns scores into the kept set.
Every policy in a comparison keeps the same number ``k`` of tokens, so the policies differ only
in *which* tokens they keep (seed 001 §5: "every method retains the same number k of tokens").

Policies
--------
``SupportVectorPolicy``   score = exact SVDD coefficient α from the certified solve :func:`sv_core.solve`
                          at fixed ``C = 1/(ν·n₀)``; at ``k = |S∪E|`` the kept set is exactly the
                          support set.
``DensityPolicy``         H2O-style density proxy: RBF Gram column sums with the diagonal zeroed
                          (higher = denser = kept).
``OracleAttentionPolicy`` H2O oracle: total normalised RBF attention mass the *evaluation
                          queries* put on each key (needs ``queries``).
``RecencyPolicy``         keeps the last ``k`` tokens (score = position).
``RandomPolicy``          keeps ``k`` tokens uniformly at random without replacement.

The strongest published peers (ridge / kernel leverage, KeyDiff, SnapKV, TOVA) live in
:mod:`evaluation.peers` and are registered here: ``get_policy("keydiff")`` etc.

Tie-breaking is deterministic: equal scores are ordered by ascending index (earlier token wins).

Each fast path has a slow, obvious ``*_reference`` implementation beside it for tests.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from evaluation.errors import PolicyError, UnknownPolicyError
from evaluation.peers import PEER_POLICIES
from evaluation.policy_base import (
    SelectionPolicy,
    as_keys,
    check_sigma,
    gram_row_blocks,
    rbf,
    select_top_k,
    select_top_k_reference,
)

__all__ = [
    "SelectionPolicy",
    "SupportVectorPolicy",
    "DensityPolicy",
    "OracleAttentionPolicy",
    "RecencyPolicy",
    "RandomPolicy",
    "select_top_k",
    "select_top_k_reference",
    "density_scores_reference",
    "oracle_scores_reference",
    "get_policy",
    "available_policies",
]





class SupportVectorPolicy(SelectionPolicy):
    """Keep the support set: score = exact fixed-C SVDD coefficient α.

    ``C = 1/(ν·n₀)`` is calibrated once from the declared size ``n₀`` (default: the context's
    own length ``n``). α comes from :func:`sv_core.solve`, the certified fp64 solve (SMO to find
    the partition, the bordered KKT system on the margin set, every KKT condition checked on the
    exactly recomputed gradient; its certificate is kept in ``last_certificate``), so with
    ``k = support_size(keys)`` the kept set is exactly ``{i : α_i > tol}``. The independent refit
    (:func:`sv_core.refit`) stays the audit oracle. The policy never inspects queries.

    Parameters
    ----------
    nu : float in (0, 1]
    sigma : float > 0
        RBF bandwidth (``κ = exp(-‖a-b‖²/σ²)``).
    n0 : int, optional
        Declared calibration size; ``None`` means "use n of each context".
    tol : float
        Coefficients ``α_i <= tol`` count as reserve (α = 0).
    """

    name = "sv"

    def __init__(self, nu: float, sigma: float, n0: int | None = None, tol: float = 1e-10) -> None:
        if not isinstance(nu, (int, float, np.floating)) or not (0.0 < float(nu) <= 1.0):
            raise PolicyError(f"nu must lie in (0, 1]; got {nu!r}")
        if n0 is not None and (isinstance(n0, bool) or not isinstance(n0, (int, np.integer)) or n0 < 1):
            raise PolicyError(f"n0 must be a positive integer or None; got {n0!r}")
        if not (isinstance(tol, (int, float)) and tol >= 0):
            raise PolicyError(f"tol must be a non-negative number; got {tol!r}")
        self.nu = float(nu)
        self.sigma = check_sigma(sigma)
        self.n0 = None if n0 is None else int(n0)
        self.tol = float(tol)
        self._cache: tuple[bytes, np.ndarray] | None = None
        #: the :class:`sv_core.SolveCertificate` of the last solve (None before the first)
        self.last_certificate: Any = None

    def _params(self) -> dict[str, Any]:
        return {"nu": self.nu, "sigma": self.sigma, "n0": self.n0}

    def box_C(self, n: int) -> float:
        """The fixed box constant for a context of ``n`` keys (checks feasibility ``n·C >= 1``)."""
        from sv_core import calibrate_C

        n0 = n if self.n0 is None else self.n0
        C = float(calibrate_C(nu=self.nu, n0=n0))
        if n * C < 1.0 - 1e-12:
            raise PolicyError(
                f"infeasible SVDD box: n*C = {n}*{C:.6g} = {n * C:.6g} < 1 "
                f"(declared n0={n0}, nu={self.nu}); use more keys or a larger n0*nu"
            )
        return C

    def alpha(self, keys: Any) -> np.ndarray:
        """Exact coefficients α of shape (n,) (cached for the last key matrix seen)."""
        X = as_keys(keys)
        digest = hashlib.sha256(np.ascontiguousarray(X).tobytes() + repr(X.shape).encode()).digest()
        if self._cache is not None and self._cache[0] == digest:
            return self._cache[1].copy()
        from sv_core import solve

        C = self.box_C(X.shape[0])
        sol = solve(X, C=C, sigma=self.sigma)
        self.last_certificate = sol.certificate
        alpha = np.asarray(sol.alpha, dtype=np.float64).reshape(-1)
        if alpha.shape != (X.shape[0],):
            raise PolicyError(f"solve returned alpha of shape {alpha.shape}, expected ({X.shape[0]},)")
        self._cache = (digest, alpha.copy())
        return alpha

    def support_size(self, keys: Any) -> int:
        """``|S ∪ E| = #{i : α_i > tol}`` — the budget at which top-k equals the support set."""
        return int(np.count_nonzero(self.alpha(keys) > self.tol))

    def score(self, keys: Any, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        return self.alpha(keys)


class DensityPolicy(SelectionPolicy):
    """H2O-style density proxy: ``score_j = Σ_{i≠j} κ(x_i, x_j)`` (Gram column sums, diagonal zeroed)."""

    name = "density"

    def __init__(self, sigma: float) -> None:
        self.sigma = check_sigma(sigma)

    def _params(self) -> dict[str, Any]:
        return {"sigma": self.sigma}

    def score(self, keys: Any, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        X = as_keys(keys)
        n = X.shape[0]
        out = np.zeros(n)
        # the column sums row by row, in row order (the order of K.sum(axis=0)), from row blocks
        # of K (gram_row_blocks): never the n x n matrix; the diagonal is zeroed first
        # (subtracting κ(x,x)=1 after summing loses tiny sums)
        for r0, r1, B in gram_row_blocks(X, self.sigma):
            B[np.arange(r1 - r0), np.arange(r0, r1)] = 0.0
            if r1 - r0 == n:
                return B.sum(axis=0)
            for row in B:
                out += row
        return out


def density_scores_reference(keys: Any, sigma: float) -> np.ndarray:
    """Slow reference for :class:`DensityPolicy` (double loop over pairs, explicit formula)."""
    X = as_keys(keys)
    sigma = check_sigma(sigma)
    n = X.shape[0]
    out = np.zeros(n)
    for j in range(n):
        for i in range(n):
            if i != j:
                out[j] += math.exp(-float(np.sum((X[i] - X[j]) ** 2)) / sigma**2)
    return out


class OracleAttentionPolicy(SelectionPolicy):
    """H2O oracle: attention mass of the evaluation queries under the uniform RBF readout.

    ``score_i = Σ_q κ(q, x_i) / Σ_j κ(q, x_j)``. A query whose kernel row is all zero (too far
    from every key) carries no mass and contributes nothing.
    """

    name = "oracle"
    requires_queries = True

    def __init__(self, sigma: float) -> None:
        self.sigma = check_sigma(sigma)

    def _params(self) -> dict[str, Any]:
        return {"sigma": self.sigma}

    def score(self, keys: Any, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        X = as_keys(keys)
        if queries is None:
            raise PolicyError("OracleAttentionPolicy needs the evaluation queries (queries=...)")
        Q = as_keys(queries, "queries")
        if Q.shape[1] != X.shape[1]:
            raise PolicyError(f"queries have d={Q.shape[1]} but keys have d={X.shape[1]}")
        W = np.asarray(rbf()(Q, X, self.sigma), dtype=np.float64)  # (m, n)
        row = W.sum(axis=1, keepdims=True)
        W = np.divide(W, row, out=np.zeros_like(W), where=row > 0)
        return W.sum(axis=0)


def oracle_scores_reference(keys: Any, queries: Any, sigma: float) -> np.ndarray:
    """Slow reference for :class:`OracleAttentionPolicy` (loops, explicit kernel)."""
    X = as_keys(keys)
    Q = as_keys(queries, "queries")
    sigma = check_sigma(sigma)
    out = np.zeros(X.shape[0])
    for q in Q:
        w = [math.exp(-float(np.sum((q - x) ** 2)) / sigma**2) for x in X]
        tot = sum(w)
        if tot > 0:
            for i, wi in enumerate(w):
                out[i] += wi / tot
    return out


class RecencyPolicy(SelectionPolicy):
    """Keep the most recent tokens: ``score_i = i`` (keys are in temporal order)."""

    name = "recency"

    def score(self, keys: Any, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        X = as_keys(keys)
        return np.arange(X.shape[0], dtype=np.float64)


class RandomPolicy(SelectionPolicy):
    """Uniform random subset without replacement: i.i.d. U(0,1) scores, top-k.

    With ``rng`` given, the scores are drawn from it (so a study can thread one generator
    through many contexts); otherwise from ``numpy.random.default_rng(seed)`` afresh, which makes
    repeated calls on equal-length contexts identical.
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise PolicyError(f"seed must be an integer; got {seed!r}")
        self.seed = int(seed)

    def _params(self) -> dict[str, Any]:
        return {"seed": self.seed}

    def score(self, keys: Any, *, rng: np.random.Generator | None = None, queries: Any = None) -> np.ndarray:
        X = as_keys(keys)
        gen = rng if rng is not None else np.random.default_rng(self.seed)
        if not isinstance(gen, np.random.Generator):
            raise PolicyError(f"rng must be a numpy.random.Generator; got {type(gen).__name__}")
        return gen.random(X.shape[0])


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------
_REGISTRY: dict[str, type[SelectionPolicy]] = {
    "sv": SupportVectorPolicy,
    "density": DensityPolicy,
    "oracle": OracleAttentionPolicy,
    "recency": RecencyPolicy,
    "random": RandomPolicy,
}
_ALIASES = {
    "support_vector": "sv",
    "h2o": "density",
    "h2o_density": "density",
    "h2o_oracle": "oracle",
}


def _registry() -> dict[str, type[SelectionPolicy]]:
    """Built-in policies plus the peers of :mod:`evaluation.peers`."""
    return {**_REGISTRY, **PEER_POLICIES}


def available_policies() -> list[str]:
    """Registered canonical policy names."""
    return sorted(_registry())


def get_policy(name: str, **kwargs: Any) -> SelectionPolicy:
    """Instantiate a policy by name (``sv``, ``density``, ``oracle``, ``recency``, ``random``, and the
    peers ``leverage``, ``kernel_leverage``, ``keydiff``, ``snapkv``, ``tova``; aliases ``support_vector``,
    ``h2o``/``h2o_density``, ``h2o_oracle``).

    Raises
    ------
    UnknownPolicyError
        Unknown name.
    PolicyError
        Keyword arguments that the policy does not accept or that are invalid.
    """
    if not isinstance(name, str):
        raise UnknownPolicyError(f"policy name must be a string; got {name!r}")
    key = _ALIASES.get(name.lower(), name.lower())
    registry = _registry()
    if key not in registry:
        raise UnknownPolicyError(f"unknown policy {name!r}; available: {', '.join(available_policies())}")
    cls = registry[key]
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise PolicyError(f"bad arguments for policy {key!r}: {exc}") from None
