"""Synthetic profiler traces for tests: GPU kernels laid over recorded CPU traces, with known answers."""
