"""Benchmark commands of the gate (never timed tests): ``python -m sv_core.bench.<name>``."""
