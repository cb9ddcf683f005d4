"""otel-llm: a drop-in OTLP endpoint for LLM inference fleets.

The package reads like the pipeline: ``receivers`` -> ``adapters`` -> ``assembly`` ->
``metrics`` -> ``exporters``, with ``config`` and ``cli`` at the edges.
"""

__version__ = "0.1.0"
