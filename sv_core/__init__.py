"""sv_core: the fixed-C support-vector gate.

Kernels, the exact maintained fp64 Cauwenberghs-Poggio solver, the certified solve (SMO +
bordered KKT system + KKT check), reserve certificates, deletion receipts, the independent refit
oracle, and differentiable paths.
"""
from sv_core._fastpath import fast_path_available
from sv_core._version import __version__
from sv_core.calibrate import calibrate_C, warmup_size
from sv_core.certified import CertifiedSolution, SolveCertificate, solve
from sv_core.errors import (
    GateError,
    InfeasibleError,
    InvalidKeysError,
    InvalidParameterError,
    InvalidStateError,
    InvalidTokenIdError,
    PathError,
    RefitError,
    UnknownTokenError,
    VerificationError,
)
from sv_core.gate import Gate, WarmupError
from sv_core.kernels import rbf_kernel, torch_kernel
from sv_core.receipts import Certificate, Receipt
from sv_core.refit import refit
from sv_core.solver import reference_loop
from sv_core.streaming import StreamingGate

__all__ = [
    "Gate", "StreamingGate", "refit", "solve", "CertifiedSolution", "SolveCertificate", "calibrate_C",
    "warmup_size", "rbf_kernel", "torch_kernel",
    "Certificate", "Receipt", "GateError", "InfeasibleError", "InvalidKeysError",
    "InvalidParameterError", "PathError", "RefitError", "UnknownTokenError", "WarmupError",
    "InvalidStateError", "InvalidTokenIdError", "VerificationError",
    "SVDDGate", "__version__", "fast_path_available", "reference_loop",
]


def __getattr__(name: str):
    """Lazy ``SVDDGate``: importing ``sv_core`` does not import scikit-learn."""
    if name == "SVDDGate":
        from sv_core.estimator import SVDDGate

        return SVDDGate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
