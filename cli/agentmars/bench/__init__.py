"""Benchmarks behind ``agentmars bench``: each measures a figure and, in the same run,
the bare baseline it is compared with."""
