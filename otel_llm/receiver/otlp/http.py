"""OTLP/HTTP receiver: ``POST /v1/traces``, protobuf or JSON, optionally gzip, answered per the
OTLP spec (``google.rpc.Status`` bodies on errors, partial success on rejected spans)."""

from __future__ import annotations

import logging
import re
import threading
import time
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

from otel_llm.receiver.otlp.config import HttpProtocol
from otel_llm.internal.httpserver import BackgroundHTTPServer, ConnectionLimits, QuietHandler
from otel_llm.receiver.otlp.admission import (
    BYTES_IN_FLIGHT,
    RETRY_AFTER_S,
    SHUTTING_DOWN,
    WAITABLE,
    Admitter,
    request_spans,
    usable_ids,
)
from otel_llm.receiver.otlp.otlpjson import OtlpJsonError, parse_otlp_json_cutting
from otel_llm.receiver.otlp.nesting import cut_deep_values, too_deep
from otel_llm.receiver.otlp.othersignals import PATHS, count_items, new_request, new_response
from otel_llm.internal.security import TokenCheck, server_ssl_context

log = logging.getLogger(__name__)

PROTOCOL = "http"
TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class BodyTooLarge(Exception):
    pass


_MAX_GZIP_MEMBERS = 1024  # each costs a decompressor
_GZIP_PIECE = 1 << 16  # input fed in pieces: a member's leftover input is copied at most this much
_GZIP_MAGIC = b"\x1f\x8b"


def gunzip_bounded(data: bytes, limit: int) -> bytes:
    """Decompress every member of a gzip stream (RFC 1952 allows several, concatenated), refusing
    to inflate past ``limit`` bytes in total (a gzip bomb costs us nothing). Zero padding after
    the last member is accepted, anything else after it is not (as Python's gzip module)."""
    view = memoryview(data)
    out: list[bytes] = []
    total = position = 0
    members = 1
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    while position < len(view):
        piece = view[position:position + _GZIP_PIECE]
        position += len(piece)
        chunk = inflater.decompress(piece, limit - total + 1)
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge(f"decompressed body exceeds {limit} bytes")
        out.append(chunk)
        if inflater.eof:
            position -= len(inflater.unused_data)
            if position == len(view):
                return b"".join(out)
            if view[position:position + 2] != _GZIP_MAGIC:
                if not bytes(view[position:]).strip(b"\x00"):
                    return b"".join(out)
                raise ValueError("data after the end of the gzip stream")
            members += 1
            if members > _MAX_GZIP_MEMBERS:
                raise ValueError(f"more than {_MAX_GZIP_MEMBERS} gzip members")
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    raise ValueError("truncated gzip stream")


class _BodyRefused(Exception):
    """A request body that cannot be taken: (HTTP status, google.rpc code, reason, message)."""

    def __init__(self, status: int, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.reason = status, code, reason


_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]{1,15}")
_MAX_CHUNK_LINE = 1024
_MAX_TRAILERS = 64


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


class BytesInFlight:
    """The bytes of request bodies held at once, over every connection: reserved before a body is
    read (or as each chunk arrives, or once it is decompressed), released when its request ends."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()

    def reserve(self, size: int) -> bool:
        with self._lock:
            if self._held + size > self.limit:
                return False
            self._held += size
            return True

    def release(self, size: int) -> None:
        with self._lock:
            self._held -= size

    @property
    def held(self) -> int:
        return self._held


class _Handler(QuietHandler):
    admitter: ClassVar[Admitter]
    in_flight: ClassVar[BytesInFlight]
    reserved = 0  # this request's share of ``in_flight``
    signal = "traces"  # this request's: "metrics" and "logs" are counted and dropped
    admission_wait: ClassVar[float] = 0.0  # receivers.otlp.admission_wait
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
        path = self.path.split("?")[0]
        self.signal = PATHS.get(path, "traces")  # metrics and logs: counted and dropped (othersignals.py)
        if path != TRACES_PATH and path not in PATHS:
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
        # The whole body is read before a slot is taken: a client trickling its body holds its own
        # connection (until read_timeout), never the capacity other clients' requests need.
        self.reserved = 0
        try:
            self._handle_body(content_type, reply_type)
        finally:
            self.in_flight.release(self.reserved)

    def _reserve(self, size: int) -> None:
        if not self.in_flight.reserve(size):
            raise _BodyRefused(503, code_pb2.UNAVAILABLE, BYTES_IN_FLIGHT,
                               f"{self.in_flight.limit} bytes of request bodies already in flight; retry later")
        self.reserved += size

    def _handle_body(self, content_type: str, reply_type: str) -> None:
        try:
            body = self._read_body()
        except _BodyRefused as refused:
            self.close_connection = True  # what is left of the body must not be taken for a request
            if self.expired:  # cut by the deadline watchdog, which counted it
                self._reply(408, status_pb2.Status(code=code_pb2.DEADLINE_EXCEEDED,
                                                   message=f"request not complete within its deadline ({self.expired})"),
                            reply_type)
                return
            self._error(refused.status, refused.code, str(refused), reply_type, refused.reason,
                        {"Retry-After": "1"} if refused.status == 503 else None)
            return
        self.body_read()
        if not self.slots.acquire(blocking=False):
            self.close_connection = True
            self._error(503, code_pb2.UNAVAILABLE, "too many concurrent requests; retry later", reply_type,
                        "too_many_requests", {"Retry-After": "1"})
            return
        try:
            self._post(body, content_type, reply_type)
        finally:
            self.slots.release()

    def _read_body(self) -> bytes:
        """The request's body as sent (Content-Length or chunked), within ``max_body`` bytes."""
        transfer_encoding = self.headers.get("Transfer-Encoding")
        if transfer_encoding is not None:
            if transfer_encoding.strip().lower() != "chunked" or self.headers.get("Content-Length") is not None:
                # Both framings at once is how requests are smuggled past proxies: refuse it.
                raise _BodyRefused(400, code_pb2.INVALID_ARGUMENT, "malformed",
                                   f"unsupported Transfer-Encoding {transfer_encoding[:40]!r} (only chunked, "
                                   "without Content-Length)")
            return self._read_chunked()
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            raise _BodyRefused(411, code_pb2.INVALID_ARGUMENT, "no_content_length",
                               "Content-Length (or Transfer-Encoding: chunked) is required")
        length = int(length_header)
        if length > self.max_body:
            # Reading a body we will refuse is wasted work; closing makes the client stop sending.
            raise _BodyRefused(413, code_pb2.RESOURCE_EXHAUSTED, "too_large",
                               f"body of {length} bytes exceeds {self.max_body}")
        self._reserve(length)
        body = self.rfile.read(length)
        if len(body) < length:
            raise _BodyRefused(400, code_pb2.INVALID_ARGUMENT, "incomplete_body",
                               f"body ended after {len(body)} of its {length} bytes")
        return body

    def _read_chunked(self) -> bytes:
        rfile = self.rfile
        chunks: list[bytes] = []
        total = 0
        while True:
            line = rfile.readline(_MAX_CHUNK_LINE + 1)
            if not line.endswith(b"\n"):
                if len(line) > _MAX_CHUNK_LINE:
                    raise _BodyRefused(400, code_pb2.INVALID_ARGUMENT, "malformed", "chunk size line too long")
                raise _BodyRefused(400, code_pb2.INVALID_ARGUMENT, "incomplete_body",
                                   f"chunked body ended after {total} bytes, before its last chunk")
            size_text = line.split(b";", 1)[0].strip()  # chunk extensions are ignored
            if not _CHUNK_SIZE.fullmatch(size_text):
                raise _BodyRefused(400, code_pb2.INVALID_ARGUMENT, "malformed",
                                   f"bad chunk size {size_text[:20]!r}")
            size = int(size_text, 16)
            if not size:
                break
            total += size
            if total > self.max_body:
                raise _BodyRefused(413, code_pb2.RESOURCE_EXHAUSTED, "too_large",
                                   f"chunked body exceeds {self.max_body} bytes")
            self._reserve(size)
            data = rfile.read(size)
            if len(data) < size or rfile.readline(3) not in (b"\r\n", b"\n"):
                if len(data) == size and not self.expired:
                    raise _BodyRefused(400, code_pb2.INVALID_ARGUMENT, "malformed", "chunk not followed by CRLF")
                raise _BodyRefused(400, code_pb2.INVALID_ARGUMENT, "incomplete_body",
                                   f"chunked body ended inside a chunk, after {total - size + len(data)} bytes")
            chunks.append(data)
        for _ in range(_MAX_TRAILERS):
            line = rfile.readline(65537)
            if line in (b"\r\n", b"\n"):
                return b"".join(chunks)
            if not line.endswith(b"\n"):
                raise _BodyRefused(400, code_pb2.INVALID_ARGUMENT, "incomplete_body", "chunked body ended in its trailers")
        raise _BodyRefused(400, code_pb2.INVALID_ARGUMENT, "malformed", f"more than {_MAX_TRAILERS} trailer lines")

    def _post(self, body: bytes, content_type: str, reply_type: str) -> None:
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        try:
            if encoding == "gzip":
                body = gunzip_bounded(body, self.max_body)
                if not self.in_flight.reserve(len(body)):
                    self._error(503, code_pb2.UNAVAILABLE, f"{self.in_flight.limit} bytes of request bodies already "
                                "in flight; retry later", reply_type, BYTES_IN_FLIGHT, {"Retry-After": "1"})
                    return
                self.reserved += len(body)
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
        if self.signal != "traces":
            self._other_signal(body, content_type, reply_type)
            return
        payload: bytes | None = None
        request: ExportTraceServiceRequest | None = None
        ids = usable_ids(body) if content_type != JSON else None
        try:
            if ids is not None:  # not parsed: the core checked its bytes and every span's ids
                payload = body
            elif content_type == JSON:
                request, cuts = parse_otlp_json_cutting(body)
                if cuts:  # attribute values nested past the decoder's depth: cut there, the rest admitted
                    self.admitter.cut_values(PROTOCOL, cuts)
            else:
                request = ExportTraceServiceRequest()
                payload = body
                try:
                    request.ParseFromString(body)
                except DecodeError as exc:
                    cut = cut_deep_values(body) if too_deep(exc) else None
                    if cut is None:
                        raise
                    # Attribute values nested past the decoder's depth: cut there, the rest admitted.
                    payload, cuts = cut
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(payload)
                    self.admitter.cut_values(PROTOCOL, cuts)
        except (DecodeError, OtlpJsonError) as exc:
            self._error(400, code_pb2.INVALID_ARGUMENT, f"malformed ExportTraceServiceRequest: {exc}", reply_type,
                        "malformed")
            return
        except Exception as exc:  # noqa: BLE001 - a shape no check foresaw: still a counted 400, never a dead handler
            log.debug("OTLP/HTTP: undecodable body", exc_info=True)
            self._error(400, code_pb2.INVALID_ARGUMENT, f"malformed ExportTraceServiceRequest: {type(exc).__name__}",
                        reply_type, "malformed")
            return
        if self.admission_wait:
            self._wait_for_room(request_spans(request, ids), len(body))
        result = self.admitter.admit(request, payload, PROTOCOL, ids)
        if result.refused:
            status = 503 if result.refused in ("memory_limit", "shutting_down", "intake_log_error") else 429
            self._error(status, code_pb2.UNAVAILABLE, f"refused: {result.refused}; retry later", reply_type,
                        result.refused, {"Retry-After": str(result.retry_after_s)})
            return
        response = ExportTraceServiceResponse()
        if result.rejected:
            response.partial_success.CopyFrom(
                ExportTracePartialSuccess(rejected_spans=result.rejected, error_message=result.error_message))
        self._reply(200, response, reply_type)

    def _wait_for_room(self, spans: int, size: int) -> None:
        """Up to ``admission_wait`` for the intake to have room (this connection's thread waits)."""
        room = self.admitter.room
        if room(spans, size) not in WAITABLE:
            return
        deadline = time.monotonic() + self.admission_wait
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.01, left))
            if room(spans, size) not in WAITABLE:
                return

    def _other_signal(self, body: bytes, content_type: str, reply_type: str) -> None:
        """OTLP metrics or logs: decoded (a malformed one is a counted 400, as for traces), their
        items counted, then dropped; the answer is a success so that the sender stops retrying."""
        signal = self.signal
        request = new_request(signal)
        try:
            if content_type == JSON:
                json_format.Parse(body, request, ignore_unknown_fields=True)
            else:
                request.ParseFromString(body)
        except Exception:  # noqa: BLE001 - DecodeError, json_format.ParseError, a shape no check foresaw
            self._error(400, code_pb2.INVALID_ARGUMENT, f"malformed OTLP {signal} request", reply_type, "malformed")
            return
        self.admitter.ignore(PROTOCOL, signal, count_items(signal, request))
        self._reply(200, new_response(signal), reply_type)

    def _discard_body(self) -> None:
        length = self.headers.get("Content-Length")
        if length and length.isdigit() and int(length) <= self.max_body \
                and self.headers.get("Transfer-Encoding") is None:
            self.rfile.read(int(length))
        else:
            self.close_connection = True


class OtlpHttpReceiver:
    def __init__(self, settings: HttpProtocol, admitter: Admitter, admission_wait_s: float = 0.0) -> None:
        # The handler class's state, kept here too: ``type()`` builds a class mypy knows only as ``type``.
        self._in_progress = RequestsInProgress()
        self._stopping = threading.Event()
        handler = type("OtlpHttpHandler", (_Handler,), {
            "admitter": admitter, "max_body": settings.max_request_body_size, "token": TokenCheck(settings.auth),
            "in_flight": BytesInFlight(settings.max_bytes_in_flight),
            "slots": threading.BoundedSemaphore(settings.max_concurrent_requests),
            "in_progress": self._in_progress, "stopping": self._stopping, "timeout": settings.idle_timeout,
            "admission_wait": admission_wait_s})
        tls = server_ssl_context(settings.tls) if settings.tls is not None else None
        limits = ConnectionLimits(max_connections=settings.max_connections,
                                  header_timeout_s=settings.read_header_timeout,
                                  request_timeout_s=settings.read_timeout,
                                  on_refused=lambda reason: admitter.refuse_request(PROTOCOL, reason))
        self._server = BackgroundHTTPServer(settings.endpoint, handler, "otlp-http", tls, limits)

    @property
    def port(self) -> int:
        return self._server.port

    def start(self) -> None:
        self._server.start()
        log.info("OTLP/HTTP receiver listening on port %d", self.port)

    @property
    def requests_in_progress(self) -> int:
        return self._in_progress.count

    def refuse_new(self) -> None:
        """From now on, requests that have not started are refused (``shutting_down``, retryable)."""
        self._stopping.set()

    def stop(self, grace_s: float = 0.0) -> None:
        """Refuse new requests, close the listener, and give those in progress ``grace_s`` to finish."""
        self.refuse_new()
        self._server.stop()
        if not self._in_progress.wait_none(grace_s):
            log.warning("OTLP/HTTP: %d requests still in progress after the %.1fs grace; "
                        "what they admit from now on is refused", self.requests_in_progress, grace_s)
