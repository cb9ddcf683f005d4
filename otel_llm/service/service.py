"""Builds the pipeline and its receivers and exporters from a ``Config``, runs them, stops them."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry

from otel_llm.config import Config, ConfigError, check_certificates, intake_log_directory
from otel_llm.exporter.exporterhelper.batcher import ExportBatcher
from otel_llm.exporter.otlp_metrics.exporter import MetricsPushExporter
from otel_llm.exporter.exporterhelper.trace_exporter import TraceExporter
from otel_llm.exporter.prometheus.endpoint import PrometheusEndpoint
from otel_llm.processor.llm_metrics.metrics.exposition import RecorderCollector
from otel_llm.processor.memory_limiter.limiter import intake_bytes_bound, memory_limits
from otel_llm.service.telemetry import SelfTelemetry
from otel_llm.service.graph import Pipeline
from otel_llm.service.processes import IngestProcesses
from otel_llm.receiver.otlp.intake_log import IntakeLogCollector, IntakeLogKeeper, IntakeLogSettings, IntakeLogShared
from otel_llm.receiver.otlp.process import IntakeState, ReceiverCounters, spawn_context
from otel_llm.exporter.store.sqlite import StoreReader, TraceStore

log = logging.getLogger(__name__)


def _enabled(config: Config, kind: str, name: str) -> bool:
    pipeline = config.service.pipelines.traces
    return pipeline is None or name in getattr(pipeline, kind)


class Service:
    def __init__(self, config: Config) -> None:
        """Raises ``OSError`` for a TLS certificate, key or CA file that cannot be loaded (before any
        component reads one: an encrypted key would make OpenSSL prompt for its passphrase)."""
        try:
            check_certificates(config)
        except ConfigError as exc:
            raise OSError(str(exc)) from None
        self.config = config
        self.registry = CollectorRegistry(auto_describe=False)
        otlp = config.receivers.otlp
        context = spawn_context()
        counters = ReceiverCounters(context)
        self.telemetry = SelfTelemetry(self.registry, counters)
        _, spike_bytes = memory_limits(config.processors.memory_limiter)
        intake = IntakeState(context, otlp.max_queued_spans if otlp is not None else 200_000,
                             intake_bytes_bound(spike_bytes))
        self.pipeline = Pipeline(config, self.telemetry, intake)
        self.registry.register(RecorderCollector(self.pipeline.recorder))
        self.ready = threading.Event()
        self._started: set[str] = set()  # what ``stop`` has to stop
        self.ingest: IngestProcesses | None = None
        self.prometheus: PrometheusEndpoint | None = None
        if otlp is not None and _enabled(config, "receivers", "otlp") and \
                (otlp.protocols.grpc is not None or otlp.protocols.http is not None):
            self.ingest = IngestProcesses(
                otlp, self.pipeline.digest_settings if config.service.adapter_process else None, intake, counters,
                self.pipeline.receive, self.pipeline.receive_failure, context)
        self.store: TraceStore | None = None
        store_config = config.exporters.store
        if store_config is not None and _enabled(config, "exporters", "store"):
            self.store = TraceStore(Path(store_config.path), store_config.retention,
                                    store_config.max_size_mib * 1024 * 1024, store_config.queue_size, self.registry,
                                    block_s=store_config.max_block, commit_interval_s=store_config.commit_interval)
            store = self.store
            self.pipeline.sinks["store"] = lambda request, _spans, records, policy: store.submit(request, records, policy)
        self.trace_exporters: list[TraceExporter] = []
        for name, protocol in (("otlp", "grpc"), ("otlphttp", "http")):
            settings = getattr(config.exporters, name)
            if settings is None or not _enabled(config, "exporters", name):
                continue
            exporter = TraceExporter(name, protocol, settings, self.registry)
            self.trace_exporters.append(exporter)
            batcher = ExportBatcher(exporter.submit, max_spans=settings.sending_queue.batch_max_spans,
                                    max_delay_s=settings.sending_queue.batch_timeout)
            self.pipeline.sinks[name] = lambda request, spans, _records, _policy, batcher=batcher: batcher.add(
                request, spans)
            self.pipeline.flushers.append(batcher.flush)
        # Validation has made sure that, with pipelines, a configured metrics exporter is listed in one.
        self.metrics_exporters: list[MetricsPushExporter] = []
        if config.exporters.otlp_metrics is not None:
            self.metrics_exporters.append(MetricsPushExporter("otlp_metrics", config.exporters.otlp_metrics,
                                                              self.pipeline.recorder, self.registry))
        self.intake_log: IntakeLogKeeper | None = None
        log_config = otlp.intake_log if otlp is not None else None
        if log_config is not None and self.ingest is not None:
            settings = IntakeLogSettings(intake_log_directory(config), log_config.fsync, log_config.fsync_interval,
                                         log_config.segment_size_mib << 20, log_config.max_size_mib << 20)
            self.intake_log = IntakeLogKeeper(settings, IntakeLogShared(context),
                                              config.processors.tail_sampling.decision_wait)
            self.pipeline.intake_log = self.intake_log
            if self.store is not None:  # a request is handled once its kept traces are written
                self.intake_log.barriers.append(self.store.flush)
            self.registry.register(IntakeLogCollector(self.intake_log))
        if config.exporters.prometheus is not None and _enabled(config, "exporters", "prometheus"):
            reader = StoreReader(self.store.path) if self.store is not None else None
            self.prometheus = PrometheusEndpoint(config.exporters.prometheus, self.registry, self.ready, reader,
                                                 not_ready=self.store.problem if self.store is not None else None)

    @property
    def grpc_port(self) -> int:
        return self.ingest.grpc_port if self.ingest is not None else 0

    @property
    def http_port(self) -> int:
        return self.ingest.http_port if self.ingest is not None else 0

    @property
    def failed(self) -> bool:
        """A part died that the process cannot run without (the receiver or adapter process)."""
        return self.ingest is not None and self.ingest.exited_unexpectedly.is_set()

    def start(self) -> None:
        """Start everything; ``/readyz`` turns 200 only once every receiver listens.

        Raises ``OSError`` naming the component that cannot start (a port in use, a store it cannot
        open), having stopped what had started: within seconds, whatever ``shutdown_grace`` is."""
        if self.store is not None:
            try:
                self.store.start()
            except (OSError, sqlite3.Error) as exc:
                raise OSError(f"exporters.store.path: cannot open {self.store.path}: {exc}") from None
            self._started.add("store")
        try:
            for exporter in self.trace_exporters:
                exporter.start()
                self._started.add("exporters")
            for metrics_exporter in self.metrics_exporters:
                metrics_exporter.start()
                self._started.add("metrics_exporters")
            if self.prometheus is not None:
                self.prometheus.start()
                self._started.add("prometheus")
            self.pipeline.start()
            self._started.add("pipeline")
            if self.intake_log is not None and self.ingest is not None:
                # Before the receivers listen: what was acknowledged before a crash goes first.
                try:
                    self.pipeline.replay(self.intake_log.recover())
                except OSError as exc:
                    raise OSError(f"receivers.otlp.intake_log: {exc}") from None
                self.ingest.intake_log = self.intake_log.receiver_settings()
                self.ingest.intake_log_shared = self.intake_log.shared
                self.intake_log.start()
                self._started.add("intake_log")
            if self.ingest is not None:
                self._started.add("ingest")  # a failed start has stopped its processes already
                self.ingest.start()
        except Exception:
            # Nothing was accepted yet: no grace period to give anyone.
            self.stop(grace_s=0.0)
            raise
        self.ready.set()

    def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting, complete every pending trace, then close the metrics endpoint last."""
        grace = self.config.service.shutdown_grace if grace_s is None else grace_s
        started = self._started
        self.ready.clear()
        if self.ingest is not None and "ingest" in started:
            self.ingest.stop(grace)  # returns once everything they admitted is in the intake
            if self.ingest.exited_unexpectedly.is_set():
                lost = self.pipeline.intake.forget_in_flight()
                if lost > 0:
                    self.telemetry.spans_dropped.labels("receiver_exit").inc(lost)
        if "pipeline" in started:
            self.pipeline.shutdown()  # every pending trace decided and handed to the store and exporters
        if self.store is not None and "store" in started:
            self.store.shutdown(grace)
        if self.intake_log is not None and "intake_log" in started:
            self.intake_log.close()  # what was handled leaves the log; anything else is replayed next time
        if "exporters" in started:
            for exporter in self.trace_exporters:
                exporter.shutdown(grace)
        if "metrics_exporters" in started:  # after the pipeline: the final push has every decided request
            for metrics_exporter in self.metrics_exporters:
                metrics_exporter.shutdown(grace)
        if self.prometheus is not None and "prometheus" in started:
            self.prometheus.stop()
        started.clear()
