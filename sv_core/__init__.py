"""sv_core: the fixed-C support-vector gate.

Kernels, the exact maintained fp64 Cauwenberghs-Poggio solver, reserve certificates, deletion
receipts, the independent refit oracle, and differentiable paths.
"""
from .calibrate import calibrate_C, warmup_size
from .errors import (
    GateError,
    InfeasibleError,
    InvalidKeysError,
    InvalidParameterError,
    PathError,
    RefitError,
    UnknownTokenError,
)
from .gate import Gate, WarmupError
from .kernels import rbf_kernel, torch_kernel
from .receipts import Certificate, Receipt
from .refit import refit

__all__ = [
    "Gate", "refit", "calibrate_C", "warmup_size", "rbf_kernel", "torch_kernel",
    "Certificate", "Receipt", "GateError", "InfeasibleError", "InvalidKeysError",
    "InvalidParameterError", "PathError", "RefitError", "UnknownTokenError", "WarmupError",
]
