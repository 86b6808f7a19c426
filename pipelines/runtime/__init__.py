"""Prefect plumbing shared by the flows: task runners, result files and caches, signals, crash hooks,
chunked scale-out, Dask hygiene, step meter."""
