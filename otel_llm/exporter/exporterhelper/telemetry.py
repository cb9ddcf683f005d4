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

from prometheus_client import CollectorRegistry

from otel_llm.internal.telemetry import TelemetryFamily

DROP_REASONS = ("queue_full", "permanent_error", "retries_exhausted", "retry_disabled", "shutdown",
                "storage_error", "corrupt_persisted")


_EXPORTERS = "exporters.otlp, exporters.otlphttp"
EXPORTER_ENQUEUED_SPANS = TelemetryFamily("otel_llm_exporter_enqueued_spans", "counter", "Spans accepted into the sending queue.",
                                 ("exporter",), _EXPORTERS)
EXPORTER_SENT_SPANS = TelemetryFamily("otel_llm_exporter_sent_spans", "counter", "Spans the backend accepted.", ("exporter",),
                             _EXPORTERS)
EXPORTER_SENT_REQUESTS = TelemetryFamily("otel_llm_exporter_sent_requests", "counter",
                                "Export requests the backend acknowledged.", ("exporter",), _EXPORTERS)
EXPORTER_FAILED_REQUESTS = TelemetryFamily(
    "otel_llm_exporter_failed_requests", "counter", "Failed export attempts (each attempt, retried or not), by reason.",
    ("exporter", "reason"), _EXPORTERS, "`reason`: `grpc_unavailable`, `http_503`, `connection_error`, `timeout`, ...")
EXPORTER_DROPPED_SPANS = TelemetryFamily(
    "otel_llm_exporter_dropped_spans", "counter", "Spans lost by the exporter (refused at submit or given up), by reason.",
    ("exporter", "reason"), _EXPORTERS, "`reason`: " + ", ".join(f"`{r}`" for r in DROP_REASONS) + ".")
EXPORTER_DROPPED_REQUESTS = TelemetryFamily(
    "otel_llm_exporter_dropped_requests", "counter", "Export requests lost by the exporter, by reason.",
    ("exporter", "reason"), _EXPORTERS, "`reason`: as `otel_llm_exporter_dropped_spans_total`.")
EXPORTER_RETRIES = TelemetryFamily("otel_llm_exporter_retries", "counter", "Export re-attempts after a retryable failure.",
                          ("exporter",), _EXPORTERS)
EXPORTER_REJECTED_SPANS = TelemetryFamily("otel_llm_exporter_rejected_spans", "counter",
                                 "Spans the backend rejected through OTLP partial success.", ("exporter",), _EXPORTERS)
EXPORTER_QUEUE_SIZE = TelemetryFamily("otel_llm_exporter_queue_size", "gauge",
                             "Export requests accepted and not yet finished (waiting or in flight).", ("exporter",),
                             _EXPORTERS)
EXPORTER_QUEUE_CAPACITY = TelemetryFamily("otel_llm_exporter_queue_capacity", "gauge",
                                 "Bound of the sending queue, in export requests.", ("exporter",), _EXPORTERS)


class ExporterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.enqueued_spans = EXPORTER_ENQUEUED_SPANS.counter(registry)
        self.sent_spans = EXPORTER_SENT_SPANS.counter(registry)
        self.sent_requests = EXPORTER_SENT_REQUESTS.counter(registry)
        self.failed_requests = EXPORTER_FAILED_REQUESTS.counter(registry)
        self.dropped_spans = EXPORTER_DROPPED_SPANS.counter(registry)
        self.dropped_requests = EXPORTER_DROPPED_REQUESTS.counter(registry)
        self.retries = EXPORTER_RETRIES.counter(registry)
        self.rejected_spans = EXPORTER_REJECTED_SPANS.counter(registry)
        self.queue_size = EXPORTER_QUEUE_SIZE.gauge(registry)
        self.queue_capacity = EXPORTER_QUEUE_CAPACITY.gauge(registry)


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, ExporterMetrics] = weakref.WeakKeyDictionary()
_METRICS_LOCK = threading.Lock()


def metrics_for(registry: CollectorRegistry) -> ExporterMetrics:
    """One set of metric families per registry, shared by every exporter (``otlp`` and ``otlphttp``)."""
    with _METRICS_LOCK:
        metrics = _METRICS.get(registry)
        if metrics is None:
            metrics = _METRICS[registry] = ExporterMetrics(registry)
        return metrics
