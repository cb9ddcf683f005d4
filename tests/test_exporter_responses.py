"""What a backend answers cannot hurt the OTLP/HTTP exporter: a huge response body is read only
up to 64 KiB (memory stays flat), and an error body's newlines cannot forge lines in otel-llm's log."""

from __future__ import annotations

import threading
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from otel_llm.exporter.exporterhelper.transport import MAX_RESPONSE_BYTES, HttpTransport
from tests.test_otlp_trace_exporter import settings

BLOCK = b"x" * (1 << 20)


class _Backend(ThreadingHTTPServer):
    daemon_threads = True
    status = 200
    body_mib = 0
    error_text = b""
    sent_mib = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Backend

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        server = self.server
        if server.error_text:
            self.send_response(server.status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(server.error_text)))
            self.end_headers()
            self.wfile.write(server.error_text)
            return
        self.send_response(server.status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(server.body_mib << 20))
        self.end_headers()
        try:
            for _ in range(server.body_mib):
                self.wfile.write(BLOCK)  # one preallocated block: the backend's own memory stays flat
                server.sent_mib += 1
        except OSError:
            self.close_connection = True  # the exporter stopped reading and closed: expected


def _backend(**attrs: object) -> _Backend:
    server = _Backend(("127.0.0.1", 0), _Handler)
    for key, value in attrs.items():
        setattr(server, key, value)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def test_a_huge_response_body_is_read_only_up_to_64_kib():
    """Before: the exporter read a backend's whole answer (a 3 GiB answer took the parent to
    4 667 MiB, and it stayed there). A 512 MiB answer now costs the exporter ~64 KiB; the export
    still counts as delivered, and the next one goes on a new connection."""
    backend = _backend(body_mib=512)
    transport = HttpTransport(settings("http", f"http://127.0.0.1:{backend.server_address[1]}", compression="none"))
    session = transport.new_session()
    try:
        tracemalloc.start()
        try:
            result = transport.send(b"\n\x00", 30.0, session)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert result.ok, result
        print(f"\n512 MiB answer: the exporter's peak allocation {peak / 1024:.0f} KiB")
        assert peak < 4 * MAX_RESPONSE_BYTES + (1 << 20), f"{peak} bytes allocated reading the answer"
        assert backend.sent_mib < 512  # it stopped reading: the backend could not send it all
        assert session.conn is None  # the unread rest makes the connection unusable: closed
        backend.body_mib = 0
        assert transport.send(b"\n\x00", 30.0, session).ok  # a new connection
    finally:
        transport.close_session(session)
        backend.shutdown()


def test_a_backend_error_body_is_one_escaped_log_line():
    """Before: a 400 body ``bad\\nERROR forged`` went into the log as two lines. Control characters
    are now escaped and the text cut at 300 characters."""
    backend = _backend(status=400, error_text=b"bad request\nERROR otel_llm: forged line\r\x1b[31m" + b"y" * 1000)
    transport = HttpTransport(settings("http", f"http://127.0.0.1:{backend.server_address[1]}", compression="none"))
    session = transport.new_session()
    try:
        result = transport.send(b"\n\x00", 10.0, session)
    finally:
        transport.close_session(session)
        backend.shutdown()
    assert not result.ok and not result.retryable and result.reason == "http_400"
    assert "\n" not in result.detail and "\r" not in result.detail and "\x1b" not in result.detail
    assert "bad request\\nERROR otel_llm: forged line\\r\\x1b[31m" in result.detail
    assert len(result.detail) < 400


