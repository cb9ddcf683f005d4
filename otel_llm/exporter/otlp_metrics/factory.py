"""``exporters.otlp_metrics``: processors.llm_metrics's families pushed as OTLP metrics (off by default)."""

from __future__ import annotations

from otel_llm.component import CreateSettings, Factory, Host, Kind, Signal
from otel_llm.exporter.otlp_metrics.config import OtlpMetricsExporter
from otel_llm.exporter.otlp_metrics.exporter import MetricsPushExporter


class MetricsPushComponent:
    def __init__(self, name: str, config: OtlpMetricsExporter) -> None:
        self.name = name
        self.config = config
        self.exporter: MetricsPushExporter | None = None

    def start(self, host: Host) -> None:
        if host.recorder is None:
            raise OSError("the metrics come from processors.llm_metrics, which is not running")
        self.exporter = MetricsPushExporter(self.name, self.config, host.recorder, host.registry)
        self.exporter.start()

    def shutdown(self, grace_s: float) -> None:
        if self.exporter is not None:
            self.exporter.shutdown(grace_s)


def create(config: OtlpMetricsExporter, settings: CreateSettings) -> MetricsPushComponent:
    return MetricsPushComponent(settings.name, config)


FACTORY = Factory("otlp_metrics", Kind.EXPORTER, OtlpMetricsExporter, create, in_defaults=False, signal=Signal.METRICS)
