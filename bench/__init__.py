"""Benchmarks: runnable scripts that print timings and ratios (never assertions)."""
