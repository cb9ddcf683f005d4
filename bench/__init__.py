"""otel-llm's benchmark harness (``make bench`` / ``python -m bench``); not part of the test suite."""
