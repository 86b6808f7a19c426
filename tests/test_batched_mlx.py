"""Optional MLX FISTA backend agrees with the torch path (skipped when MLX is not importable)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from sv_core import rbf_kernel
from sv_core.batched import fista_svdd

try:
    import mlx.core  # noqa: F401

    HAVE_MLX = True
except Exception:  # ImportError or missing libmlx.so
    HAVE_MLX = False


@pytest.mark.skipif(not HAVE_MLX, reason='mlx not importable; pip install "mlx[cpu]" to run')
def test_mlx_fista_matches_torch_fista():
    from sv_core.batched.mlx_backend import fista_svdd_mlx

    rng = np.random.default_rng(0)
    X = rng.normal(size=(4, 30, 3))
    K = torch.tensor(np.stack([rbf_kernel(x, x, 2.0) for x in X]), dtype=torch.float32)
    mask = torch.stack([torch.arange(30) < p for p in (12, 20, 30)]).expand(4, 3, 30)
    a_t = fista_svdd(K, 0.1, mask, iters=80)
    a_m = fista_svdd_mlx(K, 0.1, mask, iters=80)
    assert a_m.shape == a_t.shape
    assert float((a_m - a_t).abs().max()) < 1e-4
    assert float((a_m.sum(-1) - 1).abs().max()) < 1e-5
    flat = fista_svdd_mlx(K[:, :12, :12].numpy(), 0.1, np.ones((4, 12), bool), iters=80)
    np.testing.assert_allclose(flat, a_t[:, 0, :12].numpy(), atol=1e-4)
