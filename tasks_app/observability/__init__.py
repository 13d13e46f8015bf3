"""Observability: metrics.py (Prometheus), tracing.py (OpenTelemetry)."""
