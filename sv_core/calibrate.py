"""Fixed-C calibration: ``C := 1 / (nu * n0)`` computed once at a declared size."""
from __future__ import annotations

import math

from sv_core.errors import InvalidParameterError


def calibrate_C(nu: float, n0: int) -> float:
    """Return the fixed box ``C = 1 / (nu * n0)``.

    ``C`` is computed once at the declared size ``n0`` and never recomputed when tokens are added
    or deleted. Raises :class:`InvalidParameterError` when ``nu`` is not in (0, 1] or ``n0 < 1``.
    """
    if not (isinstance(nu, (int, float)) and math.isfinite(nu) and 0.0 < nu <= 1.0):
        raise InvalidParameterError(f"nu must be in (0, 1], got {nu!r}")
    if int(n0) != n0 or n0 < 1:
        raise InvalidParameterError(f"n0 must be a positive integer, got {n0!r}")
    return 1.0 / (float(nu) * int(n0))


def warmup_size(C: float) -> int:
    """Smallest key count at which the gate is solved: ``ceil(1/C) + 2``."""
    return int(math.ceil(1.0 / C - 1e-12)) + 2
