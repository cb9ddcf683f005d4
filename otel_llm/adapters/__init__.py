"""Engine adapters: turn one span of a known engine into an ``EngineObservation``."""

from otel_llm.adapters.engines import classify
from otel_llm.adapters.observation import EngineKind, EngineObservation, MalformedSpan

__all__ = ["EngineKind", "EngineObservation", "MalformedSpan", "classify"]
