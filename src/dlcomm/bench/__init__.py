"""Benchmarks: measurements written as JSON, variants compared side by side in one run."""
