"""Benchmarks for airuntime (run as modules, e.g. ``python -m benchmarks.dag_throughput``)."""
