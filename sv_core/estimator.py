"""scikit-learn estimator over the fixed-C gate: :class:`SVDDGate`.

``SVDDGate`` is an ``OutlierMixin, BaseEstimator`` that composes the public :class:`sv_core.Gate`
API. ``fit`` calibrates ``C = 1 / (nu * n_samples)`` once; ``partial_fit`` admits more samples
by exact C&P increments at that same C; ``forget`` deletes samples by C&P decrements and returns
their receipts; ``evict_reserve`` drops certified-inert samples. ``decision_function`` is zero on
the boundary and positive inside, and equals libsvm's one-class SVM decision divided by ``nu n``
(the score conventions are derived at :class:`SVDDGate`).
"""

from __future__ import annotations

import math
import warnings
from numbers import Integral, Real
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, OutlierMixin, _fit_context
from sklearn.exceptions import NotFittedError
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils._param_validation import InvalidParameterError as _SklearnParameterError
from sklearn.utils.validation import check_is_fitted, validate_data

from sv_core.calibrate import calibrate_C, warmup_size
from sv_core.errors import InvalidKeysError, InvalidParameterError, UnknownTokenError
from sv_core.gate import Gate
from sv_core.kernels import rbf_kernel
from sv_core.receipts import Certificate, Receipt
from sv_core.validation import check_params

#: |decision_function| at or below this is a boundary tie, reported as exactly 0. Margin samples
#: sit on the boundary in exact arithmetic; in fp64 their score is off by ~1e-16, with a sign that
#: depends on BLAS blocking (so on the batch size). decision_function lies in [-1, 1].
TIE_TOL = 1e-12

#: fewest samples a fit can solve: the gate needs ``ceil(1/C) + 2`` keys and ``C <= 1``
MIN_SAMPLES = 3

#: relative tolerance of ``gamma * sigma**2 == 1`` when both spellings of the bandwidth are given
BANDWIDTH_RTOL = 1e-9

#: ``boundary`` values: how ``predict`` labels a boundary tie (``decision_function == 0``)
BOUNDARIES = ("inside", "libsvm")

#: fitted attributes recomputed on unpickling from the pickled gate state (not pickled twice)
_FROM_STATE = ("ids_", "support_", "support_vectors_", "dual_coef_")


class SmallSampleWarning(UserWarning):
    """``fit`` raised ``C`` above ``1/(nu n)`` so that the gate is solved at this sample size."""


class SVDDParameterError(InvalidParameterError, _SklearnParameterError):
    """A parameter of :class:`SVDDGate` is invalid: both :class:`sv_core.InvalidParameterError`
    and scikit-learn's ``InvalidParameterError`` (so a ``ValueError`` and a ``TypeError``)."""


class SVDDGate(OutlierMixin, BaseEstimator):
    """One-class SVDD with an exact fp64 maintained solver, deletion receipts and certificates.

    Parameters
    ----------
    nu : float in (0, 1], default 0.5
        Upper bound on the fraction of training samples outside the boundary (and lower bound
        on the fraction of support vectors), as in :class:`sklearn.svm.OneClassSVM`.
        ``fit`` sets the box ``C = 1 / (nu * n_samples)`` once; it is never recomputed by
        ``partial_fit`` or ``forget``.
    sigma : float > 0 or None, default None
        RBF bandwidth, ``k(a, b) = exp(-||a - b||^2 / sigma^2)``. None: ``1 / sqrt(gamma)`` when
        ``gamma`` is given, else 1.0.
    gamma : float > 0 or None, default None
        The same bandwidth in scikit-learn's spelling, ``k(a, b) = exp(-gamma ||a - b||^2)``, so
        ``gamma = 1 / sigma**2`` (not ``1 / (2 sigma**2)``): ``SVDDGate(gamma=g)`` and
        ``OneClassSVM(gamma=g)`` use the same kernel. Giving both ``sigma`` and ``gamma`` is
        allowed only when they agree (``gamma * sigma**2 = 1`` to ``BANDWIDTH_RTOL``); otherwise
        ``fit`` raises :class:`SVDDParameterError`.
    boundary : {"inside", "libsvm"}, default "inside"
        Which side of the boundary a tie falls on (``|decision| <= TIE_TOL``; every margin
        support vector is one): "inside" scores it exactly 0, an inlier (``+1``); "libsvm" one
        unit in the last place below 0, an outlier (``-1``), as libsvm's one-class rule
        ``(decision > 0) ? 1 : -1`` (and so :class:`sklearn.svm.OneClassSVM`) labels an exact
        tie. Either way ``predict`` is ``+1`` exactly where ``decision_function >= 0`` (the
        scikit-learn outlier contract). Ties only: every other value is the same. libsvm's own
        solution is approximate, so the decision it computes for a margin support vector is
        solver noise of either sign (about ``tol``), not a tie; no rule reproduces its labels there.
    refactor_every : int >= 1, default 64
        Low-rank updates between refactorisations of the solver's bordered inverse.

    Parameters are checked by scikit-learn's parameter validation (``_parameter_constraints``)
    when ``fit`` (or a first ``partial_fit``) runs; an invalid value raises
    :class:`SVDDParameterError`.

    Small samples
    -------------
    The gate is solved only once it holds ``ceil(1/C) + 2`` keys. When ``ceil(nu n) + 2 > n``
    (few samples, or ``nu`` close to 1) ``fit`` uses ``C = 1 / (n - 2)`` instead, i.e. the
    effective ``nu_ = (n - 2) / n``, and emits a :class:`SmallSampleWarning`. Fewer than 3
    samples raise :class:`sv_core.InvalidKeysError` (a ``ValueError``).

    Persistence
    -----------
    ``pickle`` saves what ``predict``, ``decision_function`` and ``score_samples`` read (the
    support vectors, their coefficients, ``rho_``, ``C_``, ``sigma_`` and the other fitted
    attributes) and, so that ``partial_fit`` and ``forget`` stay exact after loading, the keys of
    the reserve samples (coefficient 0), the sample indices and the forgotten indices: O(n d)
    numbers, no kernel matrix and no solver factorisation. Loading does no solver work; the
    maintained solver state is rebuilt on the first ``partial_fit``, ``forget``,
    ``evict_reserve`` or ``gate_`` access, by :meth:`sv_core.Gate.from_state` (the kernel and the
    bordered inverse recomputed from the keys, the KKT residual checked; no refit). To pickle in
    O(n_SV d), call :meth:`evict_reserve` first: it drops the reserve samples with a certificate
    that the decisions did not change (later ``partial_fit``/``forget`` are then exact for the
    samples kept, not for the evicted ones). The gate's diagnostic logs (``fallback_log``,
    ``cold_solve_log``) are not pickled; the ``fallbacks`` count is. As with any scikit-learn
    estimator, unpickling runs code named in the file: load only pickles you trust.

    Attributes
    ----------
    gate_ : Gate
        The underlying fixed-C gate (its token ids are the sample indices below).
    C_ : float
        The fixed box. ``nu_ = 1 / (C_ * n0_)`` is the effective nu at the calibration size ``n0_``.
    sigma_ : float
        The bandwidth in use (from ``sigma`` or ``gamma``); ``gamma = 1 / sigma_**2``.
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
    The exact mapping (below) between the paper's gate score
    ``s(x) = 2 sum_i a_i k(x, x_i) - rho`` (:meth:`gate_score`) and ``decision_function``:
    ``decision_function(x) = (s(x) - (1 - 2 rho)) / 2``.

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
    outside; ``predict`` is ``+1`` where ``decision_function >= 0`` and ``-1`` elsewhere. A boundary
    tie is an inlier (``boundary="inside"``, the default: its decision is exactly 0) or an outlier
    (``boundary="libsvm"``, as libsvm's ``(sum > 0) ? 1 : -1``: its decision is one ulp below 0).
    For the RBF kernel the SVDD dual equals libsvm's one-class SVM dual, so with ``C = 1 / (nu n)``
    and ``gamma = 1 / sigma**2``::

        OneClassSVM(nu=nu, gamma=1/sigma**2).decision_function(x) = nu * n * SVDDGate.decision_function(x)
        OneClassSVM.dual_coef_ = nu * n * SVDDGate.dual_coef_,  OneClassSVM.offset_ = nu * n * offset_

    up to libsvm's tolerance (``tol=1e-3`` by default).
    """

    _parameter_constraints: dict = {
        "nu": [Interval(Real, 0.0, 1.0, closed="right")],
        "sigma": [Interval(Real, 0.0, None, closed="neither"), None],
        "gamma": [Interval(Real, 0.0, None, closed="neither"), None],
        "boundary": [StrOptions(set(BOUNDARIES))],
        "refactor_every": [Interval(Integral, 1, None, closed="left")],
    }
    #: the live gate, or None until it is rebuilt from ``_gate_state`` (after unpickling)
    _gate: Gate | None
    #: ``Gate.to_state()`` of a loaded estimator whose gate is not rebuilt yet, else None
    _gate_state: dict[str, Any] | None

    def __init__(self, nu: float = 0.5, sigma: float | None = None, gamma: float | None = None,
                 boundary: str = "inside", refactor_every: int = 64):
        self.nu = nu
        self.sigma = sigma
        self.gamma = gamma
        self.boundary = boundary
        self.refactor_every = refactor_every

    # ------------------------------------------------------------------ validation
    def _validate_params(self) -> None:
        """scikit-learn's validation of ``_parameter_constraints``, raising :class:`SVDDParameterError`."""
        try:
            super()._validate_params()
        except _SklearnParameterError as exc:
            raise SVDDParameterError(str(exc)) from None

    def _bandwidth(self) -> float:
        """The bandwidth from ``sigma`` and/or ``gamma`` (already type- and range-checked)."""
        sigma, gamma = self.sigma, self.gamma
        if gamma is not None:
            from_gamma = 1.0 / math.sqrt(float(gamma)) if math.isfinite(gamma) else 0.0
            if sigma is not None and not math.isclose(float(gamma) * float(sigma) ** 2, 1.0,
                                                      rel_tol=BANDWIDTH_RTOL):
                raise SVDDParameterError(
                    f"sigma={sigma!r} and gamma={gamma!r} disagree: gamma must be 1/sigma**2 "
                    f"= {1.0 / float(sigma) ** 2:.6g} (give one of them)")
            sigma = from_gamma if sigma is None else sigma
        try:
            return check_params(1.0, 1.0 if sigma is None else sigma)[1]
        except InvalidParameterError as exc:
            where = "" if self.sigma is not None or gamma is None else f" (sigma = 1/sqrt(gamma), gamma={gamma!r})"
            raise SVDDParameterError(f"{exc}{where}") from None

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
                stacklevel=4,
            )
            C = C_small
        return C

    # ------------------------------------------------------------------ fitting
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X: Any, y: Any = None) -> SVDDGate:
        """Calibrate ``C = 1 / (nu * n_samples)`` and solve the gate on ``X`` (y is ignored)."""
        sigma = self._bandwidth()
        A = validate_data(self, X, dtype=np.float64, reset=True)
        n = int(A.shape[0])
        C = self._calibrate(float(self.nu), n)
        gate = Gate(C, sigma, int(self.refactor_every))
        gate.admit(A)
        self._gate, self._gate_state = gate, None
        self.C_ = C
        self.sigma_ = sigma
        self.n0_ = n
        self.nu_ = 1.0 / (C * n)
        self.n_samples_seen_ = n
        self._sync()
        return self

    @_fit_context(prefer_skip_nested_validation=True)
    def partial_fit(self, X: Any, y: Any = None) -> SVDDGate:
        """Admit more samples by exact C&P increments at the fixed ``C_`` (y is ignored).

        On an unfitted estimator this is :meth:`fit` (``C`` is calibrated at this batch's size).
        The result equals a fresh same-``C_`` solve on all samples held (up to fp64 rounding);
        the new samples get indices ``n_samples_seen_, n_samples_seen_ + 1, ...``. The bandwidth
        and ``C_`` are the fitted ones (parameters changed since ``fit`` take effect at the next
        ``fit``).
        """
        if not hasattr(self, "C_"):
            return self.fit(X, y)
        A = validate_data(self, X, dtype=np.float64, reset=False)
        self.gate_.admit(A)
        self.n_samples_seen_ += int(A.shape[0])
        self._sync()
        return self

    @property
    def gate_(self) -> Gate:
        """The underlying fixed-C gate; after unpickling, rebuilt on first use (see Persistence)."""
        gate = self.__dict__.get("_gate")
        if gate is None:
            state = self.__dict__.get("_gate_state")
            if state is None:
                raise NotFittedError(f"This {type(self).__name__} instance is not fitted yet: call 'fit' first.")
            gate = Gate.from_state(state)
            self._gate, self._gate_state = gate, None
        return gate

    def _sync(self) -> None:
        """Refresh the sklearn-style fitted attributes from the gate's public state."""
        g = self.gate_
        self._set_support(g.ids, g.alpha, g.keys, float(g.rho))

    def _set_support(self, ids: np.ndarray, alpha: np.ndarray, keys: np.ndarray, rho: float) -> None:
        sv = alpha > 0.0
        self.ids_ = ids
        self.support_ = ids[sv]
        self.support_vectors_ = keys[sv]
        self.dual_coef_ = alpha[sv][None, :]
        self.rho_ = rho
        self.offset_ = (1.0 - self.rho_) / 2.0

    # ------------------------------------------------------------------ persistence
    def __getstate__(self) -> dict[str, Any]:
        """The fitted attributes and the gate's ``to_state`` (keys, coefficients, ids; no kernel)."""
        state = dict(super().__getstate__())
        gate = state.pop("_gate", None)
        if gate is not None:
            state["_gate_state"] = gate.to_state()
        if state.get("_gate_state") is not None:
            for name in _FROM_STATE:  # recomputed from the gate state by __setstate__
                state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._gate = None
        st = self.__dict__.get("_gate_state")
        if st is not None and not hasattr(self, "support_vectors_"):
            self._set_support(np.asarray(st["ids"]), np.asarray(st["alpha"]), np.asarray(st["keys"]), self.rho_)

    # ------------------------------------------------------------------ scores
    def _probes(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return np.asarray(validate_data(self, X, dtype=np.float64, reset=False))

    def gate_score(self, X: Any) -> np.ndarray:
        """The paper's gate score ``s(x) = 2 sum_i a_i k(x, x_i) - rho`` (``Gate.score``).

        Computed from ``support_vectors_`` and ``dual_coef_`` (bit-identical to ``gate_.score``;
        no solver state is needed). The boundary is at ``s = 1 - 2 rho_``; use
        :meth:`decision_function` for a zero boundary.
        """
        P = self._probes(X)
        return 2.0 * rbf_kernel(P, self.support_vectors_, self.sigma_) @ self.dual_coef_[0] - self.rho_

    def score_samples(self, X: Any) -> np.ndarray:
        """Kernel expansion ``sum_i a_i k(x, x_i) = (s(x) + rho) / 2``; higher is more normal.

        A value within ``TIE_TOL`` of ``offset_`` is a boundary tie (margin samples are, whatever
        the rounding of the batch they are scored in): it is returned as exactly ``offset_``
        with ``boundary="inside"`` (``decision_function == 0``, an inlier) and as the float just
        below ``offset_`` with ``boundary="libsvm"`` (``decision_function`` = minus one unit in
        the last place of ``offset_``, an outlier).
        """
        k = (self.gate_score(X) + self.rho_) / 2.0
        return np.where(np.abs(k - self.offset_) <= TIE_TOL, self._tie_score(), k)

    def _tie_score(self) -> float:
        if self.boundary == "inside":
            return self.offset_
        if self.boundary == "libsvm":
            return float(np.nextafter(self.offset_, -np.inf))
        raise SVDDParameterError(f"boundary must be one of {BOUNDARIES}, got {self.boundary!r}")

    def decision_function(self, X: Any) -> np.ndarray:
        """``score_samples(X) - offset_``: zero on the boundary, positive inside (inliers).

        Equals ``(s(x) - (1 - 2 rho)) / 2 = (R^2 - ||phi(x) - c||^2) / 2`` and
        ``OneClassSVM(nu, gamma=1/sigma**2).decision_function(x) / (nu * n)``; a boundary tie is
        exactly 0 (``boundary="inside"``) or one unit in the last place of ``offset_`` below 0
        (``boundary="libsvm"``).
        """
        return self.score_samples(X) - self.offset_

    def predict(self, X: Any) -> np.ndarray:
        """``+1`` (inlier) where ``decision_function >= 0``, ``-1`` (outlier) elsewhere: a boundary
        tie is ``+1`` with ``boundary="inside"`` and ``-1`` with ``boundary="libsvm"``."""
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
