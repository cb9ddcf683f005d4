"""OTLP trace exporter: kept traces out to Tempo, Jaeger or another collector over OTLP/gRPC
(``exporters.otlp``) or OTLP/HTTP (``exporters.otlphttp``), with the Collector exporterhelper's
retry, bounded sending queue and optional on-disk queue.

How it behaves (what an SRE who knows the Collector should expect, and where it differs):

Queue
    ``submit`` never blocks on the network: it serializes the request once, counts its spans once,
    and hands it to a bounded queue served by ``sending_queue.num_consumers`` sender threads.
    The queue bound ``sending_queue.queue_size`` counts every request accepted and not yet
    finished: waiting *and* in flight (retrying) *and* replayed from disk. So with the backend
    down exactly ``queue_size`` requests are held; the next ``submit`` returns False and its spans
    are counted in ``dropped_spans_total{reason="queue_full"}`` (the Collector's
    ``enqueue_failed_spans``). ``queue_size`` (gauge) is that count, ``queue_capacity`` the bound.

``sending_queue.enabled: false``
    The Collector then exports synchronously in the caller's goroutine, pushing back on the
    pipeline. Our pipeline must never block, so the nearest equivalent is a queue with no waiting
    room: capacity = ``num_consumers``, i.e. a request is accepted only when a sender is free to
    take it now; otherwise ``submit`` returns False (``queue_full``). ``storage`` is ignored (with a
    warning), as the Collector ignores its storage when the queue is off.

Retry (``retry_on_failure``)
    Retryable per the OTLP spec and as the Collector's exporters decide: gRPC ``UNAVAILABLE``,
    ``CANCELLED``, ``DEADLINE_EXCEEDED``, ``ABORTED``, ``OUT_OF_RANGE``, ``DATA_LOSS``, and
    ``RESOURCE_EXHAUSTED`` only when the server attached a ``google.rpc.RetryInfo`` (otherwise it
    is e.g. "message too large", which retrying cannot fix); HTTP 429, 502, 503, 504 and
    connection errors/timeouts. Everything else is permanent: the request is dropped
    (``dropped_spans_total{reason="permanent_error"}``), never retried. Waits: the first is
    ``initial_interval``, each next one ``multiplier`` times longer up to ``max_interval``, each
    with ±20% jitter; a server hint (HTTP ``Retry-After`` in seconds or as an HTTP date, gRPC
    ``RetryInfo.retry_delay``) lengthens the wait to at least the hint. When the next wait would
    end past ``max_elapsed_time`` since the first attempt (0 = never give up), the request is
    dropped with reason ``retries_exhausted``; with ``enabled: false`` a retryable failure drops it
    at once, reason ``retry_disabled``. Every failed attempt is counted in
    ``failed_requests_total{reason}`` (``grpc_unavailable``, ``http_503``, ``connection_error``,
    ``timeout``, ...) and every re-attempt in ``retries_total``. A warning is logged on the first
    failure of a streak and an info line on recovery; the rest go to debug.

On-disk queue (``sending_queue.storage`` = a directory, created if missing)
    Each accepted request is written to ``<seq>-<unix_ns>.otlpq`` (temp file, fsync, rename,
    directory fsync) before ``submit`` returns True, and deleted once the backend acknowledged it
    or it was dropped for good. ``start()`` first loads the files already there, oldest first, so a
    SIGKILL and restart delivers what was queued (at least once: a request in flight at the crash
    may be sent again). The files count towards ``queue_size``; if more than ``queue_size`` were
    left, all are still replayed and new submits are refused until the queue drains below the
    bound. A file that is truncated, fails its CRC or has a bad header is counted in
    ``dropped_spans_total`` / ``dropped_requests_total{reason="corrupt_persisted"}`` and renamed
    ``*.corrupt`` for inspection, never loaded again. The directory is locked (``flock`` on
    ``.lock``) so two exporters cannot share it.

Shutdown
    ``shutdown(timeout_s)`` stops accepting (later submits are dropped, reason ``shutdown``),
    keeps sending — with the normal backoff — until the queue is empty or the timeout, then
    cancels in-flight attempts. What remains stays on disk when ``storage`` is set, otherwise
    it is counted as dropped, reason ``shutdown``. Attempts made during shutdown use a timeout no
    longer than what is left of it.

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

Counting (prefix ``otel_llm_exporter_``, label ``exporter`` = the exporter's name)
    ``sent_spans_total`` counts spans the backend accepted (a request's spans minus those it
    rejected through OTLP partial success, which go to ``rejected_spans_total``),
    ``sent_requests_total`` requests it acknowledged. ``dropped_spans_total{reason}`` and
    ``dropped_requests_total{reason}`` cover every request accepted and then lost, plus refused
    submits; reasons: ``queue_full``, ``permanent_error``, ``retries_exhausted``,
    ``retry_disabled``, ``shutdown``, ``storage_error`` (the file could not be written: the submit
    is refused), ``corrupt_persisted``.
"""

from __future__ import annotations

import email.utils
import errno
import fcntl
import gzip
import http.client
import logging
import os
import random
import socket
import ssl
import struct
import threading
import time
import weakref
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client import CollectorRegistry, Counter, Gauge

from otel_llm import __version__
from otel_llm.exporter.otlp.config import OtlpTraceExporter

log = logging.getLogger(__name__)

GRPC_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
USER_AGENT = f"otel-llm/{__version__}"

DROP_REASONS = ("queue_full", "permanent_error", "retries_exhausted", "retry_disabled", "shutdown",
                "storage_error", "corrupt_persisted")

_GRPC_RETRYABLE = frozenset({
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
})
_HTTP_RETRYABLE = frozenset({429, 502, 503, 504})
_JITTER = 0.2


# --- self-telemetry --------------------------------------------------------------------------


class _Metrics:
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


_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, _Metrics] = weakref.WeakKeyDictionary()
_METRICS_LOCK = threading.Lock()


def _metrics_for(registry: CollectorRegistry) -> _Metrics:
    """One set of metric families per registry, shared by every exporter (``otlp`` and ``otlphttp``)."""
    with _METRICS_LOCK:
        metrics = _METRICS.get(registry)
        if metrics is None:
            metrics = _METRICS[registry] = _Metrics(registry)
        return metrics


# --- queue items and attempt results ---------------------------------------------------------


@dataclass(eq=False)
class _Item:
    seq: int
    data: bytes
    spans: int
    path: Path | None = None
    done: bool = False


@dataclass(frozen=True)
class _Result:
    ok: bool
    retryable: bool = False
    reason: str = ""  # failed_requests_total label
    detail: str = ""  # for the log
    throttle_s: float | None = None  # server's retry hint
    rejected: int = 0
    rejected_message: str = ""


def count_spans(request: ExportTraceServiceRequest) -> int:
    return sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)


def _partial_success(payload: bytes) -> tuple[int, str]:
    response = ExportTraceServiceResponse()
    try:
        response.ParseFromString(payload)
    except DecodeError:
        return 0, ""
    return response.partial_success.rejected_spans, response.partial_success.error_message


# --- transports ------------------------------------------------------------------------------


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OSError(f"tls.{what}: cannot read {path}: {exc.strerror or exc}") from None


def _grpc_retry_delay(exc: grpc.RpcError) -> float | None:
    """``RetryInfo.retry_delay`` from the ``google.rpc.Status`` in the trailers, if the server sent one."""
    try:
        trailers = exc.trailing_metadata() or ()  # type: ignore[attr-defined]
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
                return max(0.0, info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


class _GrpcTransport:
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

    def send(self, body: bytes, timeout_s: float | None, session: None) -> _Result:
        try:
            payload = self._export(body, timeout=timeout_s, metadata=self._metadata, compression=self._compression)
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
            details = exc.details() if callable(getattr(exc, "details", None)) else ""  # type: ignore[attr-defined]
            delay = _grpc_retry_delay(exc)
            retryable = code in _GRPC_RETRYABLE or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None)
            return _Result(False, retryable, f"grpc_{code.name.lower()}", f"{code.name}: {details}", delay)
        except ValueError as exc:  # "Cannot invoke RPC on closed channel!" while shutting down
            return _Result(False, True, "client_closed", str(exc))
        rejected, message = _partial_success(payload or b"")
        return _Result(True, rejected=rejected, rejected_message=message)

    def abort(self) -> None:
        self._channel.close()  # in-flight RPCs end CANCELLED at once

    def close(self) -> None:
        self._channel.close()


class _HttpSession:
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


class _HttpTransport:
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
        self._sessions: set[_HttpSession] = set()
        self._lock = threading.Lock()
        netloc = f"[{self._host}]" if ":" in self._host else self._host
        self.description = f"{url.scheme}://{netloc}:{self._port}{self._path}"

    def prepare(self, data: bytes) -> bytes:
        return gzip.compress(data, compresslevel=6, mtime=0) if self._gzip else data

    def new_session(self) -> _HttpSession:
        session = _HttpSession()
        with self._lock:
            self._sessions.add(session)
        return session

    def close_session(self, session: _HttpSession) -> None:
        self._disconnect(session)
        with self._lock:
            self._sessions.discard(session)

    @staticmethod
    def _disconnect(session: _HttpSession) -> None:
        conn, session.conn = session.conn, None
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass

    def _connection(self, session: _HttpSession, timeout_s: float | None) -> tuple[http.client.HTTPConnection, bool]:
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

    def send(self, body: bytes, timeout_s: float | None, session: _HttpSession) -> _Result:
        for fresh_retry_allowed in (True, False):
            conn, reused = self._connection(session, timeout_s)
            try:
                conn.request("POST", self._path, body=body, headers=self._headers)
                response = conn.getresponse()
                payload = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
                self._disconnect(session)
                if reused and fresh_retry_allowed:
                    continue  # the server closed our idle keep-alive connection: reconnect and resend
                return _Result(False, True, "connection_error", f"{type(exc).__name__}: {exc}")
            except TimeoutError as exc:
                self._disconnect(session)
                return _Result(False, True, "timeout", f"no answer within {timeout_s}s: {exc}")
            except ssl.SSLError as exc:
                self._disconnect(session)
                return _Result(False, True, "tls_error", str(exc))
            except (OSError, http.client.HTTPException) as exc:
                self._disconnect(session)
                return _Result(False, True, "connection_error", f"{type(exc).__name__}: {exc}")
            if response.will_close:
                self._disconnect(session)
            return self._classify(response, payload)
        raise AssertionError("unreachable")

    @staticmethod
    def _classify(response: http.client.HTTPResponse, payload: bytes) -> _Result:
        status = response.status
        content_type = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if 200 <= status < 300:
            rejected, message = _partial_success(payload) if content_type == PROTOBUF and payload else (0, "")
            return _Result(True, rejected=rejected, rejected_message=message)
        detail = f"HTTP {status}"
        if content_type == PROTOBUF and payload:
            rpc_status = status_pb2.Status()
            try:
                rpc_status.ParseFromString(payload)
                detail += f": {rpc_status.message[:300]}"
            except DecodeError:
                pass
        elif payload:
            detail += f": {payload[:300].decode('utf-8', 'replace').strip()}"
        retryable = status in _HTTP_RETRYABLE
        throttle = _retry_after(response.getheader("Retry-After")) if retryable else None
        return _Result(False, retryable, f"http_{status}", detail, throttle)

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


# --- on-disk queue ---------------------------------------------------------------------------


class _DiskQueue:
    """One file per request: ``<seq:016d>-<unix_ns:019d>.otlpq`` = header + serialized request."""

    HEADER = struct.Struct("<4sIQI")  # magic, span count, payload length, crc32(payload)
    MAGIC = b"OLQ1"
    SUFFIX = ".otlpq"
    TMP_PREFIX = ".tmp-"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OSError(f"sending_queue.storage: cannot use {directory}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise OSError(f"sending_queue.storage: {directory} is in use by another exporter") from None
            raise
        max_seq = 0
        for entry in os.scandir(directory):
            if entry.name.startswith(self.TMP_PREFIX):
                # An interrupted write: its submit never returned True, so nothing was promised.
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
                continue
            seq = self._seq_of(entry.name)
            if seq is not None:
                max_seq = max(max_seq, seq)
        self.next_seq = max_seq + 1

    @classmethod
    def _seq_of(cls, name: str) -> int | None:
        if not name.endswith(cls.SUFFIX):
            return None
        head = name[: -len(cls.SUFFIX)].split("-", 1)[0]
        return int(head) if head.isdigit() else None

    def write(self, seq: int, data: bytes, spans: int) -> Path:
        name = f"{seq:016d}-{time.time_ns():019d}{self.SUFFIX}"
        final = self.directory / name
        tmp = self.directory / (self.TMP_PREFIX + name)
        header = self.HEADER.pack(self.MAGIC, min(spans, 0xFFFFFFFF), len(data), zlib.crc32(data))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                view = memoryview(header + data)
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._fsync_dir()
        return final

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def load(self, below_seq: int) -> tuple[list[_Item], list[tuple[Path, int, str]]]:
        """Files left by an earlier run (sequence < ``below_seq``), oldest first; and the corrupt ones."""
        named = []
        for entry in os.scandir(self.directory):
            seq = self._seq_of(entry.name)
            if seq is not None and seq < below_seq and entry.is_file():
                named.append((seq, entry.name))
        named.sort()
        items: list[_Item] = []
        corrupt: list[tuple[Path, int, str]] = []
        for seq, name in named:
            path = self.directory / name
            try:
                raw = path.read_bytes()
            except OSError as exc:
                corrupt.append((path, 0, f"unreadable: {exc.strerror or exc}"))
                continue
            problem = ""
            spans = 0
            if len(raw) < self.HEADER.size:
                problem = f"truncated header ({len(raw)} bytes)"
            else:
                magic, spans, length, crc = self.HEADER.unpack_from(raw)
                payload = raw[self.HEADER.size:]
                if magic != self.MAGIC:
                    problem, spans = "not an otel-llm queue file", 0
                elif len(payload) != length:
                    problem = f"truncated payload ({len(payload)} of {length} bytes)"
                elif zlib.crc32(payload) != crc:
                    problem = "checksum mismatch"
            if problem:
                corrupt.append((path, spans, problem))
                continue
            items.append(_Item(seq, payload, spans, path))
        return items, corrupt

    @staticmethod
    def quarantine(path: Path) -> None:
        try:
            os.replace(path, path.with_name(path.name + ".corrupt"))
        except OSError:
            try:
                os.unlink(path)
            except OSError:
                pass

    @staticmethod
    def remove(path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot delete acknowledged queue file %s: %s (it will be sent again after a restart)",
                        path, exc.strerror or exc)

    def close(self) -> None:
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(self._lock_fd)


# --- the exporter ----------------------------------------------------------------------------


class TraceExporter:
    def __init__(self, name: str, protocol: str, settings: OtlpTraceExporter,
                 registry: CollectorRegistry) -> None:
        if protocol not in ("grpc", "http"):
            raise ValueError(f"protocol must be grpc or http, got {protocol!r}")
        if bool(settings.tls.cert_file) != bool(settings.tls.key_file):
            # grpc blocks forever creating a channel with a key and no certificate chain.
            raise ValueError("tls.cert_file and tls.key_file: set both (a client certificate) or neither")
        self.name = name
        self.protocol = protocol
        self._settings = settings
        queue = settings.sending_queue
        self._num_consumers = queue.num_consumers
        self.capacity = queue.queue_size if queue.enabled else queue.num_consumers
        # The on-disk queue is opened (and locked) by start(): building an exporter touches no file.
        self._disk: _DiskQueue | None = None
        self._storage = Path(queue.storage) if queue.storage and queue.enabled else None
        if queue.storage and not queue.enabled:
            log.warning("exporter %s: sending_queue.storage is ignored because sending_queue.enabled is false", name)
        self._transport: _GrpcTransport | _HttpTransport = (
            _GrpcTransport(settings) if protocol == "grpc" else _HttpTransport(settings))
        self._first_seq = 1
        self._next_seq = 1

        self._cond = threading.Condition()
        self._pending: deque[_Item] = deque()
        self._inflight: set[_Item] = set()
        self._outstanding = 0  # reserved + pending + in flight
        self._closed = False
        self._started = False
        self._shutdown_started = False
        self._deadline: float | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

        self._log_lock = threading.Lock()
        self._failure_streak = 0
        self._full_streak = 0
        self._partial_logged = False

        m = _metrics_for(registry)
        self._enqueued_spans = m.enqueued_spans.labels(name)
        self._sent_spans = m.sent_spans.labels(name)
        self._sent_requests = m.sent_requests.labels(name)
        self._failed = m.failed_requests
        self._dropped_spans = m.dropped_spans
        self._dropped_requests = m.dropped_requests
        self._retries = m.retries.labels(name)
        self._rejected = m.rejected_spans.labels(name)
        for reason in DROP_REASONS:
            m.dropped_spans.labels(name, reason)
            m.dropped_requests.labels(name, reason)
        m.queue_size.labels(name).set_function(lambda: self._outstanding)
        m.queue_capacity.labels(name).set(self.capacity)

    # --- public API ----------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return self._outstanding

    @property
    def endpoint(self) -> str:
        return self._transport.description

    def start(self) -> None:
        """Replay what an earlier run left in ``storage`` (oldest first), then start the senders."""
        with self._cond:
            if self._started:
                raise RuntimeError(f"exporter {self.name} already started")
            if self._shutdown_started:
                raise RuntimeError(f"exporter {self.name} is shut down")
        if self._storage is not None:
            self._disk = _DiskQueue(self._storage)  # OSError (the lock is held elsewhere, not writable): not started
            self._first_seq = self._next_seq = self._disk.next_seq
        with self._cond:
            self._started = True
        if self._disk is not None:
            items, corrupt = self._disk.load(self._first_seq)
            for path, spans, problem in corrupt:
                log.warning("exporter %s: skipping corrupt queue file %s (%s); kept as %s.corrupt",
                            self.name, path, problem, path.name)
                self._drop(spans, "corrupt_persisted")
                self._disk.quarantine(path)
            if items:
                with self._cond:
                    self._pending.extendleft(reversed(items))
                    self._outstanding += len(items)
                    self._cond.notify_all()
                log.info("exporter %s: replaying %d requests (%d spans) from %s", self.name, len(items),
                         sum(i.spans for i in items), self._disk.directory)
        for index in range(self._num_consumers):
            thread = threading.Thread(target=self._consume, name=f"otlp-export-{self.name}-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("exporter %s: sending to %s (queue %d, %d senders%s)", self.name, self.endpoint, self.capacity,
                 self._num_consumers, f", storage {self._disk.directory}" if self._disk else "")

    def submit(self, request: ExportTraceServiceRequest) -> bool:
        """Queue ``request`` for export; False (and counted as dropped) if the queue is full or closed."""
        data = request.SerializeToString()
        spans = count_spans(request)
        with self._cond:
            if self._closed:
                refused = "shutdown"
            elif self._outstanding >= self.capacity:
                refused = "queue_full"
            else:
                refused = ""
                self._outstanding += 1
                seq = self._next_seq
                self._next_seq += 1
        if refused:
            self._drop(spans, refused)
            if refused == "queue_full":
                self._note_queue_full()
            return False
        item = _Item(seq, data, spans)
        if self._disk is not None:
            try:
                item.path = self._disk.write(seq, data, spans)
            except OSError as exc:
                with self._cond:
                    self._outstanding -= 1
                    self._cond.notify_all()
                self._drop(spans, "storage_error")
                log.warning("exporter %s: cannot write to the on-disk queue %s: %s; request dropped", self.name,
                            self._disk.directory, exc.strerror or exc)
                return False
        with self._cond:
            stopped = self._stop.is_set()
            if not stopped:
                self._pending.append(item)
                self._cond.notify()
        if stopped:  # shutdown finished while we were writing
            self._finish(item, "shutdown")
            return item.path is not None
        self._enqueued_spans.inc(spans)
        self._note_accepted()
        return True

    def shutdown(self, timeout_s: float) -> None:
        """Stop accepting; send what is queued until done or ``timeout_s``; keep the rest on disk or drop it."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            if self._shutdown_started:
                return
            self._shutdown_started = True
            self._closed = True
            self._deadline = deadline
            if self._started:
                while self._outstanding > 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            self._stop.set()
            self._cond.notify_all()
            leftovers = list(self._pending)
            self._pending.clear()
        self._transport.abort()
        for item in leftovers:
            self._finish(item, "shutdown")
        for thread in self._threads:
            thread.join(timeout=2.0)
        with self._cond:
            stuck = list(self._inflight)
        for item in stuck:
            self._finish(item, "shutdown")
        self._transport.close()
        left = len(leftovers) + len(stuck)
        if self._disk is not None:
            self._disk.close()
            if left:
                log.info("exporter %s: %d requests left in %s for the next start", self.name, left,
                         self._disk.directory)
        elif left:
            log.warning("exporter %s: shutdown dropped %d unsent requests", self.name, left)

    # --- senders ---------------------------------------------------------------------------------

    def _consume(self) -> None:
        session = self._transport.new_session()
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._stop.is_set():
                        self._cond.wait()
                    if self._stop.is_set():
                        return
                    item = self._pending.popleft()
                    self._inflight.add(item)
                try:
                    self._deliver(item, session)
                except Exception:  # noqa: BLE001 - a sender thread must never die
                    log.exception("exporter %s: unexpected error sending a request; dropped", self.name)
                    self._finish(item, "permanent_error")
        finally:
            self._transport.close_session(session)

    def _attempt_timeout(self) -> float | None:
        timeout = self._settings.timeout or None
        deadline = self._deadline
        if deadline is not None:
            remaining = max(0.05, deadline - time.monotonic())
            timeout = remaining if timeout is None else min(timeout, remaining)
        return timeout

    def _deliver(self, item: _Item, session: object) -> None:
        retry = self._settings.retry_on_failure
        body = self._transport.prepare(item.data)
        started = time.monotonic()
        interval = retry.initial_interval
        while True:
            result = self._transport.send(body, self._attempt_timeout(), session)  # type: ignore[arg-type]
            if result.ok:
                self._note_success()
                self._finish(item, "sent", result.rejected, result.rejected_message)
                return
            self._failed.labels(self.name, result.reason).inc()
            if self._stop.is_set():
                self._finish(item, "shutdown")
                return
            if not result.retryable:
                self._note_failure(result, "dropping the request (not retryable)")
                self._finish(item, "permanent_error")
                return
            if not retry.enabled:
                self._note_failure(result, "dropping the request (retry_on_failure is disabled)")
                self._finish(item, "retry_disabled")
                return
            delay = interval * random.uniform(1 - _JITTER, 1 + _JITTER)
            interval = min(interval * retry.multiplier, retry.max_interval)
            if result.throttle_s is not None:
                delay = max(delay, result.throttle_s)
            if retry.max_elapsed_time > 0 and time.monotonic() - started + delay > retry.max_elapsed_time:
                self._note_failure(result, f"dropping the request (retrying for over {retry.max_elapsed_time:g}s)")
                self._finish(item, "retries_exhausted")
                return
            self._note_failure(result, f"retrying in {delay:.2f}s")
            if self._stop.wait(delay):
                self._finish(item, "shutdown")
                return
            self._retries.inc()

    # --- accounting --------------------------------------------------------------------------

    def _drop(self, spans: int, reason: str) -> None:
        self._dropped_requests.labels(self.name, reason).inc()
        if spans:
            self._dropped_spans.labels(self.name, reason).inc(spans)

    def _finish(self, item: _Item, outcome: str, rejected: int = 0, rejected_message: str = "") -> None:
        """Account for ``item`` once: sent, dropped for ``outcome``, or (shutdown with storage) left on disk."""
        with self._cond:
            first = not item.done
            if first:
                item.done = True
                self._inflight.discard(item)
                self._outstanding -= 1
                self._cond.notify_all()
        if outcome == "sent":
            if item.path is not None:
                self._disk.remove(item.path)  # type: ignore[union-attr]
            if not first:
                return
            rejected = min(rejected, item.spans)
            self._sent_requests.inc()
            self._sent_spans.inc(item.spans - rejected)
            if rejected:
                self._rejected.inc(rejected)
                self._note_partial(rejected, rejected_message)
            return
        if not first:
            return
        if outcome == "shutdown" and item.path is not None:
            return  # stays in storage for the next start
        self._drop(item.spans, outcome)
        if item.path is not None:
            self._disk.remove(item.path)  # type: ignore[union-attr]

    # --- logging without spam ------------------------------------------------------------------

    def _note_failure(self, result: _Result, action: str) -> None:
        with self._log_lock:
            self._failure_streak += 1
            first = self._failure_streak == 1
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "exporter %s: export to %s failed (%s: %s); %s%s", self.name, self.endpoint, result.reason,
                result.detail, action, "" if not first else "; further failures are logged at debug until it recovers")

    def _note_success(self) -> None:
        with self._log_lock:
            streak, self._failure_streak = self._failure_streak, 0
        if streak:
            log.info("exporter %s: exports to %s succeed again after %d failed attempts", self.name, self.endpoint,
                     streak)

    def _note_queue_full(self) -> None:
        with self._log_lock:
            self._full_streak += 1
            first = self._full_streak == 1
        if first:
            log.warning("exporter %s: sending queue full (%d requests); dropping new requests until it drains",
                        self.name, self.capacity)

    def _note_accepted(self) -> None:
        if not self._full_streak:
            return
        with self._log_lock:
            streak, self._full_streak = self._full_streak, 0
        if streak:
            log.info("exporter %s: sending queue accepts again after refusing %d requests", self.name, streak)

    def _note_partial(self, rejected: int, message: str) -> None:
        with self._log_lock:
            first, self._partial_logged = not self._partial_logged, True
        log.log(logging.WARNING if first else logging.DEBUG,
                "exporter %s: the backend rejected %d spans: %s%s", self.name, rejected, message,
                " (further partial successes are logged at debug)" if first else "")
