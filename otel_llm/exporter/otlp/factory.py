"""``exporters.otlp``: kept traces over OTLP/gRPC to Tempo, Jaeger or a Collector (off by default)."""

from __future__ import annotations

from otel_llm.component import CreateSettings, Factory, Kind
from otel_llm.exporter.exporterhelper.queued import QueuedTraceExporter
from otel_llm.exporter.otlp.config import OtlpTraceExporter


def create(config: OtlpTraceExporter, settings: CreateSettings) -> QueuedTraceExporter:
    return QueuedTraceExporter(settings.name, "grpc", config)


FACTORY = Factory("otlp", Kind.EXPORTER, OtlpTraceExporter, create, in_defaults=False)
