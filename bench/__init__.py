"""Benchmarks: measurements on real lab hosts, never part of the pass/fail tests."""
