"""Saying no without losing data from clients that do not retry (issue 24, items 11 and 12).

A request that finds the intake full waits up to ``receivers.otlp.admission_wait`` for room before
it is refused, so a short stall of the pipeline costs a client that never retries (the JS gRPC
exporter) nothing; ``/readyz`` turns 503 once the memory limiter, or a full intake, has refused for
``UNREADY_AFTER_REFUSING_S``, so a load balancer sends elsewhere; and the Python, Go and Java SDKs'
exporters (gRPC and HTTP) and the JS HTTP exporter retry what otel-llm refuses (429, 503,
UNAVAILABLE), the JS gRPC exporter never does, and the Java and JS exporters take a partial success
without sending the batch again, as docs/production.md's client table says (the peers in
``tests/peers/``: Go built with the Go toolchain, Java with Maven and JS with ``npm ci`` once into
``~/.cache/otel-llm/peers`` by ``tests/peers/sdks.sh``, which ``make test`` runs; each skipped, saying
why, only where its toolchain is missing; a failed build fails)."""

from __future__ import annotations

import contextlib
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


# --- the Java and JS SDKs (tests/peers/sdks.sh builds them once into ~/.cache/otel-llm/peers) -----------

SDKS = Path(__file__).resolve().parent / "peers" / "sdks.sh"


def _sdk_peer(group: str, tools: tuple[str, ...], row: str) -> Path:
    """The peer's built directory (``make test`` builds it; a no-op then); skipped only without its
    toolchain, failed if the build fails."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)}: the {row} row of the client table is not tested here")
    result = subprocess.run([str(SDKS), "build", group], capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        pytest.fail(f"cannot build the {row} peer (tests/peers/sdks.sh build {group}): {result.stderr[-800:]}")
    return Path(subprocess.run([str(SDKS), "path", group], capture_output=True, text=True, check=True).stdout.strip())


@pytest.fixture(scope="module")
def jssdk_peer() -> list[str]:
    """``node peer.js`` of the JS SDK peer (exporter-trace-otlp-grpc and -http 0.301, sdk-trace 3.1)."""
    return ["node", str(_sdk_peer("js", ("node", "npm"), "JS SDK") / "peer.js")]


@pytest.fixture(scope="module")
def javasdk_peer() -> list[str]:
    """``java Peer`` of the Java SDK peer (OtlpGrpcSpanExporter and OtlpHttpSpanExporter 1.68)."""
    built = _sdk_peer("java", ("java", "mvn"), "Java SDK") / "target"
    return ["java", "-cp", f"{built / 'javasdk-peer-1.jar'}:{built / 'lib'}/*", "Peer"]


def _start_peer(peer: list[str], protocol: str, endpoint: str, spans: int, timeout_ms: int,
                invalid: int = 0) -> subprocess.Popen[str]:
    """A peer, once it is about to export (a JVM's or Node's start-up takes a while on a loaded machine)."""
    process = subprocess.Popen([*peer, protocol, endpoint, str(spans), str(timeout_ms), str(invalid)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line and json.loads(line) == {"exporting": True}, (line, process.stderr.read() if process.stderr else "")
    return process


def _outcome(process: subprocess.Popen[str]) -> dict[str, object]:
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    return dict(json.loads(stdout.strip().splitlines()[-1]))


def _succeeded(outcome: dict[str, object]) -> bool:
    """The export's result: the Java peer says ``success``, the JS one its ExportResultCode (0: SUCCESS)."""
    return outcome.get("success") is True or outcome.get("code") == 0


def _refused_spans(server, reason: str) -> int:  # noqa: ANN001
    """Read from the receivers' shared counters, not /metrics: a scrape waits for the trace buffer's
    lock, which a stalled pipeline holds."""
    _, spans, _ = server.service.ingest._counters.snapshot()
    return sum(count for (_, refused), count in spans.items() if refused == reason)


def _refused_then_taken(server, peer: list[str], protocol: str, refusal: str) -> dict[str, object]:  # noqa: ANN001
    """Export 5 spans through ``peer`` while otel-llm refuses them (``memory_limit``: the memory
    limiter, HTTP 503; ``queue_full``: the pipeline stalled and its intake full, HTTP 429; both gRPC
    UNAVAILABLE) until the peer has sent them again at least once, refused too; then stop refusing."""
    port = server.grpc_port if protocol == "grpc" else server.http_port
    limiter = server.service.pipeline.memory_limiter
    stall: contextlib.AbstractContextManager[object] = contextlib.nullcontext()
    if refusal == "memory_limit":
        limiter._rss = lambda: limiter.soft_limit_bytes + 1  # the process is "over" its soft limit
        limiter.check()
    else:
        stall = server.service.pipeline.assembler._lock
    with stall:
        if refusal == "queue_full":
            with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                _fill_stalled_intake(server, channel)
        process = _start_peer(peer, protocol, f"127.0.0.1:{port}", 5, 30_000)
        deadline = time.monotonic() + 30
        while _refused_spans(server, refusal) < 10:  # the batch refused, sent again, refused again
            assert process.poll() is None, f"the peer gave up after one refusal: {process.communicate()}"
            assert time.monotonic() < deadline, f"not sent again: {_refused_spans(server, refusal)} spans refused"
            time.sleep(0.05)
        if refusal == "memory_limit":
            limiter._rss = lambda: limiter.soft_limit_bytes - 1
            limiter.check()
    return _outcome(process)


@pytest.mark.parametrize("refusal", ["memory_limit", "queue_full"])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_java_sdk_exporters_retry_what_otel_llm_refuses(make_server, javasdk_peer: list[str], protocol: str,
                                                            refusal: str):
    """The client table's Java row: OtlpGrpcSpanExporter retries UNAVAILABLE, OtlpHttpSpanExporter
    429 and 503 (their default retry policy); the batch is taken once the refusals stop, once."""
    server = make_server({"receivers": {"otlp": {"max_queued_spans": 1500, "admission_wait": "0s"}}})
    outcome = _refused_then_taken(server, javasdk_peer, protocol, refusal)
    assert _succeeded(outcome), outcome
    filled = 1500 if refusal == "queue_full" else 0
    server.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") == filled + 5,
                      what="the Java batch accepted once")


@pytest.mark.parametrize("refusal", ["memory_limit", "queue_full"])
def test_the_js_http_exporter_retries_what_otel_llm_refuses(make_server, jssdk_peer: list[str], refusal: str):
    """The client table's JS-over-HTTP cell: exporter-trace-otlp-http retries 429 and 503 (where the
    gRPC exporter never retries, below); the batch is taken once the refusals stop, once."""
    server = make_server({"receivers": {"otlp": {"max_queued_spans": 1500, "admission_wait": "0s"}}})
    outcome = _refused_then_taken(server, jssdk_peer, "http", refusal)
    assert _succeeded(outcome), outcome
    filled = 1500 if refusal == "queue_full" else 0
    server.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") == filled + 5,
                      what="the JS batch accepted once")


@pytest.mark.parametrize("sdk,protocol", [("java", "grpc"), ("java", "http"), ("js", "grpc"), ("js", "http")])
def test_a_partial_success_is_taken_as_success_and_not_sent_again(make_server, request, sdk: str, protocol: str):
    """3 good spans and 2 with all-zero ids: otel-llm takes the 3 and rejects the 2 through OTLP
    partial success (``rejected_spans`` and a message). The Java and JS exporters report the export
    a success and do not send the batch again: the 3 are accepted once."""
    peer = request.getfixturevalue(f"{sdk}sdk_peer")
    server = make_server()
    port = server.grpc_port if protocol == "grpc" else server.http_port
    outcome = _outcome(_start_peer(peer, protocol, f"127.0.0.1:{port}", 3, 30_000, invalid=2))
    assert _succeeded(outcome), outcome
    scrape = server.wait_until(lambda s: s.value("otel_llm_receiver_refused_spans_total", reason="invalid_id") == 2,
                               what="the 2 rejected through partial success")
    assert scrape.value("otel_llm_receiver_accepted_spans_total") == 3


# --- the JS SDK's gRPC exporter, which never retries -------------------------------------------------------


@pytest.mark.parametrize("wait", ["0s", "20s"])
def test_the_js_grpc_exporter_never_retries_and_admission_wait_keeps_its_batch(make_server, jssdk_peer: list[str],
                                                                               wait: str):
    """The JS gRPC exporter drops a batch refused once (issue 24 lost 142 of 200 under load). With
    ``admission_wait: 0s`` a 0.5 s stall of the pipeline loses its batch; with a wait, the batch is
    accepted once the stall ends."""
    server = make_server({"receivers": {"otlp": {"max_queued_spans": 1500, "admission_wait": wait}}})
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        with server.service.pipeline.assembler._lock:
            _fill_stalled_intake(server, channel)
            process = _start_peer(jssdk_peer, "grpc", f"127.0.0.1:{server.grpc_port}", 5, 30_000)
            if wait == "0s":
                outcome = [_outcome(process)]  # answered (refused) while the pipeline still stalls
            else:
                time.sleep(0.5)  # the stall goes on a while after the export is sent
        if wait != "0s":
            outcome = [_outcome(process)]
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
