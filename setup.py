"""Build of the optional compiled fast path ``sv_core._cpfast`` (everything else is in pyproject.toml).

The extension is plain C over the buffer protocol (no NumPy headers, no build-time NumPy). It is
``optional``: without a C compiler the install still succeeds and the solver runs its NumPy
reference loop (``sv_core.fast_path_available()`` says which one is in use).
"""
import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off"]
setup(ext_modules=[Extension("sv_core._cpfast", ["sv_core/_cpfast.c"], optional=True, extra_compile_args=flags)])
