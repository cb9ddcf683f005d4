"""OTLP/HTTP receiver: ``POST /v1/traces``, protobuf or JSON, optionally gzip, answered per the
OTLP spec (``google.rpc.Status`` bodies on errors, partial success on rejected spans)."""

from __future__ import annotations

import logging
import threading
import zlib
from typing import ClassVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_llm.config import HttpProtocol
from otel_llm.httpserver import BackgroundHTTPServer, QuietHandler
from otel_llm.receivers.admission import RETRY_AFTER_S, SHUTTING_DOWN, Admitter
from otel_llm.receivers.otlp_json import OtlpJsonError, parse_otlp_json
from otel_llm.receivers.security import TokenCheck, server_ssl_context

log = logging.getLogger(__name__)

PROTOCOL = "http"
TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class BodyTooLarge(Exception):
    pass


def gunzip_bounded(data: bytes, limit: int) -> bytes:
    """Decompress, refusing to inflate past ``limit`` bytes (a gzip bomb costs us nothing)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = inflater.decompress(data, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise BodyTooLarge(f"decompressed body exceeds {limit} bytes")
    if not inflater.eof:
        raise ValueError("truncated gzip stream")
    return out


class RequestsInProgress:
    """Counts requests between their first header and their answer, so a stop can wait for them."""

    def __init__(self) -> None:
        self._count = 0
        self._cond = threading.Condition()

    def __enter__(self) -> None:
        with self._cond:
            self._count += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._cond:
            self._count -= 1
            if not self._count:
                self._cond.notify_all()

    @property
    def count(self) -> int:
        return self._count

    def wait_none(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._count, timeout_s)


class _Handler(QuietHandler):
    admitter: ClassVar[Admitter]
    max_body: ClassVar[int]
    token: ClassVar[TokenCheck]
    slots: ClassVar[threading.BoundedSemaphore]
    in_progress: ClassVar[RequestsInProgress]
    stopping: ClassVar[threading.Event]

    def _reply(self, status: int, message: Message, content_type: str, headers: dict[str, str] | None = None) -> None:
        if content_type == JSON:
            body = json_format.MessageToJson(message, indent=None).encode()
        else:
            body = message.SerializeToString()
        self.send_body(status, body, content_type, headers)

    def _error(self, status: int, code: int, text: str, content_type: str, reason: str,
               headers: dict[str, str] | None = None) -> None:
        self.admitter.refuse_request(PROTOCOL, reason)
        self._reply(status, status_pb2.Status(code=code, message=text), content_type, headers)

    def do_GET(self) -> None:
        self.send_body(405, b"use POST /v1/traces\n", "text/plain", {"Allow": "POST"})

    def do_POST(self) -> None:
        # Counted before ``stopping`` is read: a stop either waits for this request or it refuses.
        with self.in_progress:
            self._handle_post()

    def _handle_post(self) -> None:
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        reply_type = JSON if content_type == JSON else PROTOBUF
        if not self.token.allows(self.headers.get("Authorization")):
            self.close_connection = True  # the unread body must not be taken for the next request
            self._error(401, code_pb2.UNAUTHENTICATED, "missing or wrong bearer token", reply_type, "unauthenticated",
                        {"WWW-Authenticate": "Bearer"})
            return
        if self.stopping.is_set():
            # The server has stopped accepting connections, but a keep-alive connection's thread
            # still serves its next request: refuse it as gRPC refuses calls after its stop.
            self.close_connection = True
            self._error(503, code_pb2.UNAVAILABLE, "shutting down; retry later", reply_type, SHUTTING_DOWN,
                        {"Retry-After": str(RETRY_AFTER_S[SHUTTING_DOWN])})
            return
        if not self.slots.acquire(blocking=False):
            self.close_connection = True
            self._error(503, code_pb2.UNAVAILABLE, "too many concurrent requests; retry later", reply_type,
                        "too_many_requests", {"Retry-After": "1"})
            return
        try:
            self._post(content_type, reply_type)
        finally:
            self.slots.release()

    def _post(self, content_type: str, reply_type: str) -> None:
        if self.path.split("?")[0] != TRACES_PATH:
            self._discard_body()
            self._error(404, code_pb2.NOT_FOUND, f"unknown path {self.path[:100]}; OTLP traces go to {TRACES_PATH}",
                        reply_type, "not_found")
            return
        if content_type not in (PROTOBUF, JSON):
            self._discard_body()
            self._error(415, code_pb2.INVALID_ARGUMENT,
                        f"unsupported Content-Type {content_type!r}; use {PROTOBUF} or {JSON}", reply_type,
                        "unsupported_media_type")
            return
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            self.close_connection = True
            self._error(411, code_pb2.INVALID_ARGUMENT, "Content-Length is required", reply_type, "no_content_length")
            return
        length = int(length_header)
        if length > self.max_body:
            # Reading a body we will refuse is wasted work; closing makes the client stop sending.
            self.close_connection = True
            self._error(413, code_pb2.RESOURCE_EXHAUSTED, f"body of {length} bytes exceeds {self.max_body}",
                        reply_type, "too_large")
            return
        body = self.rfile.read(length)
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        try:
            if encoding == "gzip":
                body = gunzip_bounded(body, self.max_body)
            elif encoding not in ("identity", ""):
                self._error(415, code_pb2.INVALID_ARGUMENT, f"unsupported Content-Encoding {encoding!r}; use gzip",
                            reply_type, "unsupported_encoding")
                return
        except BodyTooLarge as exc:
            self._error(413, code_pb2.RESOURCE_EXHAUSTED, str(exc), reply_type, "too_large")
            return
        except (zlib.error, ValueError) as exc:
            self._error(400, code_pb2.INVALID_ARGUMENT, f"bad gzip body: {exc}", reply_type, "malformed")
            return
        payload: bytes | None = None
        try:
            if content_type == JSON:
                request = parse_otlp_json(body)
            else:
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                payload = body
        except (DecodeError, OtlpJsonError) as exc:
            self._error(400, code_pb2.INVALID_ARGUMENT, f"malformed ExportTraceServiceRequest: {exc}", reply_type,
                        "malformed")
            return
        result = self.admitter.admit(request, payload, PROTOCOL)
        if result.refused:
            status = 503 if result.refused in ("memory_limit", "shutting_down") else 429
            self._error(status, code_pb2.UNAVAILABLE, f"refused: {result.refused}; retry later", reply_type,
                        result.refused, {"Retry-After": str(result.retry_after_s)})
            return
        response = ExportTraceServiceResponse()
        if result.rejected:
            response.partial_success.CopyFrom(
                ExportTracePartialSuccess(rejected_spans=result.rejected, error_message=result.error_message))
        self._reply(200, response, reply_type)

    def _discard_body(self) -> None:
        length = self.headers.get("Content-Length")
        if length and length.isdigit() and int(length) <= self.max_body:
            self.rfile.read(int(length))
        else:
            self.close_connection = True


class OtlpHttpReceiver:
    def __init__(self, settings: HttpProtocol, admitter: Admitter) -> None:
        handler = type("OtlpHttpHandler", (_Handler,), {
            "admitter": admitter, "max_body": settings.max_request_body_size, "token": TokenCheck(settings.auth),
            "slots": threading.BoundedSemaphore(settings.max_concurrent_requests),
            "in_progress": RequestsInProgress(), "stopping": threading.Event()})
        tls = server_ssl_context(settings.tls) if settings.tls is not None else None
        self._handler = handler
        self._server = BackgroundHTTPServer(settings.endpoint, handler, "otlp-http", tls)

    @property
    def port(self) -> int:
        return self._server.port

    def start(self) -> None:
        self._server.start()
        log.info("OTLP/HTTP receiver listening on port %d", self.port)

    @property
    def requests_in_progress(self) -> int:
        return self._handler.in_progress.count

    def refuse_new(self) -> None:
        """From now on, requests that have not started are refused (``shutting_down``, retryable)."""
        self._handler.stopping.set()

    def stop(self, grace_s: float = 0.0) -> None:
        """Refuse new requests, close the listener, and give those in progress ``grace_s`` to finish."""
        self.refuse_new()
        self._server.stop()
        if not self._handler.in_progress.wait_none(grace_s):
            log.warning("OTLP/HTTP: %d requests still in progress after the %.1fs grace; "
                        "what they admit from now on is refused", self.requests_in_progress, grace_s)
