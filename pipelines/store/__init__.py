"""The deletion subsystem: the warehouse handle, locks, safe file I/O, keys, stored gates and per-stay results,
forget, erasure and exports. Imports no Prefect."""
