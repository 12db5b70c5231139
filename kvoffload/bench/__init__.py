"""Benchmarks behind `kvoffload bench`: each prints our figure, a baseline and the ratio."""
