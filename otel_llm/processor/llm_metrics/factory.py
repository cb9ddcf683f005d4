"""``processors.llm_metrics``: request records from the engine, gateway and client spans of a trace; both namings' histograms."""

from __future__ import annotations

from dataclasses import dataclass

from otel_llm.component import CreateSettings, Factory, Kind
from otel_llm.processor.llm_metrics.config import LlmMetricsProcessor


@dataclass(frozen=True)
class ProcessorComponent:
    """Its place in the traces pipeline and its settings; service/graph.py builds the stage from it."""

    name: str
    config: LlmMetricsProcessor


def create(config: LlmMetricsProcessor, settings: CreateSettings) -> ProcessorComponent:
    return ProcessorComponent(settings.name, config)


FACTORY = Factory("llm_metrics", Kind.PROCESSOR, LlmMetricsProcessor, create, in_defaults=True)
