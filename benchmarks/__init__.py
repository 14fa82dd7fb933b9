"""Benchmarks: measured against a real sidecar process, never part of the default test run.

Each is ``benchmarks/bench_<what>.py``; benchmarks/README.md is their registry (what each measures,
its command, its smoke command), ``python -m benchmarks --smoke`` runs them all for one round.
"""
