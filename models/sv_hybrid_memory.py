"""Exact fp64 inference memory of the causal SV hybrid layer (:mod:`models.sv_hybrid`): one
frozen sequence with maintained gates per chunk boundary and certified deletion."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from models.multihead import AttentionConfigError
from models.sv_hybrid_readout import chunk_starts, hybrid_weights
from sv_core.batched import warmup_threshold


class HybridDeletionError(ValueError):
    """A deletion request the hybrid memory cannot honour (bad position, already deleted)."""




@dataclass
class ForgetRecord:
    """What `ExactHybridMemory.forget` did.

    Attributes
    ----------
    position : deleted position.
    certified_gates : (head, chunk) pairs whose long-range gate was decremented exactly by
        `sv_core.Gate.forget` (fixed-C, fp64) - covered by the SV certificate.
    warmup_gates : (head, chunk) pairs that fell below the warm-up size and are now read
        ungated (no certificate).
    local_masked : the slot was masked in the dense local path of its own chunk (no
        certificate: direct cache deletion and renormalisation).
    receipts : the `sv_core.Receipt` of every certified gate decrement.
    """

    position: int
    certified_gates: list = field(default_factory=list)
    warmup_gates: list = field(default_factory=list)
    local_masked: bool = True
    receipts: list = field(default_factory=list)


class ExactHybridMemory:
    """fp64 hybrid readout of one frozen sequence with exact maintained gates.

    Parameters
    ----------
    q, k, v : tensors or arrays (H, T, d) of one sequence.
    chunk, C, sigma : gate configuration.

    Attributes
    ----------
    gates : dict ``(h, j) -> sv_core.Gate`` for every chunk j >= 1 whose prefix reaches the
        warm-up size; prefixes below it are read ungated.
    keep : bool array (T,), False at deleted positions.
    """

    def __init__(self, q, k, v, chunk: int, C: float, sigma: float):
        from sv_core import Gate

        self.q = torch.as_tensor(q).detach().double().cpu()
        self.k = torch.as_tensor(k).detach().double().cpu()
        self.v = torch.as_tensor(v).detach().double().cpu()
        if self.q.dim() != 3:
            raise AttentionConfigError("q, k, v must have shape (H, T, d)")
        self.H, self.T, _ = self.k.shape
        self.chunk, self.C, self.sigma = int(chunk), float(C), float(sigma)
        self.starts = chunk_starts(self.T, self.chunk)
        self.keep = np.ones(self.T, dtype=bool)
        self.thr = warmup_threshold(self.C)
        self.gates: dict = {}
        self._pos_of_id: dict = {}
        kn = self.k.numpy()
        for h in range(self.H):
            for j, s in enumerate(self.starts):
                if j == 0 or s < self.thr:
                    continue
                g = Gate(C=self.C, sigma=self.sigma)
                ids = list(np.asarray(g.admit(kn[h, :s])).tolist())
                self.gates[(h, j)] = g
                self._pos_of_id[(h, j)] = dict(zip(ids, range(s)))

    def gate_tensor(self) -> torch.Tensor:
        """(1, H, n_chunks, T) gate coefficients of the current (possibly decremented) state."""
        gate = torch.zeros(1, self.H, len(self.starts), self.T, dtype=torch.float64)
        for h in range(self.H):
            for j, s in enumerate(self.starts):
                if j == 0:
                    continue
                if (h, j) in self.gates:
                    g = self.gates[(h, j)]
                    pos = self._pos_of_id[(h, j)]
                    for tid, a in zip(np.asarray(g.ids).tolist(), np.asarray(g.alpha).tolist()):
                        gate[0, h, j, pos[tid]] = a
                else:
                    idx = np.flatnonzero(self.keep[:s])
                    if idx.size:
                        gate[0, h, j, torch.as_tensor(idx)] = 1.0 / idx.size
        return gate

    def weights(self) -> torch.Tensor:
        """(H, T, T) attention weights of the current state."""
        keep = torch.as_tensor(self.keep).view(1, self.T)
        return hybrid_weights(self.q[None], self.k[None], self.gate_tensor(), self.chunk, keep)[0]

    def readout(self) -> torch.Tensor:
        """(H, T, d_v) outputs of the current state."""
        return self.weights() @ self.v

    def forget(self, position: int) -> ForgetRecord:
        """Delete the token at ``position`` from every path that holds it.

        Long-range: every gate whose prefix contains the position is decremented by the exact
        fp64 path (`Gate.forget`); a gate that would drop below the warm-up size is retired and
        its prefix read ungated (flagged, no certificate). Local: the slot is masked and the
        local weights renormalised (no certificate).

        Raises
        ------
        HybridDeletionError : position out of range or already deleted (state unchanged).
        """
        p = int(position)
        if not (0 <= p < self.T):
            raise HybridDeletionError(f"position {p} outside [0, {self.T})")
        if not self.keep[p]:
            raise HybridDeletionError(f"position {p} was already deleted")
        rec = ForgetRecord(position=p)
        saved = {key: copy.deepcopy(g) for key, g in self.gates.items() if p < self.starts[key[1]]}
        try:
            for (h, j), g in list(self.gates.items()):
                if p >= self.starts[j]:
                    continue
                tid = next(t for t, q in self._pos_of_id[(h, j)].items() if q == p)
                if len(np.asarray(g.ids)) - 1 < self.thr:
                    del self.gates[(h, j)]
                    rec.warmup_gates.append((h, j))
                else:
                    rec.receipts.append(g.forget(tid))
                    rec.certified_gates.append((h, j))
        except Exception as exc:  # restore every gate touched so far: all-or-nothing
            self.gates.update(saved)
            raise HybridDeletionError(f"forgetting position {p} failed: {exc}") from exc
        self.keep[p] = False
        return rec
