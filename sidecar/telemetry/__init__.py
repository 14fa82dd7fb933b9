"""Observability shared by every layer: metrics, traces, logs (each optional, each off costs a check)."""
