"""``processors.tail_sampling``: buffers spans by trace until the trace is complete, then decides which traces are kept."""

from __future__ import annotations

from dataclasses import dataclass

from otel_llm.component import CreateSettings, Factory, Kind
from otel_llm.processor.tail_sampling.config import TailSamplingProcessor


@dataclass(frozen=True)
class ProcessorComponent:
    """Its place in the traces pipeline and its settings; service/graph.py builds the stage from it."""

    name: str
    config: TailSamplingProcessor


def create(config: TailSamplingProcessor, settings: CreateSettings) -> ProcessorComponent:
    return ProcessorComponent(settings.name, config)


FACTORY = Factory("tail_sampling", Kind.PROCESSOR, TailSamplingProcessor, create, in_defaults=True)
