"""Clinical studies over the warehouse: pure functions over arrays, frames and read-only DuckDB
connections (no Prefect); the flows in :mod:`pipelines.flows` wire them to the warehouse."""
