"""``processors.redaction``: removes prompt and completion content from kept traces and adds the synthesized segment spans."""

from __future__ import annotations

from dataclasses import dataclass

from otel_llm.component import CreateSettings, Factory, Kind
from otel_llm.processor.redaction.config import RedactionProcessor


@dataclass(frozen=True)
class ProcessorComponent:
    """Its place in the traces pipeline and its settings; service/graph.py builds the stage from it."""

    name: str
    config: RedactionProcessor


def create(config: RedactionProcessor, settings: CreateSettings) -> ProcessorComponent:
    return ProcessorComponent(settings.name, config)


FACTORY = Factory("redaction", Kind.PROCESSOR, RedactionProcessor, create, in_defaults=True)
