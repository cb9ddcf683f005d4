"""A threaded stdlib HTTP server that runs in the background; shared by the OTLP/HTTP receiver
and the Prometheus/API endpoint so each only writes its request handling."""

from __future__ import annotations

import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from otel_llm.config import split_endpoint


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def server_bind(self) -> None:
        if ":" in self.server_address[0]:
            self.address_family = socket.AF_INET6
            self.socket = socket.socket(self.address_family, self.socket_type)
        super().server_bind()


class BackgroundHTTPServer:
    def __init__(self, endpoint: str, handler: type[BaseHTTPRequestHandler], name: str,
                 tls: ssl.SSLContext | None = None) -> None:
        self._tls = tls
        self._endpoint = endpoint
        self._handler = handler
        self._name = name
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    def start(self) -> None:
        host, port = split_endpoint(self._endpoint)
        try:
            server = _Server((host, port), self._handler)
        except OSError as exc:
            raise OSError(f"cannot listen on {self._endpoint} for {self._name}: {exc.strerror or exc}") from None
        if self._tls is not None:
            # The handshake happens in the handler's thread (first read), not in the accept loop,
            # so a slow or hostile client cannot stall everyone else's connections.
            server.socket = self._tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


class QuietHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: OTLP exporters reuse their connection
    timeout = 60  # seconds a connection may sit idle or trickle bytes before it is closed
    # Headers and body leave in one write (flushed after each request): two small writes meet
    # Nagle's algorithm and the client's delayed ACK, costing ~40 ms per request.
    wbufsize = 1 << 16

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle(self) -> None:
        try:
            super().handle()
        except (ssl.SSLError, ConnectionError, TimeoutError):
            self.close_connection = True  # a failed handshake or a vanished client ends only its connection

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
