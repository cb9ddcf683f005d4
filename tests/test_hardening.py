"""Production hardening: auth, TLS, content redaction, backpressure, hostile volumes and shapes."""

from __future__ import annotations

import concurrent.futures
import gzip
import http.client
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm.processor.memory_limiter.limiter import rss_bytes
from otel_llm_simulate.emitters import RequestTiming, emit_vllm_v1, engine_tracer_provider
from otel_llm.exporter.store.sqlite import StoreReader
from tests.support.otelllm import RunningServer, Scrape
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


# A length prefix running past the end of the message: protobuf's parser raises DecodeError on it.
MALFORMED = b"\x0a\xff\xff\xff\xff\x0f"
PROTOBUF = "application/x-protobuf"
REFUSED = "otel_llm_receiver_refused_requests_total"


def refusals_by_reason(scrape: Scrape, protocol: str) -> dict[str, float]:
    """The receiver's non-zero refusal counts for ``protocol``, by reason."""
    counts = {labels["reason"]: scrape.value(REFUSED, **labels)
              for labels in scrape.label_sets(REFUSED) if labels["protocol"] == protocol}
    return {reason: count for reason, count in counts.items() if count}


def grpc_export_raw(server: RunningServer, payload: bytes, token: str | None) -> bytes:
    """``payload`` as the raw bytes of an Export call, with ``token`` as bearer token if given."""
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        return channel.unary_unary(EXPORT)(payload, timeout=10, metadata=metadata)


def http_post_raw(server: RunningServer, body: bytes | None, headers: dict[str, str]) -> tuple[int, bytes]:
    """POST /v1/traces with exactly ``headers``; with ``body=None`` only the headers are sent, so a
    declared Content-Length is never followed by its bytes: an answer proves the body was not read."""
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        if body is None:
            connection.putrequest("POST", "/v1/traces", skip_accept_encoding=True)
            for key, value in headers.items():
                connection.putheader(key, value)
            connection.endheaders()
        else:
            connection.request("POST", "/v1/traces", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_auth_is_checked_before_the_body_is_parsed(make_server):
    """A request with a wrong or missing token is refused UNAUTHENTICATED / 401 and counted only as
    ``unauthenticated`` whatever its body: malformed protobuf, a gzip bomb, a body over the size
    limit. Had the body been looked at first, the answers would be INVALID_ARGUMENT / 400 / 413
    and the counts ``malformed`` / ``too_large`` (which the same bodies get with the right token)."""
    max_body = 1024 * 1024
    auth = {"auth": {"bearer_token": TOKEN}}
    server = make_server({"receivers": {"otlp": {"protocols": {
        "grpc": auth, "http": {**auth, "max_request_body_size": max_body}}}}})
    bomb = gzip.compress(bytes(4 * max_body))  # a few KB that inflate to 4x the limit

    for token in ("wrong", None):
        with pytest.raises(grpc.RpcError) as info:
            grpc_export_raw(server, MALFORMED, token)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value

    def http_headers(token: str | None, **extra: str) -> dict[str, str]:
        headers = {"Content-Type": PROTOBUF, **extra}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    hostile: list[tuple[bytes | None, dict[str, str]]] = [
        (MALFORMED, {}),
        (bomb, {"Content-Encoding": "gzip"}),
        (None, {"Content-Length": str(100 * max_body)}),  # declared, never sent
    ]
    for token in ("wrong", None):
        for body, extra in hostile:
            status, reply = http_post_raw(server, body, http_headers(token, **extra))
            assert status == 401, (token, extra, status, reply)
            assert status_pb2.Status.FromString(reply).code == code_pb2.UNAUTHENTICATED

    # Counted before the answer, so no polling: every refusal so far is "unauthenticated", none
    # a reason that only reading the body could give, and nothing was ingested.
    scrape = server.scrape()
    assert refusals_by_reason(scrape, "grpc") == {"unauthenticated": 2}
    assert refusals_by_reason(scrape, "http") == {"unauthenticated": 6}
    assert scrape.value("otel_llm_receiver_accepted_spans_total") == 0

    # With the right token the same bodies are refused for what they are: the 401s above were not
    # bodies the receivers would have taken anyway.
    with pytest.raises(grpc.RpcError) as info:
        grpc_export_raw(server, MALFORMED, TOKEN)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    assert [http_post_raw(server, body, http_headers(TOKEN, **extra))[0] for body, extra in hostile] == [400, 413, 413]
    scrape = server.scrape()
    assert refusals_by_reason(scrape, "grpc") == {"unauthenticated": 2, "malformed": 1}
    assert refusals_by_reason(scrape, "http") == {"unauthenticated": 6, "malformed": 1, "too_large": 2}


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

    # mTLS: a client certificate signed by the CA, and one signed by a CA the server does not trust.
    client_ext = directory / "client-ext.cnf"
    client_ext.write_text("extendedKeyUsage=clientAuth\n")
    stranger_ca_key, stranger_ca = directory / "stranger-ca.key", directory / "stranger-ca.crt"
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(stranger_ca_key), "-out", str(stranger_ca),
        "-days", "2", "-subj", "/CN=some other CA")
    paths = {"ca": ca_cert, "cert": cert, "key": key}
    for name, signer_cert, signer_key in (("client", ca_cert, ca_key), ("stranger", stranger_ca, stranger_ca_key)):
        client_key, client_csr, client_cert = (directory / f"{name}.{suffix}" for suffix in ("key", "csr", "crt"))
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(client_key), "-out", str(client_csr),
            "-subj", f"/CN={name}")
        run("x509", "-req", "-in", str(client_csr), "-CA", str(signer_cert), "-CAkey", str(signer_key),
            "-CAcreateserial", "-out", str(client_cert), "-days", "2", "-extfile", str(client_ext))
        paths[f"{name}_cert"], paths[f"{name}_key"] = client_cert, client_key
    return paths


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


def test_stalled_tls_handshake_does_not_hold_up_other_clients(make_server, certificates, monkeypatch):
    """Connections to the TLS OTLP/HTTP port that never send a ClientHello do not delay anyone
    else: another client's export is answered within seconds while they are still open and
    unanswered. Were the handshake done in the accept loop, that loop would wait on the first
    stalled connection (until the client gives up, or the 60 s idle timeout) and accept no one."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    tls = {"tls": {"cert_file": str(certificates["cert"]), "key_file": str(certificates["key"])}}
    server = make_server({"receivers": {"otlp": {"protocols": {"http": tls}}}})
    # Connected first, so first in the listen backlog: the accept loop reaches them before the exporter.
    stalled = [socket.create_connection(("127.0.0.1", server.http_port), timeout=5) for _ in range(3)]
    exporter = HttpSpanExporter(endpoint=f"https://localhost:{server.http_port}/v1/traces",
                                certificate_file=str(certificates["ca"]), timeout=5)
    try:
        started = time.monotonic()
        result = exporter.export(captured_spans())
        elapsed = time.monotonic() - started
        assert result == SpanExportResult.SUCCESS, f"export failed after {elapsed:.1f}s"
        assert elapsed < 5
        for connection in stalled:  # still waiting for their handshake: not answered, not closed
            connection.setblocking(False)
            with pytest.raises(BlockingIOError):
                connection.recv(1)
    finally:
        exporter.shutdown()
        for connection in stalled:
            connection.close()
    assert server.scrape().value("otel_llm_receiver_accepted_spans_total") == 1


def test_client_ca_file_requires_a_client_certificate_it_signed(make_server, certificates, monkeypatch):
    """With ``tls.client_ca_file`` both receivers refuse a client without a certificate and one
    whose certificate another CA signed (the TLS handshake fails, nothing is ingested), and take
    exports from a client whose certificate the configured CA signed."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    tls = {"tls": {"cert_file": str(certificates["cert"]), "key_file": str(certificates["key"]),
                   "client_ca_file": str(certificates["ca"])}}
    server = make_server({"receivers": {"otlp": {"protocols": {"grpc": tls, "http": tls}}}})
    ca = certificates["ca"].read_bytes()
    payload = vllm_batch(1).SerializeToString()

    # Refused: no client certificate, or one from an untrusted CA.
    for identity in (None, "stranger"):
        keys = {} if identity is None else {"private_key": certificates[f"{identity}_key"].read_bytes(),
                                            "certificate_chain": certificates[f"{identity}_cert"].read_bytes()}
        credentials = grpc.ssl_channel_credentials(root_certificates=ca, **keys)
        with grpc.secure_channel(f"localhost:{server.grpc_port}", credentials) as channel:
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(EXPORT)(payload, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, (identity, info.value)

        context = ssl.create_default_context(cafile=str(certificates["ca"]))
        if identity is not None:
            context.load_cert_chain(certificates[f"{identity}_cert"], certificates[f"{identity}_key"])
        connection = http.client.HTTPSConnection("localhost", server.http_port, context=context, timeout=10)
        try:
            # TLS 1.3 finishes the client's side of the handshake before the server checks its
            # certificate: the refusal (an alert, or the connection closed) shows on write or read.
            with pytest.raises((ssl.SSLError, ConnectionError)):
                connection.request("POST", "/v1/traces", body=payload, headers={"Content-Type": PROTOBUF})
                connection.getresponse().read()
        finally:
            connection.close()

    # Accepted: the SDK exporters with the certificate the configured CA signed.
    grpc_client = GrpcSpanExporter(
        endpoint=f"localhost:{server.grpc_port}", insecure=False, timeout=10,
        credentials=grpc.ssl_channel_credentials(root_certificates=ca,
                                                 private_key=certificates["client_key"].read_bytes(),
                                                 certificate_chain=certificates["client_cert"].read_bytes()))
    http_client = HttpSpanExporter(endpoint=f"https://localhost:{server.http_port}/v1/traces",
                                   certificate_file=str(certificates["ca"]),
                                   client_certificate_file=str(certificates["client_cert"]),
                                   client_key_file=str(certificates["client_key"]), timeout=10)
    try:
        assert grpc_client.export(captured_spans()) == SpanExportResult.SUCCESS
        assert http_client.export(captured_spans()) == SpanExportResult.SUCCESS
    finally:
        grpc_client.shutdown()
        http_client.shutdown()
    # Counted before each answer: only the two certified exports were taken.
    scrape = server.scrape()
    assert scrape.value("otel_llm_receiver_accepted_spans_total", protocol="grpc") == 1
    assert scrape.value("otel_llm_receiver_accepted_spans_total", protocol="http") == 1


# --- content redaction -----------------------------------------------------------------------


def test_prompts_never_reach_the_store(make_server):
    server = make_server({"processors": KEEP_ALL})
    exporter = server.exporter("grpc")
    gateway = engine_tracer_provider("gateway", exporter)
    engine = engine_tracer_provider("vllm-v1", exporter, service_name="pii-model")  # its served model name
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


def test_memory_pressure_completes_the_oldest_traces_early(make_server):
    """Above the soft limit the memory limiter's check completes the oldest buffered traces early:
    of two waves of traces waiting for roots that never come, the first is decided (reason
    ``memory_pressure``, kept traces in the store) and the second is still buffered.

    The process really goes over its limit: the soft limit is set 64 MiB above this process's RSS
    (the pipeline runs in it), then a ballast of real pages pushes RSS past it. The periodic check
    is 10 min (the longest allowed) apart so that it never runs here; the test calls ``check()``, what each period runs,
    once, because each call completes half of what is pending and a second one would take half
    of the newer wave too."""
    mib = 1024 * 1024
    server = make_server({"processors": {
        "tail_sampling": {**KEEP_ALL["tail_sampling"], "decision_wait": "60s"},  # no trace completes by time
        "memory_limiter": {"limit_mib": rss_bytes() // mib + 96, "spike_limit_mib": 32, "check_interval": "10m"}}})
    limiter = server.service.pipeline.memory_limiter
    wave = 20
    for number in (1, 2):
        # Engine spans whose parent never arrives: each trace waits in the buffer for its root.
        assert http_post(server, vllm_batch(wave, model=f"wave-{number}", parent=True).SerializeToString())[0] == 200
        # One wave buffered before the next is sent, so the first is the older in the buffer.
        server.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == number * wave,
                          what=f"wave {number} buffered")
    assert not limiter.refusing and rss_bytes() < limiter.soft_limit_bytes  # the waves alone stay under
    limiter.check()  # under the limit a check decides nothing: what follows is the pressure's doing
    assert server.scrape().value("otel_llm_traces_completed_total") == 0

    ballast = b"\x01" * (limiter.soft_limit_bytes - rss_bytes() + 32 * mib)  # written, so resident
    assert rss_bytes() > limiter.soft_limit_bytes
    limiter.check()
    del ballast

    scrape = server.scrape()
    assert scrape.value("otel_llm_traces_completed_total", reason="memory_pressure") == wave
    assert scrape.value("otel_llm_traces_completed_total") == wave  # nothing else decided anything
    assert scrape.value("otel_llm_traces_in_memory") == wave
    assert limiter.refusing  # and new data is refused meanwhile
    server.service.store.flush()
    reader = StoreReader(server.service.store.path)
    assert len(reader.list_requests(model="wave-1")) == wave  # the oldest: decided and kept
    assert reader.list_requests(model="wave-2") == []  # the newest: still waiting for their roots


# --- hostile shapes and volumes --------------------------------------------------------------


def test_huge_attributes_are_truncated_not_buffered(make_server):
    server = make_server({"processors": KEEP_ALL})
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
    # The byte budget well above 500 label sets of every family: this test is about the count cap.
    server = make_server({"processors": {"llm_metrics": {"series_limit": 500, "series_limit_mib": 256}}})
    for batch in range(100):
        request = vllm_batch(1000, model_prefix=f"m{batch}-")
        response = grpc_raw(server, request.SerializeToString())
        assert response is not None
    scrape = server.wait_for_requests(100_000, timeout_s=120)
    series = scrape.label_sets("vllm:e2e_request_latency_seconds_count")
    assert len(series) == 501  # the cap plus one overflow series
    assert scrape.value("vllm:e2e_request_latency_seconds_count") == 100_000  # nothing lost
    assert scrape.value("vllm:e2e_request_latency_seconds_count", otel_metric_overflow="true") == 100_000 - 500
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
