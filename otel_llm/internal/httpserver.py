"""A threaded stdlib HTTP server that runs in the background; shared by the OTLP/HTTP receiver
and the Prometheus/API endpoint so each only writes its request handling.

Every server gets an accept loop that backs off when ``accept`` fails for want of file
descriptors or memory (EMFILE and the like: the listener stays readable, so retrying at once
spins a core and starves every other thread of the GIL). With ``ConnectionLimits`` (the OTLP/HTTP
receiver) it also caps open connections, one thread each, and a watchdog thread cuts requests
whose headers, or whole request, take longer than their deadline: it closes the connection's read
side, so the handler's blocked read returns and the handler answers 408 and closes. Each refusal
goes to ``ConnectionLimits.on_refused`` with its reason, before the client sees it.

With ``evict_idle`` (the parent's metrics port), a connection that arrives at the cap does not
wait for a deadline: it takes the place of the connection that has waited longest without a
request in progress (idle between keep-alive requests, or still short of its headers), which is
cut (``evicted_idle``). A flood of idle connections then only evicts itself, and a scrape, which
sends its request at once, is served; threads stay below twice the cap.
"""

from __future__ import annotations

import errno
import io
import logging
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from otel_llm.confmap import split_endpoint
from otel_llm.internal.telemetry import TelemetryFamily

log = logging.getLogger(__name__)

# accept() errors that mean "no resources right now": retrying at once cannot succeed.
_RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_BACKOFF_S = (0.005, 1.0)  # first and longest pause, doubling in between (as Go's net/http)
_REFUSED_CONNECTION = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
                       b"Connection: close\r\n\r\n")


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-server limits; 0 means none."""

    max_connections: int = 0
    header_timeout_s: float = 0.0  # from a request's first byte (a connection's start) to its last header
    request_timeout_s: float = 0.0  # from a request's first byte to the end of its body
    on_refused: Callable[[str], None] | None = None  # too_many_connections, fd_limit, header_timeout, read_timeout
    evict_idle: bool = False  # at the cap, cut the longest-waiting connection without a request (evicted_idle)

    def refused(self, reason: str) -> None:
        if self.on_refused is not None:
            self.on_refused(reason)


HTTP_REFUSED_CONNECTIONS = TelemetryFamily(
    "otel_llm_http_refused_connections", "counter",
    "Connections and requests an HTTP listener of the parent cut or refused, by listener and reason "
    "(too_many_connections, fd_limit, header_timeout, read_timeout, evicted_idle).", ("listener", "reason"),
    "exporters.prometheus, extensions.webview", "`listener`: `prometheus` (the metrics port), `webview`.")
_REFUSED_COUNTERS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()
_REFUSED_LOCK = threading.Lock()


def refused_connections(registry: CollectorRegistry, listener: str) -> Callable[[str], None]:
    """``ConnectionLimits.on_refused`` for a listener of the parent process (the metrics port, the
    web view): counts in ``otel_llm_http_refused_connections_total{listener, reason}``, one family
    per registry whatever the number of listeners."""
    with _REFUSED_LOCK:
        counter = _REFUSED_COUNTERS.get(registry)
        if counter is None:
            counter = _REFUSED_COUNTERS[registry] = HTTP_REFUSED_CONNECTIONS.counter(registry)
    return lambda reason: counter.labels(listener, reason).inc()


class _Watchdog:
    """One thread per server: every ``period`` it cuts the connections whose deadline has passed.
    A scan of the open connections (at most ``max_connections``) costs less than a timer per
    request, and a request only stores its deadline."""

    def __init__(self, period_s: float, name: str) -> None:
        self._period = period_s
        self._handlers: set[QuietHandler] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-deadlines", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def add(self, handler: QuietHandler) -> None:
        with self._lock:
            self._handlers.add(handler)

    def remove(self, handler: QuietHandler) -> None:
        with self._lock:
            self._handlers.discard(handler)

    def evict_longest_waiting(self) -> bool:
        """Cut the connection that has waited longest without a request in progress; whether one was."""
        with self._lock:
            waiting = [handler for handler in self._handlers if handler.waiting_since and not handler.expired]
        for handler in sorted(waiting, key=lambda h: h.waiting_since):
            if handler.evict():
                return True
        return False

    def _run(self) -> None:
        while not self._stopped.wait(self._period):
            now = time.monotonic()
            with self._lock:
                late = [handler for handler in self._handlers if 0 < handler.deadline <= now]
            for handler in late:
                handler.expire(now)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], limits: ConnectionLimits,
                 watchdog: _Watchdog | None) -> None:
        self.limits = limits
        self.watchdog = watchdog
        self.open_connections = 0
        self._open_lock = threading.Lock()
        self._backoff_s = 0.0
        super().__init__(address, handler)

    def server_bind(self) -> None:
        if ":" in self.server_address[0]:
            self.address_family = socket.AF_INET6
            self.socket = socket.socket(self.address_family, self.socket_type)
        super().server_bind()

    def get_request(self) -> tuple[Any, Any]:
        try:
            request = super().get_request()
        except OSError as exc:
            if exc.errno in _RESOURCE_ERRNOS:
                # The pending connection stays in the backlog: pause, so that the loop does not spin
                # (and starve the process's other threads), then try again.
                self.limits.refused("fd_limit")
                if not self._backoff_s:
                    log.warning("%s: cannot accept connections (%s); backing off", self.socket.getsockname(),
                                exc.strerror or exc)
                self._backoff_s = min(_ACCEPT_BACKOFF_S[1], max(_ACCEPT_BACKOFF_S[0], self._backoff_s * 2))
                time.sleep(self._backoff_s)
            raise  # socketserver drops this attempt and polls again
        self._backoff_s = 0.0
        return request

    def process_request(self, request: Any, client_address: Any) -> None:
        cap = self.limits.max_connections
        with self._open_lock:
            full = bool(cap) and self.open_connections >= cap
            if not full:
                self.open_connections += 1
        if full and self.limits.evict_idle and self.watchdog is not None and self.open_connections < 2 * cap \
                and self.watchdog.evict_longest_waiting():
            # The evicted connection's thread ends at once (its read returns end-of-file); until it
            # has, one more is open than the cap, never more than twice the cap.
            self.limits.refused("evicted_idle")
            with self._open_lock:
                self.open_connections += 1
            full = False
        elif full:
            self.limits.refused("too_many_connections")
            _refuse_connection(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._closed_one()  # e.g. no thread could be started: socketserver closes the socket
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._closed_one()

    def _closed_one(self) -> None:
        with self._open_lock:
            self.open_connections -= 1


def _refuse_connection(request: socket.socket) -> None:
    """Answer 503 without a thread, never blocking the accept loop; on a TLS port only close
    (a plaintext answer there is noise, and the handshake would have to wait for the client)."""
    try:
        if not isinstance(request, ssl.SSLSocket):
            request.setblocking(False)
            try:
                request.recv(65536)  # what the client sent already: unread, it would turn our close into a reset
            except OSError:
                pass
            request.send(_REFUSED_CONNECTION)
            request.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        request.close()


class BackgroundHTTPServer:
    def __init__(self, endpoint: str, handler: type[BaseHTTPRequestHandler], name: str,
                 tls: ssl.SSLContext | None = None, limits: ConnectionLimits | None = None) -> None:
        self._tls = tls
        self._endpoint = endpoint
        self._handler = handler
        self._name = name
        self._limits = limits or ConnectionLimits()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._watchdog: _Watchdog | None = None
        self.port = 0

    @property
    def open_connections(self) -> int:
        return self._server.open_connections if self._server is not None else 0

    def start(self) -> None:
        host, port = split_endpoint(self._endpoint)
        limits = self._limits
        timeouts = [t for t in (limits.header_timeout_s, limits.request_timeout_s) if t > 0]
        watchdog = _Watchdog(min(0.5, max(0.02, min(timeouts) / 20)), self._name) if timeouts else None
        try:
            server = _Server((host, port), self._handler, limits, watchdog)
        except OSError as exc:
            raise OSError(f"cannot listen on {self._endpoint} for {self._name}: {exc.strerror or exc}") from None
        if self._tls is not None:
            # The handshake happens in the handler's thread (first read), not in the accept loop,
            # so a slow or hostile client cannot stall everyone else's connections.
            server.socket = self._tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self.port = server.server_address[1]
        self._server = server
        if watchdog is not None:
            watchdog.start()
            self._watchdog = watchdog
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        # The watchdog keeps cutting late requests on connections still open after the stop.


class QuietHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: OTLP exporters reuse their connection
    timeout = 60  # seconds a connection may sit idle (or one read may wait) before it is closed
    # Headers and body leave in one write (flushed after each request): two small writes meet
    # Nagle's algorithm and the client's delayed ACK, costing ~40 ms per request.
    wbufsize = 1 << 16

    server: _Server
    # With a watchdog (the server has deadlines): the current request's deadline, its phase
    # ("" between requests, "headers", "body", "done" once the body is read) and, once cut, why.
    deadline = 0.0
    expired = ""
    waiting_since = 0.0  # while no request is in progress (idle, or short of its headers): since when

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._phase = ""
        watchdog = self.server.watchdog
        if watchdog is not None:
            self._deadline_lock = threading.Lock()
            self._arm()  # the first request's headers (and a TLS handshake) count from the connection's start
            watchdog.add(self)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self.server.watchdog is not None:
                self.server.watchdog.remove(self)

    def handle(self) -> None:
        try:
            super().handle()
        except (ssl.SSLError, ConnectionError, TimeoutError):
            self.close_connection = True  # a failed handshake or a vanished client ends only its connection

    # --- deadlines (only with a watchdog) ---------------------------------------------------

    def handle_one_request(self) -> None:
        if self.server.watchdog is None:
            super().handle_one_request()
            return
        if not self._phase:
            # Between keep-alive requests: idle (the socket timeout) until the next one's first byte.
            rfile = self.rfile
            assert isinstance(rfile, io.BufferedReader)  # StreamRequestHandler's rbufsize -1: buffered
            if not rfile.peek(1):
                self.close_connection = True
                return
            self._arm()
        try:
            super().handle_one_request()
        finally:
            with self._deadline_lock:
                self._phase = ""
                self.deadline = 0.0
                self.waiting_since = time.monotonic()
        if self.expired:
            self.close_connection = True

    def _arm(self) -> None:
        limits = self.server.limits
        now = time.monotonic()
        request_deadline = now + limits.request_timeout_s if limits.request_timeout_s > 0 else 0.0
        header_deadline = now + limits.header_timeout_s if limits.header_timeout_s > 0 else 0.0
        with self._deadline_lock:
            self._phase = "headers"
            self.waiting_since = now
            self._request_deadline = request_deadline
            self.deadline = min(d for d in (header_deadline, request_deadline, float("inf")) if d) \
                if (header_deadline or request_deadline) else 0.0

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if self.server.watchdog is None:
            return parsed
        with self._deadline_lock:
            self.waiting_since = 0.0
            if not self.expired:
                self._phase = "body"
                self.deadline = self._request_deadline
        if self.expired and parsed:
            # Cut while the headers were arriving: what was parsed is incomplete; answer nothing of it.
            self.send_error(408)
            return False
        return parsed

    def body_read(self) -> None:
        """The request's body is in: the rest (decoding, answering) is not the client's time."""
        if self.server.watchdog is not None:
            with self._deadline_lock:
                if not self.expired:
                    self._phase = "done"
                    self.deadline = 0.0

    def evict(self) -> bool:
        """Called at the cap (``evict_idle``): cut this connection if it still waits for a request."""
        with self._deadline_lock:
            if self.expired or not self.waiting_since or self._phase not in ("", "headers"):
                return False
            self.expired = "evicted_idle"
            self.deadline = 0.0
            self.waiting_since = 0.0
        try:
            socket.socket.shutdown(self.connection, socket.SHUT_RD)  # its blocked read returns end-of-file
        except OSError:
            pass
        return True

    def expire(self, now: float) -> None:
        """Called by the watchdog: count the request as cut, and wake its handler's blocked read."""
        with self._deadline_lock:
            if self.expired or not self.deadline or now < self.deadline or self._phase not in ("headers", "body"):
                return
            self.expired = "header_timeout" if self._phase == "headers" else "read_timeout"
            self.deadline = 0.0
        self.server.limits.refused(self.expired)
        try:
            # The plain socket's shutdown, also for a TLS socket (whose own would unwrap it): the
            # read side only, so the handler can still write its 408.
            socket.socket.shutdown(self.connection, socket.SHUT_RD)
        except OSError:
            pass

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        if self.expired:
            code, message, explain = 408, None, f"request not complete within its deadline ({self.expired})"
            self.close_connection = True
        super().send_error(code, message, explain)

    # ----------------------------------------------------------------------------------------

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass

    def send_body(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
