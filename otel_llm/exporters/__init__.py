"""Exporters: the Prometheus pull endpoint (with health and readiness) and, later, traces out."""
