"""``exporters.otlphttp``: kept traces over OTLP/HTTP (protobuf) (off by default)."""

from __future__ import annotations

from otel_llm.component import CreateSettings, Factory, Kind
from otel_llm.exporter.exporterhelper.queued import QueuedTraceExporter
from otel_llm.exporter.otlphttp.config import OtlpHttpTraceExporter


def create(config: OtlpHttpTraceExporter, settings: CreateSettings) -> QueuedTraceExporter:
    return QueuedTraceExporter(settings.name, "http", config)


FACTORY = Factory("otlphttp", Kind.EXPORTER, OtlpHttpTraceExporter, create, in_defaults=False)
