# Type stub of the optional C extension built from sv_core/_cpfast.c (see sv_core/_fastpath.py).
from typing import Any

ABI: int

def sweep(
    mode: int, c: int, n: int, K: Any, kd: Any, alpha: Any, g: Any, status: Any, rows: Any, ldr: int,
    rows_cap: int, S: Any, s_cap: int, R: Any, ldR: int, r_cap: int, C: float, eps: float,
    risky_rate: float, dup_screen: float, rho: float, m: int, updates: int, refactor_every: int,
    /,
) -> tuple[int, int, int, float, float, int, int, int, float, int]: ...
