"""Makes ``import torch`` fail in every Python process started with this folder on ``PYTHONPATH``
(``site`` imports ``sitecustomize`` at start-up), as in an install without the ``models`` extra:
a meta-path finder that answers ``torch`` and ``torch.*`` with ``ModuleNotFoundError``. Used by
``tests/test_packaging.py`` to run ``tests/no_torch/check.py``; nothing outside tests imports it.
"""
from __future__ import annotations

import importlib.abc
import sys


class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r} (tests/no_torch blocks it)", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
