"""OTLP/gRPC receiver.

The handler takes the raw request bytes (no deserializer) so that a malformed message is
answered ``INVALID_ARGUMENT`` as the OTLP spec says, instead of grpcio's generic ``INTERNAL``.
Oversized messages, and calls beyond ``maximum_concurrent_rpcs``, are refused by grpcio itself with
``RESOURCE_EXHAUSTED`` before the handler runs: the two refusals no counter sees.
"""

from __future__ import annotations

import logging
from concurrent import futures
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_llm.config import GrpcProtocol, split_endpoint
from otel_llm.receivers.admission import Admitter
from otel_llm.receivers.security import TokenCheck, read_bytes

log = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
PROTOCOL = "grpc"


@dataclass(frozen=True)
class _RpcStatus(grpc.Status):  # type: ignore[misc]
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, bytes], ...]


def retryable_status(message: str, retry_after_s: int) -> _RpcStatus:
    """UNAVAILABLE with a RetryInfo detail: the OTLP spec's retryable refusal, with a delay hint."""
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=retry_after_s))
    detail = any_pb2.Any()
    detail.Pack(retry)
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message, details=[detail])
    return _RpcStatus(grpc.StatusCode.UNAVAILABLE, message, (("grpc-status-details-bin", status.SerializeToString()),))


class OtlpGrpcReceiver:
    def __init__(self, settings: GrpcProtocol, admitter: Admitter) -> None:
        self._settings = settings
        self._admitter = admitter
        self._server: grpc.Server | None = None
        self._token = TokenCheck(settings.auth)
        self.port = 0

    def _export(self, payload: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        admitter = self._admitter
        if self._token.enabled:
            header = next((value for key, value in context.invocation_metadata() if key == "authorization"), None)
            if not self._token.allows(header if isinstance(header, str) else None):
                admitter.refuse_request(PROTOCOL, "unauthenticated")
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(payload)
        except DecodeError as exc:
            admitter.refuse_request(PROTOCOL, "malformed")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed ExportTraceServiceRequest: {exc}")
        result = admitter.admit(request, payload, PROTOCOL)
        if result.refused:
            admitter.refuse_request(PROTOCOL, result.refused)
            context.abort_with_status(retryable_status(f"refused: {result.refused}; retry later", result.retry_after_s))
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
            if settings.tls is not None:
                credentials = grpc.ssl_server_credentials(
                    [(read_bytes(settings.tls.key_file), read_bytes(settings.tls.cert_file))],
                    root_certificates=read_bytes(settings.tls.client_ca_file) if settings.tls.client_ca_file else None,
                    require_client_auth=bool(settings.tls.client_ca_file),
                )
                self.port = server.add_secure_port(bind, credentials)
            else:
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
