"""The OTLP trace transports of the queued exporters: gRPC (``exporters.otlp``) and HTTP
(``exporters.otlphttp``, one keep-alive session per sender thread). A transport sends one serialized
request once and classifies the outcome; retrying it is the queued exporter's job.

Retryable outcomes
    Retryable per the OTLP spec and as the Collector's exporters decide: gRPC ``UNAVAILABLE``,
    ``CANCELLED``, ``DEADLINE_EXCEEDED``, ``ABORTED``, ``OUT_OF_RANGE``, ``DATA_LOSS``, and
    ``RESOURCE_EXHAUSTED`` only when the server attached a ``google.rpc.RetryInfo`` (otherwise it
    is e.g. "message too large", which retrying cannot fix); HTTP 429, 502, 503, 504 and
    connection errors/timeouts. Everything else is permanent. A server hint (HTTP ``Retry-After``
    in seconds or as an HTTP date, gRPC ``RetryInfo.retry_delay``) is returned with the result as
    ``throttle_s``; each failure carries its ``failed_requests_total`` reason (``grpc_unavailable``,
    ``http_503``, ``connection_error``, ``timeout``, ...).

Transports
    gRPC: raw bytes through ``TraceService/Export`` (no serializer), ``headers`` as metadata,
    ``timeout`` per attempt (0 = none), gzip via ``grpc.Compression.Gzip``; the endpoint is
    ``host:port`` (TLS unless ``tls.insecure``), ``http://host:port`` (plaintext) or
    ``https://host:port`` (TLS); TLS uses ``tls.ca_file`` (else system roots) and the client
    ``cert_file``/``key_file`` (both or neither: a ValueError otherwise). The channel's reconnect backoff follows ``retry_on_failure`` so a
    backend that comes back is reached on the next retry. HTTP: ``POST <endpoint>/v1/traces``
    (used as is when the endpoint already ends with ``/v1/traces``), protobuf, gzip when
    configured (compressed once per request, not per attempt), one keep-alive ``http.client``
    connection per sender thread, reconnecting after any failure (a reused connection the server
    closed while idle is re-opened and the request re-sent once without counting a failure);
    ``https://`` uses the TLS files, and the scheme alone decides TLS (``tls.insecure`` is a gRPC
    option, as in the Collector). ``timeout`` bounds each socket operation.
"""

from __future__ import annotations

import email.utils
import gzip
import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from otel_llm import __version__
from otel_llm.exporter.otlp.config import OtlpTraceExporter

GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
USER_AGENT = f"otel-llm/{__version__}"

_GRPC_RETRYABLE = frozenset({
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
})
_HTTP_RETRYABLE = frozenset({429, 502, 503, 504})
# The most of a backend's answer read (as the Collector's otlphttp exporter): a partial-success
# response or an error status is far smaller; the rest of a bigger one is left unread and the
# connection closed, so a hostile or broken backend cannot fill the parent's memory.
MAX_RESPONSE_BYTES = 64 * 1024


def printable(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters with control characters escaped (``\\n``, ``\\x1b``):
    a backend's error text goes into otel-llm's log as one line, never as lines of its own."""
    text = text[:limit]
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclass(frozen=True)
class SendResult:
    """The outcome of one export attempt."""

    ok: bool
    retryable: bool = False
    reason: str = ""  # failed_requests_total label
    detail: str = ""  # for the log
    throttle_s: float | None = None  # server's retry hint
    rejected: int = 0
    rejected_message: str = ""


Session = TypeVar("Session")


class Transport(Protocol[Session]):
    """What the queued exporter needs of a transport; each sender thread holds one session of its own."""

    description: str

    def prepare(self, data: bytes) -> bytes: ...  # once per request, not per attempt (HTTP's gzip)
    def new_session(self) -> Session: ...
    def close_session(self, session: Session) -> None: ...
    def send(self, body: bytes, timeout_s: float | None, session: Session) -> SendResult: ...
    def abort(self) -> None: ...  # in-flight attempts fail at once (shutdown's end)
    def close(self) -> None: ...


def _partial_success(payload: bytes) -> tuple[int, str]:
    response = ExportTraceServiceResponse()
    try:
        response.ParseFromString(payload)
    except DecodeError:
        return 0, ""
    return response.partial_success.rejected_spans, response.partial_success.error_message


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OSError(f"tls.{what}: cannot read {path}: {exc.strerror or exc}") from None


def _grpc_retry_delay(exc: grpc.RpcError) -> float | None:
    """``RetryInfo.retry_delay`` from the ``google.rpc.Status`` in the trailers, if the server sent one."""
    try:
        trailers = exc.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - not every RpcError carries trailers
        return None
    for key, value in trailers:
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except DecodeError:
            return None
        for detail in status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                delay: float = info.retry_delay.seconds + info.retry_delay.nanos / 1e9  # google.rpc: untyped
                return max(0.0, delay)
    return None


class GrpcTransport:
    def __init__(self, settings: OtlpTraceExporter) -> None:
        endpoint = settings.endpoint.strip()
        scheme, sep, rest = endpoint.partition("://")
        if sep:
            target = rest.rstrip("/")
            secure = scheme.lower() == "https"
            if scheme.lower() not in ("http", "https"):
                raise ValueError(f"endpoint {endpoint!r}: expected host:port, http://host:port or https://host:port")
        else:
            target = endpoint
            secure = not settings.tls.insecure
        self.target = target
        retry = settings.retry_on_failure
        options = [
            ("grpc.primary_user_agent", USER_AGENT),
            # After a backend outage the channel must be ready to reconnect by our next retry, not
            # after grpc's own reconnect backoff (up to 120 s by default).
            ("grpc.initial_reconnect_backoff_ms", max(10, int(retry.initial_interval * 1000))),
            ("grpc.max_reconnect_backoff_ms", max(100, int(retry.max_interval * 1000))),
            ("grpc.enable_retries", 0),  # retries are ours, counted and bounded
        ]
        if secure:
            tls = settings.tls
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls.ca_file, "ca_file") if tls.ca_file else None,
                private_key=_read(tls.key_file, "key_file") if tls.key_file else None,
                certificate_chain=_read(tls.cert_file, "cert_file") if tls.cert_file else None,
            )
            self._channel = grpc.secure_channel(target, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._export = self._channel.unary_unary(GRPC_METHOD, request_serializer=None, response_deserializer=None)
        self._metadata = tuple((key.lower(), value) for key, value in settings.headers.items())
        self._compression = grpc.Compression.Gzip if settings.compression == "gzip" else None
        self.description = f"{'grpcs' if secure else 'grpc'}://{target}"

    def prepare(self, data: bytes) -> bytes:
        return data  # grpc compresses on the wire itself

    def new_session(self) -> None:
        return None

    def close_session(self, session: None) -> None:
        pass

    def send(self, body: bytes, timeout_s: float | None, session: None) -> SendResult:
        try:
            payload = self._export(body, timeout=timeout_s, metadata=self._metadata, compression=self._compression)
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
            details = exc.details() if callable(getattr(exc, "details", None)) else ""
            delay = _grpc_retry_delay(exc)
            retryable = code in _GRPC_RETRYABLE or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None)
            return SendResult(False, retryable, f"grpc_{code.name.lower()}", f"{code.name}: {printable(str(details))}",
                              delay)
        except ValueError as exc:  # "Cannot invoke RPC on closed channel!" while shutting down
            return SendResult(False, True, "client_closed", str(exc))
        rejected, message = _partial_success(payload or b"")
        return SendResult(True, rejected=rejected, rejected_message=message)

    def abort(self) -> None:
        self._channel.close()  # in-flight RPCs end CANCELLED at once

    def close(self) -> None:
        self._channel.close()


class HttpSession:
    def __init__(self) -> None:
        self.conn: http.client.HTTPConnection | None = None


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


class HttpTransport:
    def __init__(self, settings: OtlpTraceExporter) -> None:
        endpoint = settings.endpoint.strip()
        if "://" not in endpoint:
            endpoint = "http://" + endpoint
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"endpoint {settings.endpoint!r}: expected http://host:port or https://host:port")
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if self._https else 80)
        path = url.path.rstrip("/")
        if not path.endswith(TRACES_PATH):
            path += TRACES_PATH
        self._path = path + (f"?{url.query}" if url.query else "")
        self._context: ssl.SSLContext | None = None
        if self._https:
            tls = settings.tls
            if tls.ca_file:
                _read(tls.ca_file, "ca_file")
            self._context = ssl.create_default_context(cafile=tls.ca_file or None)
            if tls.cert_file:
                try:
                    self._context.load_cert_chain(tls.cert_file, tls.key_file or None)
                except (OSError, ssl.SSLError) as exc:
                    raise OSError(f"tls.cert_file/key_file: cannot load {tls.cert_file}: {exc}") from None
        self._gzip = settings.compression == "gzip"
        self._headers = {"Content-Type": PROTOBUF, "User-Agent": USER_AGENT, **settings.headers}
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._sessions: set[HttpSession] = set()
        self._lock = threading.Lock()
        netloc = f"[{self._host}]" if ":" in self._host else self._host
        self.description = f"{url.scheme}://{netloc}:{self._port}{self._path}"

    def prepare(self, data: bytes) -> bytes:
        return gzip.compress(data, compresslevel=6, mtime=0) if self._gzip else data

    def new_session(self) -> HttpSession:
        session = HttpSession()
        with self._lock:
            self._sessions.add(session)
        return session

    def close_session(self, session: HttpSession) -> None:
        self._disconnect(session)
        with self._lock:
            self._sessions.discard(session)

    @staticmethod
    def _disconnect(session: HttpSession) -> None:
        conn, session.conn = session.conn, None
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass

    def _connection(self, session: HttpSession, timeout_s: float | None) -> tuple[http.client.HTTPConnection, bool]:
        conn = session.conn
        if conn is not None:
            conn.timeout = timeout_s
            if conn.sock is not None:
                conn.sock.settimeout(timeout_s)
            return conn, True
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout_s, context=self._context)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
        session.conn = conn
        return conn, False

    def send(self, body: bytes, timeout_s: float | None, session: HttpSession) -> SendResult:
        for fresh_retry_allowed in (True, False):
            conn, reused = self._connection(session, timeout_s)
            try:
                conn.request("POST", self._path, body=body, headers=self._headers)
                response = conn.getresponse()
                payload = response.read(MAX_RESPONSE_BYTES + 1)
                if len(payload) > MAX_RESPONSE_BYTES:
                    payload = payload[:MAX_RESPONSE_BYTES]
                    response.will_close = True  # the rest stays unread: this connection cannot carry another request
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._disconnect(session)
                if reused and fresh_retry_allowed:
                    continue  # the server closed our idle keep-alive connection: reconnect and resend
                return SendResult(False, True, "connection_error", f"{type(exc).__name__}: {exc}")
            except TimeoutError as exc:
                self._disconnect(session)
                return SendResult(False, True, "timeout", f"no answer within {timeout_s}s: {exc}")
            except ssl.SSLError as exc:
                self._disconnect(session)
                return SendResult(False, True, "tls_error", str(exc))
            except (OSError, http.client.HTTPException) as exc:
                self._disconnect(session)
                return SendResult(False, True, "connection_error", f"{type(exc).__name__}: {exc}")
            if response.will_close:
                self._disconnect(session)
            return self._classify(response, payload)
        raise AssertionError("unreachable")

    @staticmethod
    def _classify(response: http.client.HTTPResponse, payload: bytes) -> SendResult:
        status = response.status
        content_type = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if 200 <= status < 300:
            rejected, message = _partial_success(payload) if content_type == PROTOBUF and payload else (0, "")
            return SendResult(True, rejected=rejected, rejected_message=message)
        detail = f"HTTP {status}"
        if content_type == PROTOBUF and payload:
            rpc_status = status_pb2.Status()
            try:
                rpc_status.ParseFromString(payload)
                detail += f": {printable(rpc_status.message)}"
            except DecodeError:
                pass
        elif payload:
            detail += f": {printable(payload[:300].decode('utf-8', 'replace').strip())}"
        retryable = status in _HTTP_RETRYABLE
        throttle = _retry_after(response.getheader("Retry-After")) if retryable else None
        return SendResult(False, retryable, f"http_{status}", detail, throttle)

    def abort(self) -> None:
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            conn = session.conn
            sock = conn.sock if conn is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # a blocked send/recv fails at once
                except OSError:
                    pass

    def close(self) -> None:
        pass
