"""OTLP metrics and logs sent to otel-llm (issue 24, item 13): an SDK configured by the standard
``OTEL_EXPORTER_OTLP_*`` variables sends all three signals to one endpoint. otel-llm keeps traces
only: the others are accepted (so the application logs no export error), counted by signal in
``otel_llm_receiver_ignored_items_total``, and never stored. Sent by the real Python SDK's metric
and log exporters, over gRPC and HTTP."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource

from otel_llm.exporter.store.sqlite import StoreReader
from tests.test_bad_input import http_post

SECRET = "the prompt text that must never be stored"


def _metric_exporter(server, protocol: str):  # noqa: ANN001, ANN202
    if protocol == "grpc":
        return GrpcMetricExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True, timeout=10)
    return HttpMetricExporter(endpoint=f"http://127.0.0.1:{server.http_port}/v1/metrics", timeout=10)


def _log_exporter(server, protocol: str):  # noqa: ANN001, ANN202
    if protocol == "grpc":
        return GrpcLogExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True, timeout=10)
    return HttpLogExporter(endpoint=f"http://127.0.0.1:{server.http_port}/v1/logs", timeout=10)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sdk_metrics_and_logs_are_accepted_counted_and_not_stored(server, protocol: str, tmp_path):
    # Metrics: 3 instruments, 5 data points (a counter with 2 attribute sets, a histogram, an up-down counter with 2).
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "app"}))
    meter = meters.get_meter("app")
    counter = meter.create_counter("requests")
    counter.add(1, {"route": "/a"})
    counter.add(2, {"route": "/b"})
    meter.create_histogram("latency").record(0.5)
    gauge = meter.create_up_down_counter("inflight")
    gauge.add(1, {"pool": "x"})
    gauge.add(1, {"pool": "y"})
    data = reader.get_metrics_data()
    assert data is not None
    exporter = _metric_exporter(server, protocol)
    assert exporter.export(data) == MetricExportResult.SUCCESS
    exporter.shutdown()
    meters.shutdown()

    # Logs: 4 records through the SDK's logging bridge, one holding content.
    log_exporter = _log_exporter(server, protocol)
    failures: list[str] = []

    class Failures(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                failures.append(record.getMessage())

    watcher = Failures()
    logging.getLogger("opentelemetry").addHandler(watcher)
    providers = LoggerProvider(resource=Resource.create({"service.name": "app"}))
    providers.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
    app_log = logging.getLogger(f"app-{protocol}")
    app_log.propagate = False
    app_log.addHandler(LoggingHandler(logger_provider=providers))
    try:
        for index in range(3):
            app_log.warning("request %d done", index)
        app_log.warning(SECRET)
        providers.shutdown()
    finally:
        logging.getLogger("opentelemetry").removeHandler(watcher)
    assert failures == [], "the SDK reported export failures"

    scrape = server.wait_until(lambda s: s.value("otel_llm_receiver_ignored_items_total", protocol=protocol,
                                                 signal="logs") == 4, what="the log records counted")
    assert scrape.value("otel_llm_receiver_ignored_items_total", protocol=protocol, signal="metrics") == 5
    assert scrape.value("otel_llm_receiver_refused_requests_total") == 0
    assert scrape.value("otel_llm_receiver_accepted_spans_total") == 0
    assert SECRET not in scrape.text
    store = server.service.store
    assert store is not None
    assert StoreReader(store.path).list_requests(limit=100) == []
    for path in store.path.parent.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_a_malformed_metrics_body_is_a_counted_400(server):
    status, _, _ = http_post(server, b"\xff\xff\xff not protobuf", path="/v1/metrics")
    assert status == 400
    scrape = server.wait_until(lambda s: s.value("otel_llm_receiver_refused_requests_total", reason="malformed") == 1,
                               what="the malformed request counted")
    assert scrape.value("otel_llm_receiver_ignored_items_total") == 0


def test_the_readme_range_table_durations_are_what_validate_accepts():
    """The table of ranges (once in the README, now docs/configuration.md) once said ``3650d``, which ``validate`` refuses (durations have no
    ``d``, as in the Collector): every duration in it must load."""
    import re
    from pathlib import Path

    from otel_llm.confmap import parse_duration

    readme = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    durations = re.findall(r"\| `[^`|]+` \| (?:\d+(?:ms|s|m|h|d)?) – (\d+(?:ms|s|m|h|d)) ", readme)
    assert "87600h" in durations
    for duration in durations:
        parse_duration(duration, "docs/configuration.md")
