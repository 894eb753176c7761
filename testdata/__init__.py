"""Generators of test and benchmark data: synthetic game chunks and training
windows, legal random engine games, and the synthetic-lake demo.

Nothing in the roles imports this package; tests, benchmarks and the demo do.
It sits above every role in the import order (see tests/system/test_layering.py).
"""
