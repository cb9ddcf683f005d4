"""OTLP metrics and logs sent to the traces endpoint: accepted, counted, never stored.

An SDK configured by the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` sends all three signals to the
same host (``@opentelemetry/sdk-node`` does by default). otel-llm keeps traces only; answering
404 / ``UNIMPLEMENTED`` for the others made such an application log export errors forever. So
``POST /v1/metrics``, ``POST /v1/logs``, ``MetricsService/Export`` and ``LogsService/Export`` get
the same checks as traces (auth, size, media type, decoding), then a success answer; their items
(metric data points, log records) are counted in ``otel_llm_receiver_ignored_items_total{protocol,
signal}`` and dropped: nothing of them is kept, logged or stored (log bodies can hold content)."""

from __future__ import annotations

from google.protobuf.message import Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

SIGNALS = ("metrics", "logs")
PATHS = {"/v1/metrics": "metrics", "/v1/logs": "logs"}
GRPC_SERVICES = {"opentelemetry.proto.collector.metrics.v1.MetricsService": "metrics",
                 "opentelemetry.proto.collector.logs.v1.LogsService": "logs"}
_DATA_FIELDS = ("gauge", "sum", "histogram", "exponential_histogram", "summary")


def new_request(signal: str) -> Message:
    return ExportMetricsServiceRequest() if signal == "metrics" else ExportLogsServiceRequest()


def new_response(signal: str) -> Message:
    return ExportMetricsServiceResponse() if signal == "metrics" else ExportLogsServiceResponse()


def count_items(signal: str, request: Message) -> int:
    """Metric data points, or log records, in a decoded request."""
    items = 0
    if isinstance(request, ExportMetricsServiceRequest):
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    kind = metric.WhichOneof("data")
                    if kind in _DATA_FIELDS:
                        items += len(getattr(metric, kind).data_points)
    elif isinstance(request, ExportLogsServiceRequest):
        for resource_logs in request.resource_logs:
            for scope_logs in resource_logs.scope_logs:
                items += len(scope_logs.log_records)
    return items
