"""otel-llm: a drop-in OTLP endpoint for LLM inference fleets.

Laid out as an OpenTelemetry Collector: ``receiver/``, ``processor/`` and ``exporter/`` hold one
folder per configured component, ``pdata/`` the types that cross between them, ``service/`` the
graph that runs them (see ARCHITECTURE.md).
"""

__version__ = "0.1.0"
