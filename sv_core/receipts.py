"""Certificates (reserve eviction) and receipts (deletion), JSON-serialisable."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field


@dataclass
class Certificate:
    """Point-in-time reserve-eviction certificate (seed 001, Proposition 1).

    Valid for the *current* solved fixed-C state only: after later admissions an evicted key
    could have become active again (Proposition 2), so a pruned stream is not certified equal to
    the full-history stream.
    """

    issued: bool
    reason: str
    evicted: list
    n_before: int
    n_after: int
    C: float
    sigma: float
    max_abs_score_change: float | None = None
    max_abs_weight_change: float | None = None
    n_probes: int = 0
    boundary: str = "point-in-time; no equivalence claim after future admissions"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


@dataclass
class Receipt:
    """Deletion receipt of one token removed by the C&P decremental path.

    ``verification`` (with ``verify=True``) holds the max |gate-score difference| against an
    independent same-C refit on retained, removed and jittered probes, the partition match and
    the KKT residual. ``fallback`` records that the exact fallback completed the deletion. The
    receipts of one :meth:`Gate.forget_many` call (``SVDDGate.forget`` of several samples) share
    one verification of the state after the whole batch (``verification["batch_tokens"]``).
    """

    token_id: int
    C: float
    sigma: float
    n_before: int
    n_after: int
    status_before: str
    alpha_before: float
    partition_before: dict | None
    partition_after: dict | None
    path_events: int
    elapsed_s: float
    certified: bool
    reference: str = "fresh retained-key refit at the same C (seed 001, Proposition 3)"
    verification: dict | None = field(default=None)
    #: True when the maintained path could not complete (or its KKT guard tripped) and the
    #: deletion was completed by the exact fallback: a fresh refit of the retained keys from
    #: which the maintained state was rebuilt; ``fallback_reason`` says why
    fallback: bool = False
    fallback_reason: str | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if d["alpha_before"] != d["alpha_before"]:  # NaN (warm-up) is not JSON
            d["alpha_before"] = None
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)
