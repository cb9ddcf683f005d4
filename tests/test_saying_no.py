"""Saying no without losing data from clients that do not retry (issue 24, items 11 and 12).

A request that finds the intake full waits up to ``receivers.otlp.admission_wait`` for room before
it is refused, so a short stall of the pipeline costs a client that never retries (the JS gRPC
exporter) nothing; ``/readyz`` turns 503 once the memory limiter, or a full intake, has refused for
``UNREADY_AFTER_REFUSING_S``, so a load balancer sends elsewhere; and the Python and Go SDKs'
exporters (gRPC and HTTP) retry what otel-llm refuses, and the JS gRPC exporter never does, as the
README's client table says (the peers in ``tests/peers/``: Go built with the Go toolchain, JS
installed with ``npm ci``; each skipped, saying why, only where Go or Node.js is missing; a failed build fails)."""

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


def test_readyz_reflects_a_sustained_queue_full_refusal(make_server):
    """The pipeline stalled (the trace buffer's lock held) and the intake full: clients refused
    ``queue_full`` for longer than UNREADY_AFTER_REFUSING_S turn /readyz 503 with the reason (it
    stayed 200, so a load balancer kept sending to a replica refusing everything); once the stall
    ends and the refusals stop, 200 again."""
    server = make_server({"receivers": {"otlp": {"max_queued_spans": 1500, "admission_wait": "0s"}}})
    payload = vllm_batch(500, parent=True).SerializeToString()
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with server.service.pipeline.assembler._lock:
            _fill_stalled_intake(server, channel)
            refusing_since = time.monotonic()
            assert http_post(server, payload)[0] == 429  # queue_full: retryable
            if time.monotonic() - refusing_since < UNREADY_AFTER_REFUSING_S - 1:
                assert _readyz(server) == 200, "a short run of refusals is ridden out"
            deadline = refusing_since + UNREADY_AFTER_REFUSING_S + 30
            while _readyz(server) != 503:  # a client retrying as told (Retry-After: 1), well within the gap
                assert time.monotonic() < deadline, "/readyz still 200 long after the intake started refusing"
                assert http_post(server, payload)[0] == 429
                time.sleep(0.2)
            status, body = _readyz_answer(server)
            assert "receivers.otlp" in body and "queue_full" in body, body
    poll_until = time.monotonic() + 30
    while _readyz(server) != 200:  # the stall is over and nobody is refused: ready again
        assert time.monotonic() < poll_until, "/readyz still 503 after the refusals stopped"
        time.sleep(0.1)
    scrape = server.wait_until(lambda s: s.value("otel_llm_intake_queued_spans") == 0, what="the intake drained")
    assert scrape.value("otel_llm_receiver_refused_requests_total", reason="queue_full") >= 2


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
    """The Go peer, built once (Go's build cache makes a rebuild quick); skipped only without a Go toolchain."""
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain: the Go SDK's row of the client table is not tested here")
    binary = tmp_path_factory.mktemp("gosdk") / "gosdkpeer"
    result = subprocess.run(["go", "build", "-o", str(binary), "."], cwd=GOSDK, capture_output=True, text=True,
                            timeout=900, env={**os.environ, "GOFLAGS": "-mod=readonly"})
    if result.returncode != 0:
        pytest.fail(f"cannot build the Go SDK peer (its modules need the Go module proxy once): {result.stderr[-500:]}")
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


# --- the JS SDK's gRPC exporter (tests/peers/jssdk: exporter-trace-otlp-grpc 0.301), which never retries ---

JSSDK = Path(__file__).resolve().parent / "peers" / "jssdk"


@pytest.fixture(scope="module")
def jssdk_peer() -> Path:
    """The JS peer, its packages installed once from its package-lock.json; skipped only without Node.js."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("no Node.js: the JS SDK's row of the client table is not tested here")
    if not (JSSDK / "node_modules" / "@opentelemetry" / "exporter-trace-otlp-grpc").is_dir():
        result = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JSSDK, capture_output=True, text=True,
                                timeout=600)
        if result.returncode != 0:
            pytest.fail(f"cannot install the JS SDK peer's packages (npm ci): {result.stderr[-500:]}")
    return JSSDK / "peer.js"


def _start_js(peer: Path, endpoint: str, spans: int, timeout_ms: int) -> subprocess.Popen[str]:
    """The JS peer, once it is about to export (Node's start-up takes a while on a loaded machine)."""
    process = subprocess.Popen(["node", str(peer), endpoint, str(spans), str(timeout_ms)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert json.loads(line) == {"exporting": True}, (line, process.stderr.read() if process.stderr else "")
    return process


def _js_outcome(process: subprocess.Popen[str]) -> dict[str, object]:
    stdout, stderr = process.communicate(timeout=90)
    assert process.returncode == 0, stderr
    return dict(json.loads(stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("wait", ["0s", "20s"])
def test_the_js_grpc_exporter_never_retries_and_admission_wait_keeps_its_batch(make_server, jssdk_peer: Path,
                                                                               wait: str):
    """The JS gRPC exporter drops a batch refused once (issue 24 lost 142 of 200 under load). With
    ``admission_wait: 0s`` a 0.5 s stall of the pipeline loses its batch; with a wait, the batch is
    accepted once the stall ends."""
    server = make_server({"receivers": {"otlp": {"max_queued_spans": 1500, "admission_wait": wait}}})
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with server.service.pipeline.assembler._lock:
            _fill_stalled_intake(server, channel)
            process = _start_js(jssdk_peer, f"127.0.0.1:{server.grpc_port}", 5, 30_000)
            if wait == "0s":
                outcome = [_js_outcome(process)]  # answered (refused) while the pipeline still stalls
            else:
                time.sleep(0.5)  # the stall goes on a while after the export is sent
        if wait != "0s":
            outcome = [_js_outcome(process)]
    assert outcome, "the JS peer did not answer"
    if wait == "0s":
        assert outcome[0]["code"] == 1 and "UNAVAILABLE" in str(outcome[0]["error"]), outcome
        scrape = server.wait_until(lambda s: s.value("otel_llm_receiver_refused_spans_total", reason="queue_full") == 5,
                                   what="the JS batch refused once, never retried")
        assert scrape.value("otel_llm_receiver_accepted_spans_total") == 1500
    else:
        assert outcome[0]["code"] == 0, outcome
        server.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") == 1505,
                          what="the JS batch accepted after the stall")
