"""``exporters.debug``: kept-trace summaries in the log (off by default)."""

from __future__ import annotations

from otel_llm.component import CreateSettings, Factory, Kind
from otel_llm.exporter.debug.config import DebugExporter
from otel_llm.exporter.debug.exporter import DebugComponent


def create(config: DebugExporter, settings: CreateSettings) -> DebugComponent:
    return DebugComponent(settings.name, config)


FACTORY = Factory("debug", Kind.EXPORTER, DebugExporter, create, in_defaults=False)
