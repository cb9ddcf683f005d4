"""OTLP/gRPC receiver.

The handler takes the raw request bytes (no deserializer) so that a malformed message is
answered ``INVALID_ARGUMENT`` as the OTLP spec says, instead of grpcio's generic ``INTERNAL``.
Oversized messages are refused by grpcio itself with ``RESOURCE_EXHAUSTED``.
"""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_llm.config import GrpcProtocol, split_endpoint
from otel_llm.pipeline import Pipeline

log = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
PROTOCOL = "grpc"


class OtlpGrpcReceiver:
    def __init__(self, settings: GrpcProtocol, pipeline: Pipeline) -> None:
        self._settings = settings
        self._pipeline = pipeline
        self._server: grpc.Server | None = None
        self.port = 0

    def _export(self, payload: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        telemetry = self._pipeline.telemetry
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(payload)
        except DecodeError as exc:
            telemetry.requests_refused.labels(PROTOCOL, "malformed").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ExportTraceServiceRequest: {exc}")
        result = self._pipeline.consume(request, PROTOCOL)
        if result.rejected:
            return ExportTraceServiceResponse(
                partial_success=ExportTracePartialSuccess(rejected_spans=result.rejected, error_message=result.error_message)
            )
        return ExportTraceServiceResponse()

    def start(self) -> None:
        settings = self._settings
        max_bytes = settings.max_recv_msg_size_mib * 1024 * 1024
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="otlp-grpc"),
            options=[
                ("grpc.max_receive_message_length", max_bytes),
                ("grpc.max_concurrent_streams", settings.max_concurrent_streams),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=settings.workers * 16,
        )
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self._export,
                    request_deserializer=None,
                    response_serializer=ExportTraceServiceResponse.SerializeToString,
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))
        host, port = split_endpoint(settings.endpoint)
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = server.add_insecure_port(bind)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {settings.endpoint} for OTLP/gRPC: {exc}") from None
        if self.port == 0:
            raise OSError(f"cannot listen on {settings.endpoint} for OTLP/gRPC (address in use?)")
        server.start()
        self._server = server
        log.info("OTLP/gRPC receiver listening on %s:%d", host, self.port)

    def stop(self, grace_s: float) -> None:
        if self._server is not None:
            self._server.stop(grace_s).wait()
