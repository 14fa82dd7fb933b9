"""Observability that every layer may record to: metrics, traces and logs (imports only settings and errors)."""
