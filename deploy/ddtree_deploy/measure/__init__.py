"""Measuring: bench runs, run records, datasets, compare, plotting."""
