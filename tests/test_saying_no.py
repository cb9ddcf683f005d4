"""Saying no without losing data from clients that do not retry (issue 24, items 11 and 12).

A request that finds the intake full waits up to ``receivers.otlp.admission_wait`` for room before
it is refused, so a short stall of the pipeline costs a client that never retries (the JS gRPC
exporter) nothing; ``/readyz`` turns 503 once the memory limiter has refused for
``UNREADY_AFTER_REFUSING_S``, so a load balancer sends elsewhere; and the Python and Go SDKs'
exporters (gRPC and HTTP) retry what otel-llm refuses, as the README's client table says (the Go
peer, ``tests/peers/gosdk``, is built with the Go toolchain; skipped without one)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_llm.service.graph import UNREADY_AFTER_REFUSING_S
from tests.support.payloads import vllm_batch
from tests.test_bad_input import EXPORT, http_post
from tests.test_intake_log import vllm_spans


def _readyz(server) -> int:  # noqa: ANN001
    return _readyz_answer(server)[0]


def _readyz_answer(server) -> tuple[int, str]:  # noqa: ANN001
    try:
        with urllib.request.urlopen(f"{server.metrics_url}/readyz", timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _fill_stalled_intake(server, channel) -> None:  # noqa: ANN001
    """With the pipeline stalled (the caller holds the trace buffer's lock), 3 requests of 500 spans
    fill an intake of ``max_queued_spans: 1500``."""
    export = channel.unary_unary(EXPORT)
    for _ in range(3):
        export(vllm_batch(500, parent=True).SerializeToString(), timeout=30)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_short_stall_is_waited_out_not_refused(make_server, protocol: str):
    """The intake full while the pipeline stalls: the next request waits (here up to 20 s) and is
    accepted once the stall ends (0.5 s on), where before it was refused at once."""
    server = make_server({"receivers": {"otlp": {"max_queued_spans": 1500, "admission_wait": "20s"}}})
    outcome: list[object] = []
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        lock = server.service.pipeline.assembler._lock
        with lock:
            _fill_stalled_intake(server, channel)

            def send() -> None:
                payload = vllm_batch(500, parent=True).SerializeToString()
                if protocol == "grpc":
                    try:
                        channel.unary_unary(EXPORT)(payload, timeout=60)
                        outcome.append(200)
                    except grpc.RpcError as exc:
                        outcome.append(exc.code())
                else:
                    outcome.append(http_post(server, payload)[0])

            sender = threading.Thread(target=send)
            sender.start()
            sender.join(0.5)
            assert sender.is_alive() and not outcome, f"answered while the intake was full: {outcome}"
        sender.join(30)
    assert outcome == [200]
    scrape = server.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") == 2000,
                               what="every request accepted")
    assert scrape.value("otel_llm_receiver_refused_spans_total") == 0


def test_admission_wait_zero_refuses_at_once(make_server):
    server = make_server({"receivers": {"otlp": {"max_queued_spans": 1500, "admission_wait": "0s"}}})
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with server.service.pipeline.assembler._lock:
            _fill_stalled_intake(server, channel)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(EXPORT)(vllm_batch(500, parent=True).SerializeToString(), timeout=30)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started < 5


def test_readyz_reflects_a_sustained_memory_limiter_refusal(make_server):
    """A refusal shorter than UNREADY_AFTER_REFUSING_S leaves /readyz 200 (no flapping); a longer
    one turns it 503 with the reason, and recovery turns it back to 200."""
    server = make_server({"receivers": {"otlp": {"admission_wait": "0s"}}})
    limiter = server.service.pipeline.memory_limiter
    assert limiter is not None
    limiter._rss = lambda: limiter.soft_limit_bytes + 1  # the process is "over" its soft limit
    limiter.check()
    refusing_since = time.monotonic()
    assert http_post(server, vllm_batch(10).SerializeToString())[0] == 503
    if time.monotonic() - refusing_since < UNREADY_AFTER_REFUSING_S - 1:
        assert _readyz(server) == 200
    deadline = refusing_since + UNREADY_AFTER_REFUSING_S + 20
    while _readyz(server) != 503:
        assert time.monotonic() < deadline, "/readyz still 200 long after the limiter started refusing"
        time.sleep(0.1)
    assert "memory_limiter" in _readyz_answer(server)[1]
    limiter._rss = lambda: limiter.soft_limit_bytes - 1
    limiter.check()
    assert _readyz(server) == 200


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_python_sdk_exporters_retry_what_otel_llm_refuses(make_server, protocol: str):
    """The README's client table: the Python SDK's OTLP exporters retry a retryable refusal
    (gRPC UNAVAILABLE with RetryInfo, HTTP 503 with Retry-After) within their timeout. The memory
    limiter refuses for ~1.5 s (admission_wait 0: the retry is the SDK's own), then recovers."""
    server = make_server({"receivers": {"otlp": {"admission_wait": "0s"}}})
    limiter = server.service.pipeline.memory_limiter
    assert limiter is not None
    limiter._rss = lambda: limiter.soft_limit_bytes + 1
    limiter.check()
    # The SDK's per-export deadline (retries included) is its timeout: 30 s here.
    exporter = (GrpcSpanExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True, timeout=30)
                if protocol == "grpc" else
                HttpSpanExporter(endpoint=f"http://127.0.0.1:{server.http_port}/v1/traces", timeout=30))
    result: list[SpanExportResult] = []
    spans = vllm_spans("sdk-retry", rooted=5, unrooted=0)
    sender = threading.Thread(target=lambda: result.append(exporter.export(spans)))
    sender.start()
    server.wait_until(lambda s: s.value("otel_llm_receiver_refused_spans_total", reason="memory_limit") >= 5,
                      what="the first attempt refused")
    time.sleep(1.5)  # refusing a while: the SDK's next attempts are refused too
    limiter._rss = lambda: limiter.soft_limit_bytes - 1
    limiter.check()
    sender.join(40)
    exporter.shutdown()
    assert result == [SpanExportResult.SUCCESS]
    server.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") == 5, what="accepted once")


# --- the Go SDK (tests/peers/gosdk: otlptracegrpc / otlptracehttp v1.45, sdk v1.46) ----------------------

GOSDK = Path(__file__).resolve().parent / "peers" / "gosdk"


@pytest.fixture(scope="module")
def gosdk_peer(tmp_path_factory) -> Path:  # noqa: ANN001
    """The Go peer, built once (Go's build cache makes a rebuild quick); skipped where it cannot be."""
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain: the Go SDK's row of the client table is not tested here")
    binary = tmp_path_factory.mktemp("gosdk") / "gosdkpeer"
    result = subprocess.run(["go", "build", "-o", str(binary), "."], cwd=GOSDK, capture_output=True, text=True,
                            timeout=900, env={**os.environ, "GOFLAGS": "-mod=readonly"})
    if result.returncode != 0:
        pytest.skip(f"cannot build the Go SDK peer (its modules need the Go module proxy once): {result.stderr[-500:]}")
    return binary


def _run_peer(binary: Path, protocol: str, endpoint: str, spans: int, timeout_s: int) -> dict[str, object]:
    result = subprocess.run([str(binary), protocol, endpoint, str(spans), str(timeout_s)], capture_output=True,
                            text=True, timeout=timeout_s + 30)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_go_sdk_exporters_retry_what_otel_llm_refuses(make_server, gosdk_peer: Path, protocol: str):
    """The Go SDK's exporters retry a retryable refusal (gRPC UNAVAILABLE, HTTP 503 + Retry-After)."""
    server = make_server({"receivers": {"otlp": {"admission_wait": "0s"}}})
    limiter = server.service.pipeline.memory_limiter
    assert limiter is not None
    limiter._rss = lambda: limiter.soft_limit_bytes + 1
    limiter.check()
    port = server.grpc_port if protocol == "grpc" else server.http_port
    outcome: list[dict[str, object]] = []
    sender = threading.Thread(target=lambda: outcome.append(
        _run_peer(gosdk_peer, protocol, f"127.0.0.1:{port}", 5, 30)))
    sender.start()
    server.wait_until(lambda s: s.value("otel_llm_receiver_refused_spans_total", reason="memory_limit") >= 5,
                      timeout_s=30, what="the first attempt refused")
    time.sleep(1.5)
    limiter._rss = lambda: limiter.soft_limit_bytes - 1
    limiter.check()
    sender.join(60)
    assert outcome and outcome[0]["error"] == "", outcome
    server.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") == 5, what="accepted once")


def test_the_go_sdk_http_exporter_does_not_retry_a_refused_connection(gosdk_peer: Path):
    """The client table's warning: with nothing listening (otel-llm restarting), the Go SDK's HTTP
    exporter fails at once, where its gRPC exporter keeps retrying until its timeout."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{probe.getsockname()[1]}"
    http = _run_peer(gosdk_peer, "http", endpoint, 1, 8)
    assert "connection refused" in str(http["error"]) and float(str(http["seconds"])) < 4, http
    over_grpc = _run_peer(gosdk_peer, "grpc", endpoint, 1, 8)
    assert over_grpc["error"] and float(str(over_grpc["seconds"])) >= 6, over_grpc
