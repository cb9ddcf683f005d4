"""The queued trace exporters' self-telemetry: one set of metric families per registry, shared by
``exporters.otlp`` and ``exporters.otlphttp``.

Counting (prefix ``otel_llm_exporter_``, label ``exporter`` = the exporter's name)
    ``sent_spans_total`` counts spans the backend accepted (a request's spans minus those it
    rejected through OTLP partial success, which go to ``rejected_spans_total``),
    ``sent_requests_total`` requests it acknowledged. ``dropped_spans_total{reason}`` and
    ``dropped_requests_total{reason}`` cover every request accepted and then lost, plus refused
    submits; reasons: ``queue_full``, ``permanent_error``, ``retries_exhausted``,
    ``retry_disabled``, ``shutdown``, ``storage_error`` (the file could not be written: the submit
    is refused), ``corrupt_persisted``. Every failed attempt is counted in
    ``failed_requests_total{reason}`` (``grpc_unavailable``, ``http_503``, ``connection_error``,
    ``timeout``, ...) and every re-attempt in ``retries_total``. ``queue_size`` (gauge) is the
    number of requests accepted and not yet finished, ``queue_capacity`` the queue's bound.
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge

DROP_REASONS = ("queue_full", "permanent_error", "retries_exhausted", "retry_disabled", "shutdown",
                "storage_error", "corrupt_persisted")


class ExporterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str, labels: list[str]) -> Counter:
            return Counter(f"otel_llm_exporter_{name}", doc, labels, registry=registry)

        self.enqueued_spans = counter("enqueued_spans", "Spans accepted into the sending queue.", ["exporter"])
        self.sent_spans = counter("sent_spans", "Spans the backend accepted.", ["exporter"])
        self.sent_requests = counter("sent_requests", "Export requests the backend acknowledged.", ["exporter"])
        self.failed_requests = counter(
            "failed_requests", "Failed export attempts (each attempt, retried or not), by reason.", ["exporter", "reason"])
        self.dropped_spans = counter(
            "dropped_spans", "Spans lost by the exporter (refused at submit or given up), by reason.", ["exporter", "reason"])
        self.dropped_requests = counter(
            "dropped_requests", "Export requests lost by the exporter, by reason.", ["exporter", "reason"])
        self.retries = counter("retries", "Export re-attempts after a retryable failure.", ["exporter"])
        self.rejected_spans = counter(
            "rejected_spans", "Spans the backend rejected through OTLP partial success.", ["exporter"])
        self.queue_size = Gauge(
            "otel_llm_exporter_queue_size", "Export requests accepted and not yet finished (waiting or in flight).",
            ["exporter"], registry=registry)
        self.queue_capacity = Gauge(
            "otel_llm_exporter_queue_capacity", "Bound of the sending queue, in export requests.", ["exporter"],
            registry=registry)


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, ExporterMetrics] = weakref.WeakKeyDictionary()
_METRICS_LOCK = threading.Lock()


def metrics_for(registry: CollectorRegistry) -> ExporterMetrics:
    """One set of metric families per registry, shared by every exporter (``otlp`` and ``otlphttp``)."""
    with _METRICS_LOCK:
        metrics = _METRICS.get(registry)
        if metrics is None:
            metrics = _METRICS[registry] = ExporterMetrics(registry)
        return metrics
