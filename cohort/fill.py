"""Per-stay hourly frame work in Polars: dense hour grid, observed flags, forward fill within
stay, back fill, cohort-median fill, and the deterioration labels (SPEC §2).

The slow, obvious counterpart is :func:`cohort.reference.fill_stay_reference`.
"""
from __future__ import annotations

import polars as pl

from .constants import EVENT_THRESHOLDS, SPO2_EVENT_BELOW, VITALS


def event_expr(prefix: str = "") -> tuple[pl.Expr, pl.Expr]:
    """Polars expressions for (event_composite, event_spo2) on filled raw columns."""
    terms = []
    for v, (lo, hi) in EVENT_THRESHOLDS.items():
        c = pl.col(prefix + v)
        if lo is not None:
            terms.append(c < lo)
        if hi is not None:
            terms.append(c > hi)
    comp = pl.any_horizontal(terms).alias("event_composite")
    spo2 = (pl.col(prefix + "spo2") < SPO2_EVENT_BELOW).alias("event_spo2")
    return comp, spo2


def fill_batch(obs: pl.DataFrame, stays: pl.DataFrame, medians: dict[str, float]) -> pl.DataFrame:
    """Dense, filled hourly frame for a batch of stays.

    Parameters
    ----------
    obs : DataFrame, columns stay_id, hour, hr, sbp, dbp, rr, spo2, temp_c
        Observed hourly means (only hours with ≥ 1 measurement; nulls for unmeasured vitals).
    stays : DataFrame, columns stay_id, n_hours
        Every stay of the batch; hours 0 .. n_hours-1 are produced for each.
    medians : dict vital -> float
        Cohort medians used when a stay never records a vital.

    Returns
    -------
    DataFrame with n_rows = Σ n_hours, sorted by (stay_id, hour), columns stay_id (Int64),
    hour (Int32), the six vitals (Float64, filled), ``<vital>_observed`` (Boolean),
    event_composite, event_spo2 (Boolean).
    """
    grid = (
        stays.select(
            pl.col("stay_id").cast(pl.Int64),
            pl.int_ranges(0, pl.col("n_hours").cast(pl.Int64)).alias("hour"),
        )
        .explode("hour")
        .with_columns(pl.col("hour").cast(pl.Int32))
    )
    obs = obs.with_columns(pl.col("stay_id").cast(pl.Int64), pl.col("hour").cast(pl.Int32),
                           *[pl.col(v).cast(pl.Float64) for v in VITALS])
    df = grid.join(obs, on=["stay_id", "hour"], how="left").sort(["stay_id", "hour"])
    df = df.with_columns(
        *[pl.col(v).is_not_null().alias(f"{v}_observed") for v in VITALS],
        *[
            pl.col(v).forward_fill().backward_fill().over("stay_id").fill_null(float(medians[v])).alias(v)
            for v in VITALS
        ],
    )
    df = df.with_columns(*event_expr())
    return df.select(
        "stay_id", "hour", *VITALS, *[f"{v}_observed" for v in VITALS], "event_composite", "event_spo2"
    )
