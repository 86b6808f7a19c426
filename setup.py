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
from setuptools.command.build_ext import build_ext

#: ``sv_core._batchfast`` splits a batch over the OpenMP team of the process when built with OpenMP: torch's
#: own runtime (the same ``libgomp.so.1`` soname, loaded first by ``import torch``), so torch's intra-op workers
#: run the problems instead of spinning beside helper threads; without OpenMP support it falls back to POSIX
#: threads (the same results: each problem is computed by the same loop whichever thread runs it)
OPENMP = [] if sys.platform in ("win32", "darwin") else ["-fopenmp"]


class BuildExt(build_ext):
    """Build ``_batchfast`` with OpenMP when the compiler supports it, else without (same results)."""

    def build_extension(self, ext):
        if ext.name != "sv_core._batchfast" or not OPENMP:
            return super().build_extension(ext)
        plain = (list(ext.extra_compile_args), list(ext.extra_link_args))
        ext.extra_compile_args = plain[0] + OPENMP
        ext.extra_link_args = plain[1] + OPENMP
        try:
            return super().build_extension(ext)
        except Exception as exc:  # no OpenMP in this toolchain: the POSIX-threads build
            self.warn(f"building sv_core._batchfast without OpenMP ({exc})")
            ext.extra_compile_args, ext.extra_link_args = plain
            return super().build_extension(ext)


flags = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off"]
setup(cmdclass={"build_ext": BuildExt}, ext_modules=[
    Extension("sv_core._cpfast", ["sv_core/_cpfast.c"], optional=True, extra_compile_args=flags),
    Extension("sv_core._smo", ["sv_core/_smo.c"], optional=True, extra_compile_args=flags),
    Extension("sv_core._batchfast", ["sv_core/_batchfast.c"],
              depends=["sv_core/_batchfast_body.h", "sv_core/_readout_body.h", "sv_core/_expf_body.h",
                       "sv_core/_gram_body.h"], optional=True,
              extra_compile_args=flags + ([] if sys.platform == "win32" else ["-O3"])),
])
