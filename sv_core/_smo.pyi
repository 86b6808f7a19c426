# Type stub of the optional C extension built from sv_core/_smo.c (see sv_core/smo.py).
from typing import Any

ABI: int

def smo(
    X: Any, n: int, d: int, sigma: float, C: float, alpha: Any, G: Any, tol: float, max_iter: int,
    cache_bytes: float, K: Any, ldk: int, /,
) -> tuple[int, int, int, int, int]: ...
