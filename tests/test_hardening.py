"""Production hardening: auth, TLS, content redaction, backpressure, hostile volumes and shapes."""

from __future__ import annotations

import concurrent.futures
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm.simulate.engines import RequestTiming, emit_vllm_v1, engine_tracer_provider
from otel_llm.store.sqlite import StoreReader
from tests.support.payloads import vllm_batch
from tests.test_bad_input import EXPORT, grpc_raw, http_post

TOKEN = "s3cr3t-token"
KEEP_ALL = {"tail_sampling": {"decision_wait": "2s", "grace": "100ms", "policies": [
    {"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}}


def store_bytes(path: Path) -> bytes:
    """The database and its write-ahead log: committed rows may still be only in the WAL."""
    wal = path.with_name(path.name + "-wal")
    return path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def captured_spans(count: int = 1):
    memory = InMemorySpanExporter()
    provider = engine_tracer_provider("vllm-v1", memory, service_name="secure")
    for i in range(count):
        emit_vllm_v1(provider, RequestTiming(time.time_ns(), 0.01, 0.1, 0.2, 1.0), request_id=str(i))
    return memory.get_finished_spans()


# --- auth ------------------------------------------------------------------------------------


@pytest.fixture
def authed(make_server, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")  # as a mounted secret would hold it
    auth = {"auth": {"bearer_token": TOKEN}}
    return make_server({"receivers": {"otlp": {"protocols": {"grpc": auth,
                                                             "http": {"auth": {"bearer_token_file": str(token_file)}}}}},
                        "exporters": {"prometheus": auth}})


def test_bearer_token_on_both_receivers(authed):
    server = authed
    grpc_ok = GrpcSpanExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True,
                               headers={"authorization": f"Bearer {TOKEN}"}, timeout=5)
    grpc_bad = GrpcSpanExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True,
                                headers={"authorization": "Bearer wrong"}, timeout=5)
    grpc_none = GrpcSpanExporter(endpoint=f"127.0.0.1:{server.grpc_port}", insecure=True, timeout=5)
    http_ok = HttpSpanExporter(endpoint=f"http://127.0.0.1:{server.http_port}/v1/traces",
                               headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    http_bad = HttpSpanExporter(endpoint=f"http://127.0.0.1:{server.http_port}/v1/traces", timeout=5)
    try:
        for exporter in (grpc_bad, grpc_none, http_bad):
            assert exporter.export(captured_spans()) == SpanExportResult.FAILURE
        for exporter in (grpc_ok, http_ok):
            assert exporter.export(captured_spans()) == SpanExportResult.SUCCESS
    finally:
        for exporter in (grpc_ok, grpc_bad, grpc_none, http_ok, http_bad):
            exporter.shutdown()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    request = urllib.request.Request(server.metrics_url + "/metrics", headers=headers)
    deadline = time.monotonic() + 10
    while True:
        text = urllib.request.urlopen(request, timeout=5).read().decode()
        if 'otel_llm_receiver_accepted_spans_total{protocol="http"} 1.0' in text and \
                'otel_llm_receiver_accepted_spans_total{protocol="grpc"} 1.0' in text:
            break
        assert time.monotonic() < deadline, text[-2000:]
        time.sleep(0.05)
    assert 'otel_llm_receiver_refused_requests_total{protocol="grpc",reason="unauthenticated"} 2.0' in text
    assert 'otel_llm_receiver_refused_requests_total{protocol="http",reason="unauthenticated"} 1.0' in text
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.metrics_url + "/metrics", timeout=5)
    assert info.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(server.metrics_url + "/api/traces", timeout=5)
    assert info.value.code == 401
    assert urllib.request.urlopen(server.metrics_url + "/healthz", timeout=5).status == 200


# --- TLS -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("tls")
    ca_key, ca_cert = directory / "ca.key", directory / "ca.crt"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    ext = directory / "ext.cnf"
    ext.write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca_cert), "-days", "2",
        "-subj", "/CN=otel-llm test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial", "-out",
        str(cert), "-days", "2", "-extfile", str(ext))
    return {"ca": ca_cert, "cert": cert, "key": key}


def test_tls_on_both_receivers(make_server, certificates, monkeypatch):
    # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override the exporter's certificate_file.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    tls = {"tls": {"cert_file": str(certificates["cert"]), "key_file": str(certificates["key"])}}
    server = make_server({"receivers": {"otlp": {"protocols": {"grpc": tls, "http": tls}}}})
    ca = certificates["ca"].read_bytes()
    grpc_tls = GrpcSpanExporter(endpoint=f"localhost:{server.grpc_port}", insecure=False,
                                credentials=grpc.ssl_channel_credentials(root_certificates=ca), timeout=10)
    http_tls = HttpSpanExporter(endpoint=f"https://localhost:{server.http_port}/v1/traces",
                                certificate_file=str(certificates["ca"]), timeout=10)
    plain_http = HttpSpanExporter(endpoint=f"http://127.0.0.1:{server.http_port}/v1/traces", timeout=5)
    try:
        assert grpc_tls.export(captured_spans()) == SpanExportResult.SUCCESS
        assert http_tls.export(captured_spans()) == SpanExportResult.SUCCESS
        assert plain_http.export(captured_spans()) == SpanExportResult.FAILURE  # no plaintext on a TLS port
    finally:
        for exporter in (grpc_tls, http_tls, plain_http):
            exporter.shutdown()
    server.wait_for_requests(2)
    assert server.scrape().value("otel_llm_receiver_accepted_spans_total") == 2


# --- content redaction -----------------------------------------------------------------------


def test_prompts_never_reach_the_store(make_server):
    server = make_server({"processors": KEEP_ALL})
    exporter = server.exporter("grpc")
    gateway = engine_tracer_provider("gateway", exporter)
    engine = engine_tracer_provider("vllm-v1", exporter, service_name="pii")
    tracer = gateway.get_tracer("litellm")
    secret = "my social security number is 078-05-1120"
    t = RequestTiming(time.time_ns(), 0.01, 0.1, 0.2, 1.0)
    from opentelemetry.propagate import inject
    from opentelemetry.trace import SpanKind

    with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER, start_time=t.arrival_unix_ns,
                                      attributes={"gen_ai.prompt.0.content": secret,
                                                  "gen_ai.input.messages": f'[{{"content": "{secret}"}}]',
                                                  "gen_ai.completion.0.content": "sure: " + secret,
                                                  "gen_ai.request.model": "pii-model"}) as span:
        span.add_event("gen_ai.content.prompt", {"gen_ai.prompt": secret})
        headers: dict[str, str] = {}
        inject(headers)
        emit_vllm_v1(engine, t, request_id="pii", traceparent_headers=headers)
        span.end(end_time=t.end_unix_ns + 1000)
    server.wait_for_requests(1)
    server.service.store.flush()
    rows = StoreReader(server.service.store.path).list_requests(model="pii-model")
    assert len(rows) == 1
    trace = StoreReader(server.service.store.path).get_trace(rows[0]["trace_id"])
    assert len(trace["spans"]) >= 2
    assert secret not in str(trace)
    gateway_span = next(s for s in trace["spans"] if s["name"].startswith("POST"))
    assert gateway_span["attributes"]["gen_ai.request.model"] == "pii-model"  # only content is removed
    db = store_bytes(server.service.store.path)
    assert b"pii-model" in db  # the raw bytes do hold the trace ...
    assert secret.encode() not in db  # ... and nothing of the prompt


# --- backpressure ----------------------------------------------------------------------------


def _retry_delay(error: grpc.RpcError) -> int | None:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return info.retry_delay.seconds
    return None


def test_flood_is_refused_retryably_and_accounted(make_server):
    server = make_server({"receivers": {"otlp": {"max_queued_spans": 1500}}})
    payload = vllm_batch(500, parent=True).SerializeToString()  # waits for a parent: stays buffered
    sent = accepted = refused = 0
    retry_hints = set()

    def send_grpc(_: int) -> tuple[int, int, int | None]:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                channel.unary_unary(EXPORT)(payload, timeout=30)
            return 500, 0, None
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE, error
            return 0, 500, _retry_delay(error)

    def send_http(_: int) -> tuple[int, int, int | None]:
        code, _, headers = http_post(server, payload)
        if code == 200:
            return 500, 0, None
        assert code in (429, 503), code
        return 0, 500, int(headers["Retry-After"])

    # A stalled pipeline (the worker blocks on the trace buffer) makes the intake fill deterministically.
    with server.service.pipeline.assembler._lock, concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(send_grpc, range(40))) + list(pool.map(send_http, range(40)))
    for ok, no, hint in results:
        sent += 500
        accepted += ok
        refused += no
        if hint is not None:
            retry_hints.add(hint)
    print(f"\nintake flood: sent {sent} spans, accepted {accepted}, refused {refused} (retry hints {sorted(retry_hints)})")
    assert accepted >= 1500 and refused >= sent - 2500, "the intake holds ~1500 spans while the pipeline is stalled"
    assert retry_hints and all(h >= 1 for h in retry_hints), "every refusal carries a retry delay"
    assert accepted + refused == sent
    scrape = server.wait_until(lambda s: s.value("otel_llm_spans_matched_total") == accepted)
    assert scrape.value("otel_llm_receiver_accepted_spans_total") == accepted
    assert scrape.value("otel_llm_receiver_refused_spans_total", reason="queue_full") == refused


def test_memory_limiter_refuses_and_recovers(make_server):
    server = make_server()
    limiter = server.service.pipeline.memory_limiter
    limiter._rss = lambda: limiter.soft_limit_bytes + 1  # the process is "over" its soft limit
    limiter.check()
    code, payload, headers = http_post(server, vllm_batch(10).SerializeToString())
    assert code == 503 and headers["Retry-After"] == "1"
    with pytest.raises(grpc.RpcError) as info:
        grpc_raw(server, vllm_batch(10).SerializeToString())
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and _retry_delay(info.value) == 1
    limiter._rss = lambda: limiter.soft_limit_bytes - 1
    limiter.check()
    assert http_post(server, vllm_batch(10).SerializeToString())[0] == 200
    scrape = server.wait_for_requests(10)
    assert scrape.value("otel_llm_receiver_refused_spans_total", reason="memory_limit") == 20


# --- hostile shapes and volumes --------------------------------------------------------------


@pytest.mark.parametrize("adapter_process", [False, True])
def test_huge_attributes_are_truncated_not_buffered(make_server, adapter_process):
    server = make_server({"processors": KEEP_ALL, "service": {"adapter_process": adapter_process}})
    request = vllm_batch(3, model="big", extra={"blob": "x" * 1_000_000})
    span = request.resource_spans[0].scope_spans[0].spans[0]
    for i in range(5000):
        kv = span.attributes.add()
        kv.key = f"attr.{i}"
        kv.value.int_value = i
    assert http_post(server, request.SerializeToString())[0] == 200
    scrape = server.wait_for_requests(3)
    assert scrape.value("otel_llm_spans_truncated_total") == 3
    assert scrape.value("vllm:e2e_request_latency_seconds_count", model_name="big") == 3  # still measured
    server.service.store.flush()
    reader = StoreReader(server.service.store.path)
    for row in reader.list_requests(model="big"):
        attributes = reader.get_trace(row["trace_id"])["spans"][0]["attributes"]
        assert len(attributes) <= 256 + 10  # the limit, plus the bridge attributes otel-llm adds
        assert all(len(str(v)) <= 16 * 1024 for v in attributes.values())


def test_hundred_thousand_model_names_hold_the_series_cap(make_server):
    server = make_server({"processors": {"llm_metrics": {"series_limit": 500}}})
    for batch in range(100):
        request = vllm_batch(1000, model_prefix=f"m{batch}-")
        response = grpc_raw(server, request.SerializeToString())
        assert response is not None
    scrape = server.wait_for_requests(100_000, timeout_s=120)
    series = scrape.label_sets("vllm:e2e_request_latency_seconds_count")
    assert len(series) == 501  # the cap plus one overflow series
    assert scrape.value("vllm:e2e_request_latency_seconds_count") == 100_000  # nothing lost
    assert scrape.value("vllm:e2e_request_latency_seconds_count", otel_llm_overflow="true") == 100_000 - 500
    assert scrape.value("otel_llm_series_overflow_total", metric="vllm:e2e_request_latency_seconds") == 99_500


def test_many_distinct_traces_stay_within_num_traces(make_server):
    server = make_server({"processors": {"tail_sampling": {"decision_wait": "60s", "num_traces": 5000}}})
    for _ in range(200):
        grpc_raw(server, vllm_batch(1000, parent=True).SerializeToString())
        assert len(server.service.pipeline.assembler) <= 5000
    scrape = server.wait_for_requests(195_000, timeout_s=120)
    assert scrape.value("otel_llm_traces_in_memory") <= 5000
    assert scrape.value("otel_llm_traces_completed_total", reason="memory_limit") >= 195_000


@pytest.mark.parametrize("start_ns", [1, 4_102_444_800 * 10**9], ids=["1970", "2100"])
def test_timestamps_far_off_are_measured(server, start_ns):
    assert http_post(server, vllm_batch(5, model="clock", start_ns=start_ns).SerializeToString())[0] == 200
    scrape = server.wait_for_requests(5)
    assert scrape.value("vllm:time_to_first_token_seconds_count", model_name="clock") == 5


def _memory_of(pid: int) -> dict[str, int]:
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    return fields


def test_flood_keeps_rss_under_the_memory_limit(tmp_path):
    """A separate `otel-llm serve` with a 220 MiB limit, flooded with traces it must hold: it refuses
    retryably instead of growing, and every span is either accepted or refused."""
    from tests.support.otelllm import ServerProcess

    limit_mib = 220
    process = ServerProcess(tmp_path, {"processors": {
        "tail_sampling": {"decision_wait": "120s", "num_traces": 1_000_000},
        "memory_limiter": {"limit_mib": limit_mib, "spike_limit_mib": 60, "check_interval": "200ms"}}})
    process.start()
    sent = accepted = refused = 0
    retry_after = set()
    try:
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            code, _, headers = http_post(type("S", (), {"http_port": process.http_port})(),
                                         vllm_batch(1000, parent=True).SerializeToString())
            sent += 1000
            if code == 200:
                accepted += 1000
            else:
                assert code == 503, code
                refused += 1000
                retry_after.add(headers["Retry-After"])
        memory = _memory_of(process.process.pid)
        scrape = process.scrape()
    finally:
        process.ensure_stopped()
    print(f"\nmemory flood: sent {sent} spans, accepted {accepted}, refused {refused}, "
          f"peak RSS {memory['VmHWM'] >> 20} MiB (limit {limit_mib} MiB)")
    assert refused > 0, "the flood must reach the soft limit"
    assert retry_after == {"1"}
    assert accepted + refused == sent
    assert scrape.value("otel_llm_receiver_accepted_spans_total") == accepted
    assert scrape.value("otel_llm_receiver_refused_spans_total", reason="memory_limit") == refused
    assert memory["VmHWM"] < limit_mib * 1024 * 1024, f"peak RSS {memory['VmHWM'] >> 20} MiB over {limit_mib} MiB"


def test_prompts_never_reach_the_export(make_server):
    # The backend allows content, so prompts would be visible there if otel-llm exported any.
    backend = make_server({"processors": {**KEEP_ALL, "redaction": {"allow_content": True}}})
    server = make_server({"processors": KEEP_ALL,
                          "exporters": {"otlp": {"endpoint": f"127.0.0.1:{backend.grpc_port}"}}})
    secret = "patient record 4411: diagnosis"
    request = vllm_batch(1, model="phi", extra={"gen_ai.prompt.0.content": secret, "gen_ai.output.messages": secret,
                                                "input.value": secret})
    assert http_post(server, request.SerializeToString())[0] == 200
    backend.wait_until(lambda s: s.value("otel_llm_traces_completed_total") >= 1, timeout_s=30)
    backend.service.store.flush()
    rows = StoreReader(backend.service.store.path).list_requests(model="phi")
    assert len(rows) == 1  # the trace did arrive
    db = store_bytes(backend.service.store.path)
    assert b"phi" in db
    assert secret.encode() not in db
    assert server.scrape().value("otel_llm_exporter_sent_spans_total") > 0
