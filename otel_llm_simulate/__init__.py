"""Synthetic traffic: engine span emitters (``engines``) built on the real OpenTelemetry SDK."""
