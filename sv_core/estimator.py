"""scikit-learn estimator over the fixed-C gate: :class:`SVDDGate`.

``SVDDGate`` is an ``OutlierMixin, BaseEstimator`` that composes the public :class:`sv_core.Gate`
API. ``fit`` calibrates ``C = 1 / (nu * n_samples)`` once; ``partial_fit`` admits more samples
by exact C&P increments at that same C; ``forget`` deletes samples by C&P decrements and returns
their receipts; ``evict_reserve`` drops certified-inert samples.

Score conventions (derived from the solver's KKT conditions, RBF kernel so ``k(x, x) = 1``)::

    gate score      s(x)  = 2 sum_i a_i k(x, x_i) - rho            (Gate.score, the paper's score)
    KKT gradient    g_i   = rho - 1 + 2 sum_j a_j k(x_i, x_j)       (margin: g_i = 0)

so on the margin set ``2 sum_j a_j k(x_i, x_j) = 1 - rho`` and the boundary is ``s(x) = 1 - 2 rho``,
not ``s(x) = 0``. The estimator therefore reports::

    score_samples(x)     = sum_i a_i k(x, x_i)          = (s(x) + rho) / 2
    offset_              = (1 - rho) / 2
    decision_function(x) = score_samples(x) - offset_   = (s(x) - (1 - 2 rho)) / 2
                         = (R^2 - ||phi(x) - c||^2) / 2

``decision_function`` is zero on the boundary, positive inside the ball (inliers), negative
outside; ``predict`` is ``+1`` where ``decision_function >= 0`` (a boundary tie is an inlier)
and ``-1`` elsewhere. For the RBF kernel the SVDD dual equals libsvm's one-class SVM dual, so with
``C = 1 / (nu n)`` and ``gamma = 1 / sigma**2``::

    OneClassSVM(nu=nu, gamma=1/sigma**2).decision_function(x) = nu * n * SVDDGate.decision_function(x)
    OneClassSVM.dual_coef_ = nu * n * SVDDGate.dual_coef_,  OneClassSVM.offset_ = nu * n * offset_

up to libsvm's tolerance (``tol=1e-3`` by default).
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, OutlierMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from .calibrate import calibrate_C, warmup_size
from .errors import InvalidKeysError, InvalidParameterError, UnknownTokenError
from .gate import Gate
from .receipts import Certificate, Receipt

#: |decision_function| at or below this is a boundary tie, reported as exactly 0 (an inlier). Margin
#: samples sit on the boundary in exact arithmetic; in fp64 their score is off by ~1e-16, with a
#: sign that depends on BLAS blocking (so on the batch size). decision_function lies in [-1, 1].
TIE_TOL = 1e-12

#: fewest samples a fit can solve: the gate needs ``ceil(1/C) + 2`` keys and ``C <= 1``
MIN_SAMPLES = 3


class SmallSampleWarning(UserWarning):
    """``fit`` raised ``C`` above ``1/(nu n)`` so that the gate is solved at this sample size."""


class SVDDGate(OutlierMixin, BaseEstimator):
    """One-class SVDD with an exact fp64 maintained solver, deletion receipts and certificates.

    Parameters
    ----------
    nu : float in (0, 1], default 0.5
        Upper bound on the fraction of training samples outside the boundary (and lower bound
        on the fraction of support vectors), as in :class:`sklearn.svm.OneClassSVM`.
        ``fit`` sets the box ``C = 1 / (nu * n_samples)`` once; it is never recomputed by
        ``partial_fit`` or ``forget``.
    sigma : float > 0, default 1.0
        RBF bandwidth, ``k(a, b) = exp(-||a - b||^2 / sigma^2)`` (``gamma = 1 / sigma**2``).
    refactor_every : int >= 1, default 64
        Low-rank updates between refactorisations of the solver's bordered inverse.

    Small samples
    -------------
    The gate is solved only once it holds ``ceil(1/C) + 2`` keys. When ``ceil(nu n) + 2 > n``
    (few samples, or ``nu`` close to 1) ``fit`` uses ``C = 1 / (n - 2)`` instead, i.e. the
    effective ``nu_ = (n - 2) / n``, and emits a :class:`SmallSampleWarning`. Fewer than 3
    samples raise :class:`sv_core.InvalidKeysError` (a ``ValueError``).

    Attributes
    ----------
    gate_ : Gate
        The underlying fixed-C gate (its token ids are the sample indices below).
    C_ : float
        The fixed box. ``nu_ = 1 / (C_ * n0_)`` is the effective nu at the calibration size ``n0_``.
    n0_ : int
        Number of samples ``C_`` was calibrated at (the size of the first ``fit``/``partial_fit``).
    nu_ : float
        Effective nu (equal to ``nu`` unless the small-sample rule applied).
    ids_ : ndarray of shape (n_live,)
        Indices of the samples the model holds. A sample's index is its position in the
        concatenation of every batch passed since the last ``fit`` (``fit`` rows are
        ``0..n-1``, the next ``partial_fit`` batch continues from ``n``); indices of forgotten
        or evicted samples are never reused.
    n_samples_seen_ : int
        Samples admitted since the last ``fit`` (the next index to be assigned).
    support_ : ndarray of shape (n_SV,)
        Sample indices (see ``ids_``) of the support vectors (coefficient > 0).
    support_vectors_ : ndarray of shape (n_SV, n_features_in_)
    dual_coef_ : ndarray of shape (1, n_SV)
        Coefficients ``a_i`` of the support vectors; they sum to 1 and are at most ``C_``.
    rho_ : float
        The gate's offset ``rho`` (``Gate.rho``).
    offset_ : float
        ``(1 - rho_) / 2``; ``decision_function = score_samples - offset_``.
    n_features_in_ : int
    feature_names_in_ : ndarray of str, only when fitted on a frame with string column names.

    Notes
    -----
    See the module docstring for the exact mapping between the paper's gate score
    ``s(x) = 2 sum_i a_i k(x, x_i) - rho`` (:meth:`gate_score`) and ``decision_function``:
    ``decision_function(x) = (s(x) - (1 - 2 rho)) / 2``.
    """

    def __init__(self, nu: float = 0.5, sigma: float = 1.0, refactor_every: int = 64):
        self.nu = nu
        self.sigma = sigma
        self.refactor_every = refactor_every

    # ------------------------------------------------------------------ validation
    def _check_params(self) -> tuple[float, float, int]:
        nu, sigma, every = self.nu, self.sigma, self.refactor_every
        if isinstance(nu, bool) or not isinstance(nu, numbers.Real) or not (math.isfinite(nu) and 0.0 < nu <= 1.0):
            raise InvalidParameterError(f"nu must be a number in (0, 1], got {nu!r}")
        if isinstance(sigma, bool) or not isinstance(sigma, numbers.Real) or not (math.isfinite(sigma) and sigma > 0.0):
            raise InvalidParameterError(f"sigma must be a finite positive bandwidth, got {sigma!r}")
        if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
            raise InvalidParameterError(f"refactor_every must be an integer >= 1, got {every!r}")
        return float(nu), float(sigma), int(every)

    def _calibrate(self, nu: float, n: int) -> float:
        if n < MIN_SAMPLES:
            raise InvalidKeysError(
                f"n_samples={n}: SVDDGate needs at least {MIN_SAMPLES} samples to solve the gate "
                f"(it is solved at ceil(1/C) + 2 keys with C <= 1)"
            )
        C = calibrate_C(nu, n)
        if warmup_size(C) > n:
            C_small = 1.0 / (n - 2)
            warnings.warn(
                f"nu={nu:g} with n_samples={n}: the gate needs ceil(nu*n) + 2 = {warmup_size(C)} > {n} "
                f"samples to be solved; using C = 1/(n-2) = {C_small:.6g} (effective nu = {(n - 2) / n:.6g})",
                SmallSampleWarning,
                stacklevel=3,
            )
            C = C_small
        return C

    # ------------------------------------------------------------------ fitting
    def fit(self, X: Any, y: Any = None) -> SVDDGate:
        """Calibrate ``C = 1 / (nu * n_samples)`` and solve the gate on ``X`` (y is ignored)."""
        nu, sigma, every = self._check_params()
        A = validate_data(self, X, dtype=np.float64, reset=True)
        n = int(A.shape[0])
        C = self._calibrate(nu, n)
        gate = Gate(C, sigma, every)
        gate.admit(A)
        self.gate_ = gate
        self.C_ = C
        self.n0_ = n
        self.nu_ = 1.0 / (C * n)
        self.n_samples_seen_ = n
        self._sync()
        return self

    def partial_fit(self, X: Any, y: Any = None) -> SVDDGate:
        """Admit more samples by exact C&P increments at the fixed ``C_`` (y is ignored).

        On an unfitted estimator this is :meth:`fit` (``C`` is calibrated at this batch's size).
        The result equals a fresh same-``C_`` solve on all samples held (up to fp64 rounding);
        the new samples get indices ``n_samples_seen_, n_samples_seen_ + 1, ...``.
        """
        if not hasattr(self, "gate_"):
            return self.fit(X, y)
        A = validate_data(self, X, dtype=np.float64, reset=False)
        self.gate_.admit(A)
        self.n_samples_seen_ += int(A.shape[0])
        self._sync()
        return self

    def _sync(self) -> None:
        """Refresh the sklearn-style fitted attributes from the gate's public state."""
        g = self.gate_
        ids, alpha, keys = g.ids, g.alpha, g.keys
        sv = alpha > 0.0
        self.ids_ = ids
        self.support_ = ids[sv]
        self.support_vectors_ = keys[sv]
        self.dual_coef_ = alpha[sv][None, :]
        self.rho_ = float(g.rho)
        self.offset_ = (1.0 - self.rho_) / 2.0

    # ------------------------------------------------------------------ scores
    def _probes(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return np.asarray(validate_data(self, X, dtype=np.float64, reset=False))

    def gate_score(self, X: Any) -> np.ndarray:
        """The paper's gate score ``s(x) = 2 sum_i a_i k(x, x_i) - rho`` (``Gate.score``).

        The boundary is at ``s = 1 - 2 rho_``; use :meth:`decision_function` for a zero boundary.
        """
        P = self._probes(X)
        return np.asarray(self.gate_.score(P), dtype=np.float64)

    def score_samples(self, X: Any) -> np.ndarray:
        """Kernel expansion ``sum_i a_i k(x, x_i) = (s(x) + rho) / 2``; higher is more normal.

        A value within ``TIE_TOL`` of ``offset_`` is returned as exactly ``offset_`` (a boundary
        tie), so margin samples get ``decision_function == 0`` and ``predict == +1`` whatever
        the rounding of the batch they are scored in.
        """
        k = (self.gate_score(X) + self.rho_) / 2.0
        return np.where(np.abs(k - self.offset_) <= TIE_TOL, self.offset_, k)

    def decision_function(self, X: Any) -> np.ndarray:
        """``score_samples(X) - offset_``: zero on the boundary, positive inside (inliers).

        Equals ``(s(x) - (1 - 2 rho)) / 2 = (R^2 - ||phi(x) - c||^2) / 2`` and
        ``OneClassSVM(nu, gamma=1/sigma**2).decision_function(x) / (nu * n)``.
        """
        return self.score_samples(X) - self.offset_

    def predict(self, X: Any) -> np.ndarray:
        """``+1`` (inlier) where ``decision_function >= 0``, ``-1`` (outlier) elsewhere."""
        return np.where(self.decision_function(X) >= 0.0, 1, -1)

    # ------------------------------------------------------------------ deletion and eviction
    def forget(self, indices: Any, verify: bool = False) -> list[Receipt]:
        """Delete samples by C&P decrements; returns one :class:`sv_core.Receipt` per sample.

        ``indices`` are sample indices (see ``ids_``), an int or a 1-d integer array. The result
        equals a fresh solve on the remaining samples at the same ``C_`` (see ``Gate.forget`` for
        the receipt, its exact-refit fallback and ``verify``). All-or-nothing: on any typed
        :class:`sv_core.GateError` -- :class:`sv_core.UnknownTokenError` (not held, repeated, or
        not an integer), :class:`sv_core.InfeasibleError` (``(n - k) C_ < 1``), a failed
        verification -- the model is unchanged. ``verify=True`` checks the state after all the
        deletions against one independent same-C refit; every receipt carries that verification
        (``verification["batch_tokens"]``: the samples it covers; see ``Gate.forget_many``).
        """
        check_is_fitted(self)
        idx = np.asarray(indices)
        if idx.ndim > 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise UnknownTokenError(f"indices must be an int or a 1-d array of ints, got {indices!r}")
        ids = [int(i) for i in idx.ravel()]
        if not ids:
            return []
        receipts = self.gate_.forget_many(ids, verify=verify)
        self._sync()
        return receipts

    def evict_reserve(self, probes: Any = None) -> Certificate:
        """Drop the certified-inert samples (coefficient 0) without re-solving.

        ``decision_function`` is unchanged (the certificate records the measured change on the
        probes, default every held sample). Point-in-time: after later ``partial_fit`` calls the
        model is not certified equal to one that kept them.
        """
        check_is_fitted(self)
        P = None if probes is None else self._probes(probes)
        cert = self.gate_.evict_reserve(probes=P)
        self._sync()
        return cert
