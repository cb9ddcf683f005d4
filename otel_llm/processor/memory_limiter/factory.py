"""``processors.memory_limiter``: refuses data (retryably) above its memory limit, and sheds the oldest buffered traces."""

from __future__ import annotations

from dataclasses import dataclass

from otel_llm.component import CreateSettings, Factory, Kind
from otel_llm.processor.memory_limiter.config import MemoryLimiterProcessor


@dataclass(frozen=True)
class ProcessorComponent:
    """Its place in the traces pipeline and its settings; service/graph.py builds the stage from it."""

    name: str
    config: MemoryLimiterProcessor


def create(config: MemoryLimiterProcessor, settings: CreateSettings) -> ProcessorComponent:
    return ProcessorComponent(settings.name, config)


FACTORY = Factory("memory_limiter", Kind.PROCESSOR, MemoryLimiterProcessor, create, in_defaults=True)
