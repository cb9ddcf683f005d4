"""``exporters.prometheus``: the pull endpoint, /metrics, /healthz, /readyz and the store's /api (in the defaults)."""

from __future__ import annotations

from collections.abc import Callable

from otel_llm.component import CreateSettings, Factory, Host, Kind, Signal
from otel_llm.exporter.prometheus.config import PrometheusExporter
from otel_llm.exporter.prometheus.endpoint import PrometheusEndpoint


class PrometheusComponent:
    """Serves the registry every component writes its telemetry to, so it is not in a signal's
    pipeline of kept traces: it runs when configured (and, with pipelines, when a pipeline lists it)."""

    def __init__(self, name: str, config: PrometheusExporter) -> None:
        self.name = name
        self.config = config
        self.endpoint: PrometheusEndpoint | None = None

    @property
    def port(self) -> int:
        return self.endpoint.port if self.endpoint is not None else 0

    def start(self, host: Host) -> None:
        if self.config.native_histograms:
            if host.recorder is None:
                raise OSError("native_histograms: the histograms come from processors.llm_metrics, which is not running")
            # Prometheus schemas stop at 8 (prometheus/docs native_histograms.md); a finer state kept
            # for an OTLP exporter is downscaled per scrape.
            host.recorder.keep_exponential(self.config.native_histogram_max_buckets, 8)
            host.recorder.native_max_size = self.config.native_histogram_max_buckets
        store = host.component("exporters.store")
        checks: list[Callable[[], str | None]] = ([store.problem] if store is not None else []) + [host.problem]

        def not_ready() -> str | None:
            for check in checks:
                if (reason := check()) is not None:
                    return reason
            return None

        self.endpoint = PrometheusEndpoint(self.config, host.registry, host.ready,
                                           store.reader() if store is not None else None,
                                           not_ready=not_ready)
        self.endpoint.start()

    def shutdown(self, grace_s: float) -> None:
        if self.endpoint is not None:
            self.endpoint.stop()


def create(config: PrometheusExporter, settings: CreateSettings) -> PrometheusComponent:
    return PrometheusComponent(settings.name, config)


FACTORY = Factory("prometheus", Kind.EXPORTER, PrometheusExporter, create, in_defaults=True, signal=Signal.TRACES)
