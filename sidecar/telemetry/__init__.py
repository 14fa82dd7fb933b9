"""Telemetry: what the sidecar tells its operators about itself, cross-cutting like errors and
settings. Anything in the sidecar may import it (the wire, the areas, text, storage); it imports
nothing of the sidecar except settings and errors. The areas record their figures by calling
the small functions of its modules, never a telemetry library directly, and those calls cost a
flag check when the telemetry is off.

metrics.py: Prometheus metrics (``[metrics] listen``), served over HTTP at /metrics.
tracing.py: OpenTelemetry spans (``[tracing] enabled``), joined to the caller's trace.
logs.py: the log's formats (``[log] format``) and the per-request line at DEBUG.
"""
