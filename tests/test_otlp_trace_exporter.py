"""The OTLP trace exporter against a REAL OTLP backend: a second otel-llm on loopback ports, whose
``otel_llm_receiver_accepted_spans_total`` says exactly what arrived. Requests are real spans from
the engine emitters, encoded by the OpenTelemetry SDK's OTLP encoder.

Every scenario runs for gRPC and HTTP: delivery, an outage with retries/backoff and the queue bound,
permanent errors, retries given up, the on-disk queue across a SIGKILL, and shutdown.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from otel_llm.config import OtlpTraceExporter, config_from_dict
from otel_llm.exporter.exporterhelper.queued_exporter import TraceExporter
from otel_llm.exporter.exporterhelper.transport import GRPC_METHOD
from otel_llm_simulate.emitters import RequestTiming, emit_vllm_v1, engine_tracer_provider
from tests.support.ports import free_port

PROTOCOLS = ["grpc", "http"]
REPO = Path(__file__).resolve().parent.parent
ACCEPTED = "otel_llm_receiver_accepted_spans_total"
INITIAL_S, MAX_S, MULTIPLIER, JITTER = 0.05, 0.5, 1.5, 0.2


# --- helpers ---------------------------------------------------------------------------------


def build_request(n_spans: int, seed: int) -> ExportTraceServiceRequest:
    """``n_spans`` vLLM V1 ``llm_request`` spans, through the SDK and its OTLP encoder."""
    memory = InMemorySpanExporter()
    provider = engine_tracer_provider("vllm-v1", memory, seed=seed)
    t0 = time.time_ns()
    for i in range(n_spans):
        timing = RequestTiming(t0 + i * 1_000_000, 0.001, 0.01, 0.05, 0.2, prompt_tokens=100, completion_tokens=20)
        emit_vllm_v1(provider, timing, request_id=f"req-{seed}-{i}")
    provider.shutdown()
    request = encode_spans(memory.get_finished_spans())
    assert sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans) == n_spans
    return request


def settings(protocol: str, endpoint: str, **queue: Any) -> OtlpTraceExporter:
    """Exporter settings through the real config loader, in the Collector's shape."""
    key = "otlp" if protocol == "grpc" else "otlphttp"
    compression = queue.pop("compression", "gzip")
    max_elapsed = queue.pop("max_elapsed_time", "0s")
    retry_enabled = queue.pop("retry_enabled", True)
    extra = {key: queue.pop(key) for key in ("tls", "headers") if key in queue}
    raw = {
        **extra,
        "endpoint": endpoint,
        "timeout": "2s",
        "compression": compression,
        "retry_on_failure": {"enabled": retry_enabled, "initial_interval": f"{INITIAL_S * 1000:g}ms",
                             "max_interval": f"{MAX_S * 1000:g}ms", "multiplier": MULTIPLIER,
                             "max_elapsed_time": max_elapsed},
        "sending_queue": {"num_consumers": 2, "queue_size": 100, **queue},
    }
    return getattr(config_from_dict({"exporters": {key: raw}}).exporters, key)


def endpoint_of(protocol: str, port: int) -> str:
    return f"127.0.0.1:{port}" if protocol == "grpc" else f"http://127.0.0.1:{port}"


def backend_port(server: Any, protocol: str) -> int:
    return server.grpc_port if protocol == "grpc" else server.http_port


def on_port(protocol: str, port: int) -> dict[str, Any]:
    """make_server overrides putting the backend's ``protocol`` receiver on ``port``."""
    return {"receivers": {"otlp": {"protocols": {protocol: {"endpoint": f"127.0.0.1:{port}"}}}}}


def accepted(server: Any) -> float:
    return server.scrape().value(ACCEPTED)


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)


class Stats:
    """The exporter's self-telemetry, read from its registry."""

    def __init__(self, registry: CollectorRegistry, name: str) -> None:
        self.registry = registry
        self.name = name

    def __call__(self, metric: str, **labels: str) -> float:
        """Sum of ``otel_llm_exporter_<metric>`` samples of this exporter whose labels include ``labels``."""
        want = {"exporter": self.name, **labels}
        full = f"otel_llm_exporter_{metric}"
        total = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == full and want.items() <= sample.labels.items():
                    total += sample.value
        return total

    def dropped(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == "otel_llm_exporter_dropped_spans_total" and sample.labels["exporter"] == self.name:
                    if sample.value:
                        out[sample.labels["reason"]] = sample.value
        return out


@pytest.fixture
def exporters() -> Iterator[Callable[..., tuple[TraceExporter, Stats]]]:
    made: list[TraceExporter] = []

    def make(protocol: str, config: OtlpTraceExporter, name: str | None = None) -> tuple[TraceExporter, Stats]:
        registry = CollectorRegistry()
        name = name or ("otlp" if protocol == "grpc" else "otlphttp")
        exporter = TraceExporter(name, protocol, config, registry)
        made.append(exporter)
        return exporter, Stats(registry, name)

    yield make
    for exporter in made:
        exporter.shutdown(0)


def queue_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".otlpq"))


# --- (1) delivery ----------------------------------------------------------------------------


@pytest.mark.parametrize("protocol,compression,form", [
    ("grpc", "gzip", "host:port"),
    ("grpc", "none", "http://host:port"),
    ("http", "gzip", "base URL"),
    ("http", "none", "URL ending /v1/traces"),
])
def test_delivers_exactly_the_submitted_spans(make_server, exporters, protocol, compression, form):
    backend = make_server()
    port = backend_port(backend, protocol)
    endpoint = {"host:port": f"127.0.0.1:{port}", "http://host:port": f"http://127.0.0.1:{port}",
                "base URL": f"http://127.0.0.1:{port}", "URL ending /v1/traces": f"http://127.0.0.1:{port}/v1/traces"}[form]
    exporter, stats = exporters(protocol, settings(protocol, endpoint, compression=compression))
    exporter.start()
    sizes = list(range(1, 11))
    assert all(exporter.submit(build_request(n, seed)) for seed, n in enumerate(sizes))
    total = sum(sizes)
    wait_for(lambda: stats("sent_requests_total") == len(sizes), 15, "every request acknowledged")
    assert accepted(backend) == total  # counted by the backend before it answers: no race
    assert stats("sent_spans_total") == total
    assert stats("failed_requests_total") == 0 and stats("retries_total") == 0
    assert stats.dropped() == {}
    assert exporter.queue_depth == 0 and stats("queue_size") == 0
    assert stats("queue_capacity") == 100


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_partial_success_rejections_are_counted(make_server, exporters, protocol):
    backend = make_server()
    exporter, stats = exporters(protocol, settings(protocol, endpoint_of(protocol, backend_port(backend, protocol))))
    exporter.start()
    request = build_request(6, seed=7)
    request.resource_spans[0].scope_spans[0].spans[2].span_id = b"\x00" * 8  # the backend rejects invalid ids
    assert exporter.submit(request)
    wait_for(lambda: stats("sent_requests_total") == 1, 10, "the request acknowledged")
    assert accepted(backend) == 5
    assert stats("rejected_spans_total") == 1
    assert stats("sent_spans_total") == 5
    assert stats("failed_requests_total") == 0 and stats.dropped() == {}


# --- (2) backend down, then up ---------------------------------------------------------------


def max_attempts(elapsed_s: float) -> int:
    """Most attempts one sender can make in ``elapsed_s`` with the configured backoff at its shortest jitter."""
    attempts, waited, interval = 1, 0.0, INITIAL_S
    while True:
        waited += interval * (1 - JITTER)
        if waited > elapsed_s:
            return attempts
        attempts += 1
        interval = min(interval * MULTIPLIER, MAX_S)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_outage_retries_with_backoff_bounds_the_queue_and_delivers_after(make_server, exporters, protocol):
    port = free_port()  # nothing listens here until the backend starts on it
    queue_size, consumers = 6, 2
    exporter, stats = exporters(protocol, settings(protocol, endpoint_of(protocol, port), queue_size=queue_size,
                                                   num_consumers=consumers))
    started = time.monotonic()
    exporter.start()
    results: list[tuple[bool, int]] = []
    for seed in range(15):  # steady submission through the outage
        n = 1 + seed % 4
        results.append((exporter.submit(build_request(n, seed)), n))
        time.sleep(0.08)  # pacing the producer, not synchronisation
    wait_for(lambda: stats("failed_requests_total") >= 3 * consumers, 10, "failed attempts during the outage")

    # The bound holds: exactly queue_size requests held (waiting + in flight), the rest refused.
    accepted_spans = sum(n for ok, n in results if ok)
    refused = [(ok, n) for ok, n in results if not ok]
    assert sum(ok for ok, _ in results) == queue_size
    assert exporter.queue_depth == queue_size and stats("queue_size") == queue_size
    assert stats("dropped_requests_total", reason="queue_full") == len(refused)
    assert stats("dropped_spans_total", reason="queue_full") == sum(n for _, n in refused)
    assert stats("sent_requests_total") == 0

    # Retried with backoff: several attempts, but far fewer than a tight loop would make.
    failed = stats("failed_requests_total")
    retries = stats("retries_total")
    elapsed = time.monotonic() - started
    assert retries >= failed - consumers and retries > 0
    assert failed <= consumers * max_attempts(elapsed), (failed, elapsed)
    reason = "grpc_unavailable" if protocol == "grpc" else "connection_error"
    assert stats("failed_requests_total", reason=reason) == failed

    backend = make_server(on_port(protocol, port))
    wait_for(lambda: stats("sent_spans_total") == accepted_spans, 15, "the queued spans delivered")
    wait_for(lambda: exporter.queue_depth == 0, 5, "the queue drained")
    assert accepted(backend) == accepted_spans
    assert stats("sent_requests_total") == queue_size

    # The queue accepts again, and nothing was lost for any other reason.
    assert all(exporter.submit(build_request(2, 100 + i)) for i in range(3))
    wait_for(lambda: stats("sent_spans_total") == accepted_spans + 6, 10, "post-recovery spans delivered")
    assert accepted(backend) == accepted_spans + 6
    assert set(stats.dropped()) == {"queue_full"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_queue_disabled_accepts_only_what_a_free_sender_takes(make_server, exporters, protocol):
    port = free_port()
    exporter, stats = exporters(protocol, settings(protocol, endpoint_of(protocol, port), enabled=False,
                                                   num_consumers=2, queue_size=50))
    exporter.start()
    assert stats("queue_capacity") == 2
    results = [exporter.submit(build_request(3, seed)) for seed in range(5)]
    assert results.count(True) == 2
    assert stats("dropped_spans_total", reason="queue_full") == 9
    backend = make_server(on_port(protocol, port))
    wait_for(lambda: stats("sent_spans_total") == 6, 15, "the two accepted requests delivered")
    assert accepted(backend) == 6


# --- (3) permanent errors, retries given up --------------------------------------------------


def test_http_permanent_error_is_dropped_not_retried(make_server, exporters):
    backend = make_server()
    # The backend's metrics port answers POST /v1/traces with 405 (read-only but for the web view's login): not retryable.
    exporter, stats = exporters("http", settings("http", backend.metrics_url))
    exporter.start()
    sizes = [2, 3, 4]
    assert all(exporter.submit(build_request(n, seed)) for seed, n in enumerate(sizes))
    wait_for(lambda: exporter.queue_depth == 0, 10, "the requests dropped")
    assert stats("dropped_spans_total", reason="permanent_error") == sum(sizes)
    assert stats("dropped_requests_total", reason="permanent_error") == len(sizes)
    assert stats("failed_requests_total", reason="http_405") == len(sizes)  # one attempt each
    assert stats("failed_requests_total") == len(sizes)
    assert stats("retries_total") == 0 and stats("sent_requests_total") == 0
    assert accepted(backend) == 0


def test_grpc_resource_exhausted_without_retry_info_is_permanent(make_server, exporters):
    # The backend refuses messages over 1 MiB with RESOURCE_EXHAUSTED and no RetryInfo: the OTLP spec
    # says that is not retryable (resending the same message cannot succeed).
    backend = make_server({"receivers": {"otlp": {"protocols": {"grpc": {"max_recv_msg_size_mib": 1}}}}})
    exporter, stats = exporters("grpc", settings("grpc", endpoint_of("grpc", backend.grpc_port), compression="none",
                                                 num_consumers=1))
    exporter.start()
    big = build_request(3000, seed=1)
    assert big.ByteSize() > 1024 * 1024
    assert exporter.submit(big)
    assert exporter.submit(build_request(4, seed=2))  # a normal request right after is delivered
    wait_for(lambda: exporter.queue_depth == 0, 15, "both requests finished")
    assert stats("failed_requests_total", reason="grpc_resource_exhausted") == 1
    assert stats("dropped_spans_total", reason="permanent_error") == 3000
    assert stats("retries_total") == 0
    assert stats("sent_spans_total") == 4 and accepted(backend) == 4


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_gives_up_after_max_elapsed_time(exporters, protocol):
    exporter, stats = exporters(protocol, settings(protocol, endpoint_of(protocol, free_port()),
                                                   max_elapsed_time="400ms"))
    started = time.monotonic()
    exporter.start()
    assert exporter.submit(build_request(5, seed=3))
    wait_for(lambda: exporter.queue_depth == 0, 10, "the request given up")
    took = time.monotonic() - started
    assert stats("dropped_spans_total", reason="retries_exhausted") == 5
    assert stats("failed_requests_total") >= 3 and stats("retries_total") >= 2
    assert took < 0.4 + 2.0  # gave up around max_elapsed_time, not later


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_retry_disabled_drops_on_first_retryable_failure(exporters, protocol):
    exporter, stats = exporters(protocol, settings(protocol, endpoint_of(protocol, free_port()), retry_enabled=False))
    exporter.start()
    assert exporter.submit(build_request(2, seed=4))
    wait_for(lambda: exporter.queue_depth == 0, 10, "the request dropped")
    assert stats("dropped_spans_total", reason="retry_disabled") == 2
    assert stats("failed_requests_total") == 1 and stats("retries_total") == 0


# --- TLS (with client certificates) and headers -----------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    """A CA, a server certificate for localhost and a client certificate, made by the openssl CLI."""
    directory = tmp_path_factory.mktemp("pki")
    (directory / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60, cwd=directory)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=otel-llm exporter test CA")
    for who in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr",
                "-subj", f"/CN={'localhost' if who == 'server' else 'otel-llm-exporter'}")
        openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{who}.crt", "-days", "2", *(["-extfile", "server.ext"] if who == "server" else []))
    return {name: str(directory / name) for name in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mutual_tls_and_headers(make_server, exporters, pki, protocol):
    token = "exporter-token"
    receiver = {"tls": {"cert_file": pki["server.crt"], "key_file": pki["server.key"], "client_ca_file": pki["ca.crt"]},
                "auth": {"bearer_token": token}}
    backend = make_server({"receivers": {"otlp": {"protocols": {protocol: receiver}}}})
    port = backend_port(backend, protocol)
    # gRPC: a bare host:port with tls.insecure false means TLS; HTTP: the https scheme does.
    endpoint = f"localhost:{port}" if protocol == "grpc" else f"https://localhost:{port}"
    tls = {"insecure": False, "ca_file": pki["ca.crt"], "cert_file": pki["client.crt"], "key_file": pki["client.key"]}
    exporter, stats = exporters(protocol, settings(protocol, endpoint, tls=tls,
                                                   headers={"Authorization": f"Bearer {token}"}))
    exporter.start()
    assert exporter.submit(build_request(3, seed=11)) and exporter.submit(build_request(4, seed=12))
    wait_for(lambda: stats("sent_spans_total") == 7, 15, "delivery over mutual TLS with the bearer token")
    assert accepted(backend) == 7 and stats("failed_requests_total") == 0

    # Without the header the backend refuses: permanent, dropped after one attempt.
    anonymous, anon_stats = exporters(protocol, settings(protocol, endpoint, tls=tls), name="anonymous")
    anonymous.start()
    assert anonymous.submit(build_request(2, seed=13))
    wait_for(lambda: anonymous.queue_depth == 0, 15, "the unauthenticated request dropped")
    reason = "grpc_unauthenticated" if protocol == "grpc" else "http_401"
    assert anon_stats("failed_requests_total", reason=reason) == 1
    assert anon_stats("dropped_spans_total", reason="permanent_error") == 2
    assert anon_stats("retries_total") == 0
    assert accepted(backend) == 7


# --- server retry hints: a throttling front for the real backend -----------------------------


def spans_in(payload: bytes) -> int:
    request = ExportTraceServiceRequest()
    request.ParseFromString(payload)
    return sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)


class ThrottlingHttpFront:
    """In front of the real backend: records each request's time and span count; with ``throttle``
    answers the first POST 503 + ``Retry-After: 1`` (or ``retry_after``); forwards the rest to the backend."""

    def __init__(self, backend_port: int, throttle: bool = True, retry_after: str = "1") -> None:
        self.times: list[float] = []
        self.span_counts: list[int] = []
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                front.times.append(time.monotonic())
                plain = gzip.decompress(body) if self.headers.get("Content-Encoding") == "gzip" else body
                front.span_counts.append(spans_in(plain))
                if throttle and len(front.times) == 1:
                    self.send_response(503)
                    self.send_header("Retry-After", retry_after)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection("127.0.0.1", backend_port, timeout=5)
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "content-encoding")}
                conn.request("POST", self.path, body=body, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                conn.close()
                self.send_response(response.status)
                self.send_header("Content-Type", response.getheader("Content-Type") or "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ThrottlingGrpcFront:
    """As ThrottlingHttpFront; with ``throttle`` the first Export gets RESOURCE_EXHAUSTED + a 1 s ``RetryInfo``."""

    def __init__(self, backend_port: int, throttle: bool = True) -> None:
        self.times: list[float] = []
        self.span_counts: list[int] = []
        self._backend = grpc.insecure_channel(f"127.0.0.1:{backend_port}")
        forward = self._backend.unary_unary(GRPC_METHOD, request_serializer=None, response_deserializer=None)

        def export(payload: bytes, context: grpc.ServicerContext) -> bytes:
            self.times.append(time.monotonic())
            self.span_counts.append(spans_in(payload))
            if throttle and len(self.times) == 1:
                detail = any_pb2.Any()
                detail.Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1)))
                status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="slow down", details=[detail])
                context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down")
            return forward(payload, timeout=5)

        service, method = GRPC_METHOD.strip("/").split("/")
        handler = grpc.method_handlers_generic_handler(service, {method: grpc.unary_unary_rpc_method_handler(
            export, request_deserializer=None, response_serializer=None)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def close(self) -> None:
        self.server.stop(0).wait()
        self._backend.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_server_retry_hint_is_honoured(make_server, exporters, protocol):
    backend = make_server()
    front = (ThrottlingGrpcFront if protocol == "grpc" else ThrottlingHttpFront)(backend_port(backend, protocol))
    try:
        exporter, stats = exporters(protocol, settings(protocol, endpoint_of(protocol, front.port), num_consumers=1))
        exporter.start()
        assert exporter.submit(build_request(4, seed=5))
        wait_for(lambda: stats("sent_spans_total") == 4, 10, "delivery after the throttled attempt")
        assert accepted(backend) == 4
        assert len(front.times) == 2
        # Our own backoff would have waited ~50 ms; the server asked for 1 s.
        assert front.times[1] - front.times[0] >= 0.95
        reason = "grpc_resource_exhausted" if protocol == "grpc" else "http_503"
        assert stats("failed_requests_total", reason=reason) == 1 and stats("retries_total") == 1
    finally:
        front.close()


def test_a_huge_retry_hint_is_capped(make_server, exporters, monkeypatch):
    """``Retry-After: 10000000000`` with ``max_elapsed_time: 0`` parked the sender for 31 years (and
    10^10 s overflowed the wait, dropping the batch): the hint is honoured up to MAX_RETRY_HINT_S
    (5 min; 1 s here so that the test sees the retry)."""
    from otel_llm.exporter.exporterhelper import queued_exporter

    monkeypatch.setattr(queued_exporter, "MAX_RETRY_HINT_S", 1.0)
    backend = make_server()
    front = ThrottlingHttpFront(backend_port(backend, "http"), retry_after="10000000000")
    try:
        exporter, stats = exporters("http", settings("http", endpoint_of("http", front.port), num_consumers=1))
        exporter.start()
        assert exporter.submit(build_request(4, seed=7))
        wait_for(lambda: stats("sent_spans_total") == 4, 20, "delivery after the capped wait")
        assert accepted(backend) == 4 and len(front.times) == 2
        assert 0.9 <= front.times[1] - front.times[0] < 10
        assert stats("dropped_spans_total") == 0
    finally:
        front.close()


# --- (4) on-disk queue -----------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import json, sys, threading
    from prometheus_client import CollectorRegistry
    from tests.test_otlp_trace_exporter import build_request, settings
    from otel_llm.exporter.exporterhelper.queued_exporter import TraceExporter

    protocol, endpoint, storage = sys.argv[1:4]
    exporter = TraceExporter("otlp", protocol, settings(protocol, endpoint, queue_size=5, storage=storage),
                             CollectorRegistry())
    exporter.start()
    results = [[exporter.submit(build_request(n, seed=n)), n] for n in range(1, 9)]
    print(json.dumps(results), flush=True)
    threading.Event().wait()  # retrying against a dead backend until SIGKILLed
""")


def run_child_until_killed(protocol: str, endpoint: str, storage: Path) -> list[list[Any]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, protocol, endpoint, str(storage)], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        selector = selectors.DefaultSelector()
        selector.register(child.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        if not selector.select(timeout=30):
            raise AssertionError("the child exporter did not report its submissions in time")
        line = child.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise AssertionError(f"the child exporter died: {child.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        return json.loads(line)
    finally:
        child.send_signal(signal.SIGKILL)  # a crash: no shutdown, no flush
        child.wait(timeout=10)
        child.stdout.close()  # type: ignore[union-attr]
        child.stderr.close()  # type: ignore[union-attr]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_disk_queue_survives_sigkill_and_delivers_exactly_once(make_server, exporters, tmp_path, protocol):
    storage = tmp_path / "queue"
    dead = endpoint_of(protocol, free_port())
    results = run_child_until_killed(protocol, dead, storage)
    submitted = sum(n for ok, n in results if ok)
    assert [ok for ok, _ in results] == [True] * 5 + [False] * 3  # queue_size 5
    files = queue_files(storage)
    assert len(files) == 5

    # Damage: a garbage file that sorts first, and a truncated copy of a real one.
    garbage, truncated = f"{0:016d}-{0:019d}.otlpq", f"{999999:016d}-{time.time_ns():019d}.otlpq"
    (storage / garbage).write_bytes(b"not a queue file at all")
    newest = (storage / files[-1]).read_bytes()
    (storage / truncated).write_bytes(newest[: len(newest) // 2])

    # Restart with the backend still down: the replayed files fill the queue; shutdown keeps them.
    restarted, stats = exporters(protocol, settings(protocol, dead, queue_size=5, storage=str(storage)))
    restarted.start()  # takes the directory's lock (building an exporter takes nothing)
    with pytest.raises(OSError, match="in use"):
        TraceExporter("other", protocol, settings(protocol, dead, storage=str(storage)), CollectorRegistry()).start()
    assert restarted.queue_depth == 5
    assert stats("dropped_requests_total", reason="corrupt_persisted") == 2
    assert stats("dropped_spans_total", reason="corrupt_persisted") == results[4][1]  # the truncated copy's header
    assert sorted(p.name for p in storage.glob("*.corrupt")) == sorted([garbage + ".corrupt", truncated + ".corrupt"])
    assert not restarted.submit(build_request(1, seed=50))
    assert stats("dropped_spans_total", reason="queue_full") == 1
    started = time.monotonic()
    restarted.shutdown(0.3)
    assert time.monotonic() - started < 3
    assert queue_files(storage) == files  # nothing sent, nothing lost
    assert stats("dropped_spans_total", reason="shutdown") == 0

    # Backend up: a new exporter over the same directory delivers everything, once, oldest first
    # (one sender; a recording front before the backend sees the order).
    backend = make_server()
    front = (ThrottlingGrpcFront if protocol == "grpc" else ThrottlingHttpFront)(backend_port(backend, protocol),
                                                                                 throttle=False)
    try:
        live = endpoint_of(protocol, front.port)
        delivering, stats = exporters(protocol, settings(protocol, live, queue_size=5, num_consumers=1,
                                                         storage=str(storage)), name="again")
        delivering.start()
        wait_for(lambda: stats("sent_spans_total") == submitted, 15, "the persisted spans delivered")
        wait_for(lambda: delivering.queue_depth == 0, 5, "the queue drained")
    finally:
        front.close()
    assert accepted(backend) == submitted
    assert front.span_counts == [1, 2, 3, 4, 5]  # submission order: request n has n spans
    assert stats("sent_requests_total") == 5
    assert queue_files(storage) == []  # acknowledged files are deleted
    assert stats.dropped() == {}
    delivering.shutdown(5)

    # And a further restart finds nothing left to send.
    after, _ = exporters(protocol, settings(protocol, live, storage=str(storage)), name="after")
    after.start()
    assert after.queue_depth == 0
    after.shutdown(5)
    assert accepted(backend) == submitted


# --- (5) shutdown ----------------------------------------------------------------------------


@pytest.mark.parametrize("storage", [False, True], ids=["memory", "disk"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shutdown_flushes_the_queue_to_a_live_backend(make_server, exporters, tmp_path, protocol, storage):
    backend = make_server()
    directory = tmp_path / "queue"
    exporter, stats = exporters(protocol, settings(protocol, endpoint_of(protocol, backend_port(backend, protocol)),
                                                   num_consumers=1, queue_size=200,
                                                   storage=str(directory) if storage else ""))
    sizes = [1 + i % 5 for i in range(120)]
    # Queued before the sender starts, so the flush has a real backlog to work through.
    assert all(exporter.submit(build_request(n, seed)) for seed, n in enumerate(sizes))
    assert exporter.queue_depth == len(sizes)
    exporter.start()
    started = time.monotonic()
    exporter.shutdown(20)
    assert time.monotonic() - started < 20
    assert exporter.queue_depth == 0
    assert stats("sent_spans_total") == sum(sizes)
    assert accepted(backend) == sum(sizes)  # exactly once, also when queued on disk before start()
    assert stats.dropped() == {}
    if storage:
        assert queue_files(directory) == []
    assert not exporter.submit(build_request(3, seed=999))  # closed
    assert stats("dropped_spans_total", reason="shutdown") == 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shutdown_without_storage_drops_what_it_cannot_send_in_time(exporters, protocol):
    exporter, stats = exporters(protocol, settings(protocol, endpoint_of(protocol, free_port())))
    exporter.start()
    sizes = [3, 4, 5, 6]
    assert all(exporter.submit(build_request(n, seed)) for seed, n in enumerate(sizes))
    started = time.monotonic()
    exporter.shutdown(0.3)
    took = time.monotonic() - started
    assert 0.25 <= took < 3  # kept trying until the timeout, then stopped promptly
    assert exporter.queue_depth == 0
    assert stats("dropped_spans_total", reason="shutdown") == sum(sizes)
    assert stats("dropped_requests_total", reason="shutdown") == len(sizes)
    assert stats("sent_spans_total") == 0
