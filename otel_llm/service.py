"""Builds the pipeline and its receivers and exporters from a ``Config``, runs them, stops them."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry

from otel_llm.config import Config
from otel_llm.exporters.prometheus import PrometheusEndpoint
from otel_llm.metrics.exposition import RecorderCollector
from otel_llm.metrics.selftelemetry import SelfTelemetry
from otel_llm.pipeline import Pipeline
from otel_llm.receivers.otlp_grpc import OtlpGrpcReceiver
from otel_llm.receivers.otlp_http import OtlpHttpReceiver

log = logging.getLogger(__name__)


def _enabled(config: Config, kind: str, name: str) -> bool:
    pipeline = config.service.pipelines.traces
    return pipeline is None or name in getattr(pipeline, kind)


class Service:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.registry = CollectorRegistry(auto_describe=False)
        self.telemetry = SelfTelemetry(self.registry)
        self.pipeline = Pipeline(config, self.telemetry)
        self.registry.register(RecorderCollector(self.pipeline.recorder))
        self.ready = threading.Event()
        self.grpc: OtlpGrpcReceiver | None = None
        self.http: OtlpHttpReceiver | None = None
        self.prometheus: PrometheusEndpoint | None = None
        otlp = config.receivers.otlp
        if otlp is not None and _enabled(config, "receivers", "otlp"):
            if otlp.protocols.grpc is not None:
                self.grpc = OtlpGrpcReceiver(otlp.protocols.grpc, self.pipeline)
            if otlp.protocols.http is not None:
                self.http = OtlpHttpReceiver(otlp.protocols.http, self.pipeline)
        if config.exporters.prometheus is not None and _enabled(config, "exporters", "prometheus"):
            self.prometheus = PrometheusEndpoint(config.exporters.prometheus, self.registry, self.ready)
        self.store_path: Path | None = None
        if config.exporters.store is not None and _enabled(config, "exporters", "store"):
            self.store_path = Path(config.exporters.store.path)

    def start(self) -> None:
        """Start everything; ``/readyz`` turns 200 only once every receiver listens."""
        if self.store_path is not None:
            try:
                self.store_path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OSError(f"exporters.store.path: cannot create {self.store_path}: {exc.strerror or exc}") from None
        started: list[object] = []
        try:
            if self.prometheus is not None:
                self.prometheus.start()
                started.append(self.prometheus)
            self.pipeline.start()
            if self.grpc is not None:
                self.grpc.start()
                started.append(self.grpc)
            if self.http is not None:
                self.http.start()
                started.append(self.http)
        except Exception:
            self.stop()
            raise
        self.ready.set()

    def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting, complete every pending trace, then close the metrics endpoint last."""
        grace = self.config.service.shutdown_grace if grace_s is None else grace_s
        self.ready.clear()
        if self.grpc is not None:
            self.grpc.stop(grace)
        if self.http is not None:
            self.http.stop()
        self.pipeline.shutdown()
        if self.prometheus is not None:
            self.prometheus.stop()
