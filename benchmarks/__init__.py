"""Benchmarks: `python -m benchmarks.run` (all of them, tables last) or one module."""
