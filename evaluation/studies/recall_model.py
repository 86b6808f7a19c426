"""The trained recall model behind the learned-key study (seed 000 §6) and the audit's learned regime.

A one-layer multi-query associative-recall (MQAR) reader: a context holds ``P`` facts
``(name_i, city_i)``; each fact is one token with key ``k_i = W_k e(name_i)`` (d_k = 8) and value
``u_i = W_v e'(city_i)``; a question about ``name`` has query ``q = W_q e(name)``; the answer is
``head(Σ_i κ(q, k_i) u_i / Σ_i κ(q, k_i))`` over the city vocabulary — the uniform-RBF readout of
the project's kernel, trained end to end with cross-entropy (torch, CPU, a few seconds) until
recall@1 ≈ 1. :func:`frozen` reads a context's fp64 keys, values and queries out of it;
:func:`learned_key_sampler` turns it into an audit regime (``fn(rng) -> keys``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from evaluation.studies.common import check_int


class RecallModel(nn.Module):
    """One-layer MQAR reader with learned key/query/value projections and an RBF readout.

    Parameters
    ----------
    n_names, n_cities : vocabulary sizes; d_emb : embedding width; d_k : key width;
    d_v : value width; sigma : RBF bandwidth of the readout.
    """

    def __init__(self, n_names: int = 24, n_cities: int = 24, d_emb: int = 32, d_k: int = 8, d_v: int = 32,
                 sigma: float = 1.0):
        super().__init__()
        self.name_emb = nn.Embedding(n_names, d_emb)
        self.city_emb = nn.Embedding(n_cities, d_emb)
        self.Wk = nn.Linear(d_emb, d_k)
        self.Wq = nn.Linear(d_emb, d_k)
        self.Wv = nn.Linear(d_emb, d_v)
        self.head = nn.Linear(d_v, n_cities)
        self.sigma = float(sigma)
        self.n_names, self.n_cities = n_names, n_cities

    def keys(self, names: torch.Tensor) -> torch.Tensor:
        """(..., P) name ids -> (..., P, d_k) learned keys."""
        return self.Wk(self.name_emb(names))

    def queries(self, names: torch.Tensor) -> torch.Tensor:
        return self.Wq(self.name_emb(names))

    def values(self, cities: torch.Tensor) -> torch.Tensor:
        return self.Wv(self.city_emb(cities))

    def forward(self, names: torch.Tensor, cities: torch.Tensor, q_names: torch.Tensor) -> torch.Tensor:
        """names, cities (B, P); q_names (B, M) -> logits (B, M, n_cities)."""
        from sv_core import torch_kernel

        K, U, Q = self.keys(names), self.values(cities), self.queries(q_names)
        W = torch_kernel(Q, K, self.sigma)
        W = W / W.sum(-1, keepdim=True).clamp_min(1e-30)
        return self.head(W @ U)


def sample_facts(rng: np.random.Generator, n_names: int, n_cities: int, P: int, batch: int):
    """Distinct names and distinct cities per context: (batch, P) each."""
    names = np.stack([rng.choice(n_names, P, replace=False) for _ in range(batch)])
    cities = np.stack([rng.choice(n_cities, P, replace=False) for _ in range(batch)])
    return names, cities


@dataclass
class TrainReport:
    steps: int
    final_loss: float
    recall_at_1: float
    seconds: float


def train_model(seed: int = 0, *, P: int = 8, steps: int = 1500, batch: int = 64, lr: float = 3e-3,
                progress: bool = False, **model_kw) -> tuple[RecallModel, TrainReport]:
    """Train :class:`RecallModel` on random MQAR contexts (CPU, fixed seed)."""
    from tqdm.auto import trange

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = RecallModel(**model_kw).double()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    t0 = time.perf_counter()
    loss = torch.tensor(float("nan"))
    for _ in trange(steps, desc="train MQAR", disable=not progress, leave=False):
        names, cities = sample_facts(rng, model.n_names, model.n_cities, P, batch)
        n_t, c_t = torch.as_tensor(names), torch.as_tensor(cities)
        order = torch.as_tensor(np.stack([rng.permutation(P) for _ in range(batch)]))
        logits = model(n_t, c_t, torch.gather(n_t, 1, order))
        loss = nn.functional.cross_entropy(logits.reshape(-1, model.n_cities), torch.gather(c_t, 1, order).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        names, cities = sample_facts(np.random.default_rng([seed, 1]), model.n_names, model.n_cities, P, 512)
        n_t, c_t = torch.as_tensor(names), torch.as_tensor(cities)
        acc = float((model(n_t, c_t, n_t).argmax(-1) == c_t).double().mean())
    return model, TrainReport(steps, float(loss.detach()), acc, time.perf_counter() - t0)


def frozen(model: RecallModel, names: np.ndarray, cities: np.ndarray, q_names: np.ndarray):
    """fp64 numpy keys (P, d_k), values (P, d_v), queries (M, d_k) of one context."""
    with torch.no_grad():
        return (model.keys(torch.as_tensor(names)).double().numpy(),
                model.values(torch.as_tensor(cities)).double().numpy(),
                model.queries(torch.as_tensor(q_names)).double().numpy())


def logits_of(model: RecallModel, readout: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model.head(torch.as_tensor(readout, dtype=torch.float64)).numpy()


def learned_key_sampler(model: RecallModel, n_facts: int = 16):
    """Audit regime from a trained model: ``fn(rng) -> (n_facts, d_k)`` learned keys of a random
    context of distinct names (for :func:`sv_core.audit.register_regime`)."""
    n_facts = check_int("n_facts", n_facts, 3, model.n_names)

    def regime(rng: np.random.Generator) -> np.ndarray:
        names = rng.choice(model.n_names, n_facts, replace=False)
        with torch.no_grad():
            return model.keys(torch.as_tensor(names)).double().numpy()

    return regime
