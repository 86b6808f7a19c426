"""Audit regimes for :func:`sv_core.audit.register_regime` (``fn(rng) -> (n, d) keys``).

* :func:`icu_regime_from_warehouse` — real ICU keys: one random stay's standardised hourly vitals
  from a cohort warehouse (``cohort.build``; e.g. the MIMIC-IV demo), deduplicated at 0.1 SD.
* :func:`learned_regime` — learned key projections of a trained recall model
  (:mod:`evaluation.studies.learned_keys`).

The CLI wiring of the audit (which regimes a ``forgetful audit`` run registers) belongs to
``pipelines/flows/audit_flow.py``; these functions only build the generators.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from evaluation.studies.errors import StudyConfigError
from sv_core.audit import dedupe

Regime = Callable[[np.random.Generator], np.ndarray]

#: how the real ICU regime's keys are built (stated beside the audit's figure)
ICU_CONSTRUCTION = ("one stay drawn uniformly from the warehouse's stays with >= {min_keys} distinct hourly keys; a "
                    "random window of <= {max_hours} h; z-scored six vitals; deduplicated at {tol:g} SD (greedy, in "
                    "hour order)")
#: how the learned-key regime's keys are built
LEARNED_CONSTRUCTION = ("frozen learned key projections (d_k = 8) of a one-layer recall model trained on CPU "
                        "({steps} steps, seed {seed}); {n_facts} distinct facts per context")


def icu_keys(matrices: list[np.ndarray], rng: np.random.Generator, *, tol: float = 0.1,
             max_hours: int | None = 240, min_keys: int = 8) -> np.ndarray:
    """Draw a stay (uniformly) whose deduplicated keys number at least ``min_keys``; return them.

    A stay longer than ``max_hours`` contributes a random contiguous window of that length
    (bounded problem size); deduplication keeps a key only if it is farther than ``tol``
    standardised units from every earlier kept key.
    """
    for _ in range(100):
        Z = matrices[int(rng.integers(len(matrices)))]
        if max_hours is not None and Z.shape[0] > max_hours:
            s = int(rng.integers(0, Z.shape[0] - max_hours + 1))
            Z = Z[s : s + max_hours]
        X = dedupe(Z, tol)
        if X.shape[0] >= min_keys:
            return X
    raise StudyConfigError(f"no stay has >= {min_keys} keys after deduplication at {tol} SD")


def icu_regime_from_warehouse(path: str | Path, *, tol: float = 0.1, max_hours: int | None = 240,
                              min_keys: int = 8, max_stays: int | None = None, sample: int | None = None,
                              seed: int = 0) -> Regime:
    """Regime over the stays of a warehouse (z-scored six vitals, hour order).

    The stays' matrices are read once (only aggregates ever leave this function: the generator
    returns key arrays, never identifiers). ``max_stays`` caps how many are read (ascending id);
    ``sample`` reads only a deterministic sample of that many stays
    (:func:`evaluation.clinical.sampling.sample_stays` with ``seed``; every stay when the cohort
    is no larger), so memory and time do not grow with the cohort. The regime's ``n_read`` and
    ``n_total`` say how many stays were read of how many.
    """
    from cohort.streams import iter_stays, warehouse_connection
    from evaluation.clinical.sampling import sample_stays

    ids = None
    with warehouse_connection(path) as con:
        every = [int(r[0]) for r in con.execute("SELECT stay_id FROM cohort_stays").fetchall()]
    if sample is not None and sample < len(every):
        ids = sample_stays(every, sample, seed).tolist()
    mats = []
    for st in iter_stays(path, stay_ids=ids):
        if not np.all(np.isfinite(st.z)):
            continue
        mats.append(st.z.copy())
        if max_stays is not None and len(mats) >= max_stays:
            break
    if not mats:
        raise StudyConfigError(f"warehouse {path} holds no stay with finite standardised vitals")
    # a stay can only yield a context if its whole stay has min_keys distinct keys: check up front
    # (counts only), so a too-small cohort fails before any regime runs, and draw among those
    eligible = [Z for Z in mats if dedupe(Z, tol).shape[0] >= min_keys]
    if not eligible:
        raise StudyConfigError(
            f"the icu_warehouse audit regime needs >= 1 stay with >= {min_keys} distinct hourly keys "
            f"(deduplicated at {tol} SD); this cohort has 0 of {len(mats)} stays — rebuild the warehouse "
            "with more or longer stays, or leave the regime out (forgetful audit --regimes ...)")

    def regime(rng: np.random.Generator) -> np.ndarray:
        return icu_keys(eligible, rng, tol=tol, max_hours=max_hours, min_keys=min_keys)

    regime.n_stays = len(eligible)  # type: ignore[attr-defined]
    regime.n_read, regime.n_total = len(mats), len(every)  # type: ignore[attr-defined]
    return regime


def learned_regime(model=None, *, n_facts: int = 16, seed: int = 0, train_steps: int = 600) -> Regime:
    """Regime of learned keys; trains the small recall model (seconds, CPU) when none is given."""
    from evaluation.studies.learned_keys import learned_key_sampler, train_model

    if model is None:
        model, _ = train_model(seed, steps=train_steps)
    return learned_key_sampler(model, n_facts=n_facts)
