"""Benchmarks: measured against a real sidecar process, never part of the default test run.

    python -m benchmarks.turn_latency     # the per-turn table of the foundation issue
    python -m benchmarks.server_kinds     # sync vs grpc.aio servers on the per-turn path
"""
