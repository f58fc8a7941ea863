"""Benchmarks that print side-by-side ratios to a baseline measured in the same run."""
