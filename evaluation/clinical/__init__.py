"""Clinical study logic: pure functions over arrays and frames (no Prefect); the flows in
``pipelines/flows`` wire them to the warehouse."""
