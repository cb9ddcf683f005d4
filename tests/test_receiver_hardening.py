"""What an outside client can do to the receivers with nothing but a socket: stall gRPC calls
after their headers, trickle HTTP bodies and headers, hold connections, exhaust file descriptors,
stream chunked bodies, send bodies shorter than they say, multi-member gzip, and JSON of the wrong
shape. Each case checks what a user expects: other clients are still served, the refusal is
counted with its reason, nothing acknowledged is lost. Raw HTTP/2 comes from ``h2``: grpcio cannot
send a call's headers without its message."""

from __future__ import annotations

import concurrent.futures
import gzip
import http.client
import json
import os
import resource
import select
import socket
import struct
import threading
import time
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events

from tests.support.otelllm import RunningServer, ServerProcess
from tests.support.payloads import vllm_batch
from tests.test_bad_input import EXPORT, http_post
from tests.test_hardening import refusals_by_reason
from tests.test_receiver_process import child_processes

PROTOBUF = "application/x-protobuf"
ACCEPTED = "otel_llm_receiver_accepted_spans_total"
REFUSED = "otel_llm_receiver_refused_requests_total"


def poll(predicate, timeout_s: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def grpc_export(port: int, payload: bytes, timeout_s: float = 10) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        channel.unary_unary(EXPORT)(payload, timeout=timeout_s)


class RawGrpcCalls:
    """HTTP/2 streams to the Export method on one connection, each sending its HEADERS and then
    only what the test says (nothing, by default): the calls grpcio waits on. A reader thread
    answers the server's PINGs and SETTINGS and records each stream's grpc-status."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True,
                                                                          validate_inbound_headers=False))
        self._lock = threading.Lock()
        self.status: dict[int, str] = {}  # stream id -> grpc-status, or "reset"
        self.streams: list[int] = []
        self._closed = False
        self._pong = threading.Event()
        with self._lock:
            self._conn.initiate_connection()
            self._sock.sendall(self._conn.data_to_send())
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def start(self, count: int, extra_headers: tuple[tuple[str, str], ...] = (), message: bytes | None = None) -> None:
        with self._lock:
            for _ in range(count):
                stream = self._conn.get_next_available_stream_id()
                self._conn.send_headers(stream, [
                    (":method", "POST"), (":scheme", "http"), (":path", EXPORT), (":authority", "otel-llm"),
                    ("content-type", "application/grpc"), ("te", "trailers"), *extra_headers])
                if message is not None:
                    self._conn.send_data(stream, message, end_stream=True)
                self.streams.append(stream)
            # The server handles a connection's frames in order: its answer to this PING says that
            # it has taken in every HEADERS frame above, so the calls exist on its side.
            self._pong.clear()
            self._conn.ping(b"synced!!")
            self._sock.sendall(self._conn.data_to_send())
        assert self._pong.wait(10), "no PING answer"

    def _read(self) -> None:
        while not self._closed:
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            with self._lock:
                for event in self._conn.receive_data(data):
                    if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                        headers = dict(event.headers)
                        if b"grpc-status" in headers:
                            self.status[event.stream_id] = headers[b"grpc-status"].decode()
                    elif isinstance(event, h2.events.PingAckReceived):
                        self._pong.set()
                    elif isinstance(event, h2.events.StreamReset):
                        self.status.setdefault(event.stream_id, "reset")
                try:
                    self._sock.sendall(self._conn.data_to_send())
                except OSError:
                    return

    def answered(self) -> int:
        return sum(stream in self.status for stream in self.streams)

    def close(self) -> None:
        self._closed = True
        self._sock.close()


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">?I", compressed, len(payload)) + payload


# --- 1. gRPC: stalled calls, many clients ------------------------------------------------------


def test_grpc_calls_stalled_after_their_headers_are_cut_and_do_not_stop_ingest(make_server):
    """Eight calls that send HEADERS and never their message (one connection is enough): with a
    thread pool of 4 they stopped every other Export until its deadline. Here the other clients'
    Exports are answered while the stalled calls wait, and the stalled calls are cut at
    ``read_timeout`` with DEADLINE_EXCEEDED, counted as ``read_timeout``."""
    server = make_server({"receivers": {"otlp": {"protocols": {"grpc": {"read_timeout": "5s"}}}}})
    stalled = RawGrpcCalls(server.grpc_port)
    try:
        stalled.start(8)
        for _ in range(5):
            grpc_export(server.grpc_port, vllm_batch(3).SerializeToString(), timeout_s=10)
        assert stalled.answered() == 0, "the exports were answered while the stalled calls waited"
        poll(lambda: stalled.answered() == 8, 30, "the stalled calls to be cut")
        assert set(stalled.status.values()) == {str(grpc.StatusCode.DEADLINE_EXCEEDED.value[0])}
    finally:
        stalled.close()
    scrape = server.scrape()  # counted before the answers went out
    assert refusals_by_reason(scrape, "grpc") == {"read_timeout": 8}
    assert scrape.value(ACCEPTED, protocol="grpc") == 15
    server.wait_for_requests(15)


def test_grpc_has_no_pool_that_stalled_calls_exhaust(make_server):
    """120 stalled calls on two connections (more than grpcio's old cap of 16 x workers calls in
    progress, past which it answered a non-retryable RESOURCE_EXHAUSTED, uncounted) and then 40
    clients exporting at once: every export succeeds, none is refused, every span is counted."""
    server = make_server({"receivers": {"otlp": {"protocols": {"grpc": {"read_timeout": "60s"}}}}})
    connections = [RawGrpcCalls(server.grpc_port) for _ in range(2)]
    payload = vllm_batch(2).SerializeToString()
    try:
        for connection in connections:
            connection.start(60)

        def export(_: int) -> str:
            for _attempt in range(3):  # as an OTLP exporter does: UNAVAILABLE is retried, nothing else
                try:
                    grpc_export(server.grpc_port, payload, timeout_s=20)
                    return "OK"
                except grpc.RpcError as error:
                    if error.code() != grpc.StatusCode.UNAVAILABLE:
                        return error.code().name
            return "UNAVAILABLE"

        with concurrent.futures.ThreadPoolExecutor(max_workers=40) as pool:
            results = list(pool.map(export, range(40)))
        assert results == ["OK"] * 40
        assert sum(connection.answered() for connection in connections) == 0  # still stalled, still open
    finally:
        for connection in connections:
            connection.close()
    scrape = server.scrape()
    assert scrape.value(ACCEPTED, protocol="grpc") == 80
    assert refusals_by_reason(scrape, "grpc") == {}


def test_five_hundred_grpc_clients_at_once_are_all_served(make_server):
    """500 clients, each on its own connection, exporting at the same moment: grpcio's cap on calls
    in progress (16 x workers) answered about half of them RESOURCE_EXHAUSTED, which Go exporters
    treat as permanent, and no counter moved. Every export succeeds (UNAVAILABLE retried, as OTLP
    exporters do), every span is counted."""
    server = make_server()
    clients = 500
    payload = vllm_batch(4).SerializeToString()
    barrier = threading.Barrier(clients)

    def export(_: int) -> str:
        # A channel of its own, not the process-wide subchannel pool: one TCP connection per client.
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}",
                                   options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            barrier.wait(60)
            for _attempt in range(3):
                try:
                    channel.unary_unary(EXPORT)(payload, timeout=60)
                    return "OK"
                except grpc.RpcError as error:
                    if error.code() != grpc.StatusCode.UNAVAILABLE:
                        return error.code().name
            return "UNAVAILABLE"

    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as pool:
        results = list(pool.map(export, range(clients)))
    assert {result: results.count(result) for result in set(results)} == {"OK": clients}
    scrape = server.scrape()
    assert scrape.value(ACCEPTED, protocol="grpc") == 4 * clients
    assert refusals_by_reason(scrape, "grpc") == {}


# --- 3. HTTP bodies: chunked, short, multi-member gzip -------------------------------------------


def post_chunked(port: int, chunks: list[bytes], headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """POST with ``Transfer-Encoding: chunked`` and no Content-Length, as the OpenTelemetry JS
    exporter streams its body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", "/v1/traces", body=iter(chunks), encode_chunked=True,
                           headers={"Content-Type": PROTOBUF, **(headers or {})})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_http_chunked_bodies_are_accepted_within_the_size_limit(make_server):
    limit = 200_000
    server = make_server({"receivers": {"otlp": {"protocols": {"http": {"max_request_body_size": limit}}}}})
    def pieces() -> list[bytes]:  # a new batch each time: a replayed span is not measured twice
        body = vllm_batch(7, model="chunked").SerializeToString()
        return [body[i:i + 100] for i in range(0, len(body), 100)]

    assert post_chunked(server.http_port, pieces())[0] == 200
    assert post_chunked(server.http_port, [gzip.compress(b"".join(pieces()))], {"Content-Encoding": "gzip"})[0] == 200
    # A keep-alive connection goes on after a chunked request: the body was read to its end.
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        for _ in range(2):
            connection.request("POST", "/v1/traces", body=iter(pieces()), encode_chunked=True,
                               headers={"Content-Type": PROTOBUF})
            response = connection.getresponse()
            response.read()
            assert response.status == 200
    finally:
        connection.close()
    status, _ = post_chunked(server.http_port, [b"\x00" * 50_000] * 5)  # 250 000 bytes > limit
    assert status == 413
    scrape = server.scrape()
    assert refusals_by_reason(scrape, "http") == {"too_large": 1}
    assert scrape.value(ACCEPTED, protocol="http") == 4 * 7
    scrape = server.wait_for_requests(28)
    assert scrape.value("vllm:e2e_request_latency_seconds_count", model_name="chunked") == 28


def raw_http(port: int, head: bytes, body: bytes, then_fin: bool = True) -> bytes:
    """Send ``head`` and ``body`` on a plain socket, optionally half-close, and read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        if then_fin:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer:
                break
        return answer


def test_http_body_shorter_than_its_content_length_is_refused(make_server):
    """A complete 5-span message declared 100 bytes longer than it is, then FIN: it was parsed and
    answered 200. It is refused (400, ``incomplete_body``) and nothing of it is taken."""
    server = make_server()
    body = vllm_batch(5).SerializeToString()
    head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\n"
            f"Content-Length: {len(body) + 100}\r\n\r\n").encode()
    answer = raw_http(server.http_port, head, body)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    chunked_head = f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\n" \
                   "Transfer-Encoding: chunked\r\n\r\n".encode()
    cut = f"{len(body):x}\r\n".encode() + body[:-10]  # the last chunk and its terminator never come
    assert raw_http(server.http_port, chunked_head, cut).startswith(b"HTTP/1.1 400")
    scrape = server.scrape()
    assert refusals_by_reason(scrape, "http") == {"incomplete_body": 2}
    assert scrape.value(ACCEPTED) == 0
    assert http_post(server, body)[0] == 200  # the same body, whole, is taken


def test_http_gzip_body_of_two_members_is_read_whole(make_server):
    """``gzip a; gzip b`` concatenated is one valid gzip stream (RFC 1952): both members are read,
    10 spans measured, not the first member's 5."""
    server = make_server()
    first, second = (vllm_batch(5, model="two-members").SerializeToString() for _ in range(2))
    body = gzip.compress(first) + gzip.compress(second)
    code, _, _ = http_post(server, body, encoding="gzip")
    assert code == 200
    assert server.scrape().value(ACCEPTED, protocol="http") == 10
    scrape = server.wait_for_requests(10)
    assert scrape.value("vllm:e2e_request_latency_seconds_count", model_name="two-members") == 10


# --- 2. HTTP: slow bodies, slow headers, connection cap, file descriptors -------------------------


def slow_connection(port: int, head: bytes, part: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head + part)
    return sock


def answer_of(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except ConnectionError:
        return b"reset"


def test_http_slow_bodies_do_not_take_capacity_and_are_cut(make_server):
    """70 connections that send their headers and a few bytes of a 5-span body, then nothing (more
    than ``max_concurrent_requests``, 64, which used to be held while a body arrived): another
    client is answered 200 meanwhile, and the slow requests are answered 408 at ``read_timeout``,
    counted as ``read_timeout``, none of their spans taken."""
    server = make_server({"receivers": {"otlp": {"protocols": {"http": {"read_timeout": "3s",
                                                                         "read_header_timeout": "3s"}}}}})
    body = vllm_batch(5).SerializeToString()
    head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    slow = [slow_connection(server.http_port, head, body[:3]) for _ in range(70)]
    try:
        code, _, _ = http_post(server, vllm_batch(4).SerializeToString())
        assert code == 200, code
        answers = [answer_of(sock) for sock in slow]  # each waits for its own 408
    finally:
        for sock in slow:
            sock.close()
    assert all(answer.startswith(b"HTTP/1.1 408") for answer in answers), {a[:40] for a in answers}
    scrape = server.scrape()
    assert refusals_by_reason(scrape, "http") == {"read_timeout": 70}
    assert scrape.value(ACCEPTED, protocol="http") == 4


def test_http_bodies_in_flight_are_bounded_and_refused_retryably(make_server):
    """Large bodies arriving at once hold at most ``max_bytes_in_flight`` of the receiver process's
    memory: a body that would go past it is refused at once (503, Retry-After, ``bytes_in_flight``)
    before a byte of it is read, and the room comes back when the holders finish."""
    server = make_server({"receivers": {"otlp": {"protocols": {"http": {
        "max_bytes_in_flight": 300_000, "read_timeout": "30s"}}}}})
    size = 120_000  # two fit, the third does not
    head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()
    waiting = [slow_connection(server.http_port, head, b"\x00") for _ in range(3)]
    try:
        # Whichever arrives last is refused at once; the other two hold their room, unanswered.
        answered, _, _ = select.select(waiting, [], [], 20)
        assert len(answered) == 1
        answer = answer_of(answered[0])
        assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer, answer[:200]
        assert not select.select([s for s in waiting if s is not answered[0]], [], [], 0.2)[0]
    finally:
        for sock in waiting:
            sock.close()  # the held bodies end early: refused (incomplete), their room released
    server.wait_until(lambda s: refusals_by_reason(s, "http").get("incomplete_body", 0) == 2, timeout_s=30,
                      what="the two cut bodies refused")
    assert http_post(server, vllm_batch(4).SerializeToString())[0] == 200  # the room came back
    scrape = server.scrape()
    assert refusals_by_reason(scrape, "http")["bytes_in_flight"] == 1
    assert scrape.value(ACCEPTED, protocol="http") == 4


def test_http_slow_headers_are_cut_at_the_header_deadline(make_server):
    """Slowloris: connections that send part of their headers and stop, and a connection that sends
    nothing, are closed at ``read_header_timeout`` (408 where a request line came), counted as
    ``header_timeout``; others are served meanwhile."""
    server = make_server({"receivers": {"otlp": {"protocols": {"http": {"read_header_timeout": "1s"}}}}})
    partial = [slow_connection(server.http_port, b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Ty", b"")
               for _ in range(5)]
    silent = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    try:
        assert http_post(server, vllm_batch(2).SerializeToString())[0] == 200
        answers = [answer_of(sock) for sock in partial]
        assert silent.recv(100) == b""  # closed without a word: it never sent a request
    finally:
        for sock in [*partial, silent]:
            sock.close()
    assert all(answer.startswith(b"HTTP/1.1 408") for answer in answers), answers
    scrape = server.scrape()
    assert refusals_by_reason(scrape, "http") == {"header_timeout": 6}
    assert scrape.value(ACCEPTED, protocol="http") == 2


def test_http_connections_beyond_the_cap_are_refused_and_counted(make_server):
    """With ``max_connections: 20``, 20 idle connections hold the cap: the 21st is answered 503
    (or closed) at once, without a thread, and counted ``too_many_connections``; once some
    close, a client is served again."""
    server = make_server({"receivers": {"otlp": {"protocols": {"http": {"max_connections": 20,
                                                                         "read_header_timeout": "60s"}}}}})
    idle = [socket.create_connection(("127.0.0.1", server.http_port), timeout=10) for _ in range(20)]
    try:
        poll(lambda: _probe_refused(server.http_port), 20, "a connection beyond the cap to be refused")
        refused = server.scrape().value(REFUSED, protocol="http", reason="too_many_connections")
        assert refused >= 1  # counted before the probe saw its refusal
        for sock in idle[:5]:
            sock.close()
        poll(lambda: _served(server), 20, "a client to be served")
    finally:
        for sock in idle:
            sock.close()
    scrape = server.scrape()
    assert scrape.value(REFUSED, protocol="http", reason="too_many_connections") >= refused
    assert scrape.value(ACCEPTED, protocol="http") == 1


def _probe_refused(port: int) -> bool:
    """Whether a new connection is refused at once (503 or closed); one that was accepted waits for
    its request, so its silence says "not full yet"."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        try:
            answer = sock.recv(200)
        except ConnectionError:
            return True
        except TimeoutError:
            return False
        return answer.startswith(b"HTTP/1.1 503") or answer == b""


def _served(server: RunningServer) -> bool:
    try:
        return http_post(server, vllm_batch(1).SerializeToString())[0] == 200
    except OSError:
        return False


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_out_of_file_descriptors_backs_off_instead_of_spinning(tmp_path: Path):
    """The receiver process at its file-descriptor limit: accept fails with EMFILE while a
    connection waits in the backlog. The accept loop backs off (counted ``fd_limit``) instead of
    retrying at once at 100 % CPU, and once descriptors are free both receivers serve again."""
    process = ServerProcess(tmp_path, {"receivers": {"otlp": {"protocols": {"http": {"read_header_timeout": "120s",
                                                                                     "read_timeout": "120s"}}}}})
    limit = 128
    process.start()
    held: list[socket.socket] = []
    try:
        assert process.process is not None
        receiver = child_processes(process.process.pid)["otel-llm-recv"]
        # otel-llm raises its soft limit to the hard one at start: lower the receiver's afterwards.
        _, hard = resource.prlimit(receiver, resource.RLIMIT_NOFILE)
        resource.prlimit(receiver, resource.RLIMIT_NOFILE, (limit, hard))
        in_use = len(os.listdir(f"/proc/{receiver}/fd"))
        for _ in range(limit - in_use + 20):  # past the limit: the last ones wait in the listen backlog
            held.append(socket.create_connection(("127.0.0.1", process.http_port), timeout=10))
        process.wait_until(lambda s: s.value(REFUSED, protocol="http", reason="fd_limit") > 0, 20,
                           "accept to fail for want of descriptors")
        failed_before = process.scrape().value(REFUSED, protocol="http", reason="fd_limit")
        cpu_before, wall_before = _cpu_seconds(receiver), time.monotonic()
        time.sleep(3)  # a span of time at the limit: what is measured is what it costs
        cpu = (_cpu_seconds(receiver) - cpu_before) / (time.monotonic() - wall_before)
        attempts = process.scrape().value(REFUSED, protocol="http", reason="fd_limit") - failed_before
        # Backing off (5 ms doubling to 1 s) makes ~10 attempts in 3 s; a loop that retries at once
        # makes thousands even on a slow, shared machine (which gives it less CPU than a core).
        assert attempts < 100, f"{attempts:.0f} accept attempts in 3 s ({cpu:.0%} of a core): a busy loop"
        for sock in held:
            sock.close()
        held.clear()
        poll(lambda: http_post(type("S", (), {"http_port": process.http_port})(),
                               vllm_batch(1).SerializeToString())[0] == 200, 30, "HTTP to serve again")
        grpc_export(process.grpc_port, vllm_batch(1).SerializeToString(), timeout_s=30)
        scrape = process.scrape()
        assert scrape.value(ACCEPTED) == 2
        print(f"\nat the descriptor limit: {cpu:.1%} of a core, {attempts:.0f} accept attempts in 3 s")
        assert process.stop() == 0
    finally:
        for sock in held:
            sock.close()
        process.ensure_stopped()


# --- 10. JSON of the wrong shape ------------------------------------------------------------------


WRONG_SHAPES = [
    {"resourceSpans": [{"scopeSpans": 5}]},
    {"resourceSpans": [{"scopeSpans": [{"spans": 5}]}]},
    {"resourceSpans": [{"scopeSpans": [{"spans": "abc"}]}]},
    {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1",
                                                   "links": 7}]}]}]},
    {"resourceSpans": [{"scopeSpans": [{"spans": [{"name": {"a": 1}}]}]}]},
    {"resourceSpans": [{"resource": 5}]},
    {"resourceSpans": [{"resource": {"attributes": {"a": 1}}}]},
    {"resourceSpans": [{"scopeSpans": [{"spans": [{"events": 3}]}]}]},
    {"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]},
    {"resourceSpans": [{"scopeSpans": [{"spans": [{"attributes": [
        {"key": "k", "value": {"arrayValue": {"values": 5}}}]}]}]}]},
    {"resourceSpans": [{"scopeSpans": [{"spans": [{"attributes": [{"key": "k", "value": 5}]}]}]}]},
    {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 5}]}]}]},
    {"resourceSpans": True},
]


def test_json_of_the_wrong_shape_is_a_counted_400(server: RunningServer):
    for shape in WRONG_SHAPES:
        code, payload, _ = http_post(server, json.dumps(shape).encode(), "application/json")
        assert code == 400, (shape, code)
        assert json.loads(payload)["message"], shape
    scrape = server.scrape()
    assert refusals_by_reason(scrape, "http") == {"malformed": len(WRONG_SHAPES)}
    assert http_post(server, vllm_batch(1).SerializeToString())[0] == 200
