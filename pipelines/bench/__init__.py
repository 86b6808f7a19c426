"""Benchmark commands (never timed tests): ``python -m pipelines.bench.<name>``."""
