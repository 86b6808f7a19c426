"""Build of the optional compiled fast paths (everything else is in pyproject.toml).

``sv_core._cpfast``: the simple events of the maintained C&P loop; ``sv_core._smo``: the SMO of the
certified solve (:func:`sv_core.solve`); ``sv_core._batchfast``: the FISTA partition finder and the ridged
KKT solve of the batched training gate (:func:`sv_core.batched.batched_gate`), the backward of its RBF Gram
matrices (:func:`sv_core.batched.rbf_gram`) and the hybrid readout of the causal SV layer
(:mod:`sv_core.batched.readout`). All are plain C over the buffer protocol (no NumPy
headers, no build-time NumPy) and ``optional``: without a C compiler the install still succeeds
and the NumPy / torch reference loops run (``sv_core.fast_path_available()``,
``sv_core.smo.fast_smo_available()`` and ``sv_core.batched.common.compiled_batch_available()`` say
which ones are in use).
"""
import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off"]
setup(ext_modules=[
    Extension("sv_core._cpfast", ["sv_core/_cpfast.c"], optional=True, extra_compile_args=flags),
    Extension("sv_core._smo", ["sv_core/_smo.c"], optional=True, extra_compile_args=flags),
    Extension("sv_core._batchfast", ["sv_core/_batchfast.c"],
              depends=["sv_core/_batchfast_body.h", "sv_core/_readout_body.h", "sv_core/_gram_body.h"], optional=True,
              extra_compile_args=flags + ([] if sys.platform == "win32" else ["-O3"])),
])
