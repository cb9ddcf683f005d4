"""`otel-llm validate --explain` against a real `otel-llm serve` fed bad spans: the likeliest reasons
numbers are missing, largest loss first, each linked to its section of docs/troubleshooting.md."""

from __future__ import annotations

import http.server
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.support.otelllm import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
TROUBLESHOOTING = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path, {"processors": {"tail_sampling": {"decision_wait": "1s", "grace": "100ms"}}})
    try:
        process.start(timeout_s=60)
        yield process
    finally:
        process.ensure_stopped()


def vllm_span(trace_id: bytes, ttft: float = 0.5) -> ExportTraceServiceRequest:
    """A vLLM V1 request span as vLLM sends it (gen_ai.latency.* on a SERVER span; no model, no resource)."""
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id = trace_id, os.urandom(8)
    span.name, span.kind = "llm_request", 2  # SERVER
    span.start_time_unix_nano = time.time_ns() - 3 * 10**9
    span.end_time_unix_nano = span.start_time_unix_nano + 2_600_000_000
    for key, value in (("time_to_first_token", ttft), ("time_in_queue", 0.1), ("time_in_model_prefill", 0.3),
                       ("time_in_model_decode", 2.0), ("time_in_model_inference", 2.3), ("e2e", 2.6)):
        kv = span.attributes.add()
        kv.key, kv.value.double_value = "gen_ai.latency." + key, value
    return request


def plain_span(trace_id: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = trace_id, os.urandom(8), "a late child"
    span.start_time_unix_nano = time.time_ns() - 10**9
    span.end_time_unix_nano = span.start_time_unix_nano + 10**6
    return request


def post(server: ServerProcess, body: bytes) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/traces", data=body,
                                     headers={"Content-Type": "application/x-protobuf"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def explain(server: ServerProcess) -> tuple[list[str], str]:
    """The anchors `validate --explain` links to, in its order, and its whole output."""
    result = subprocess.run([sys.executable, "-m", "otel_llm", "validate", "--explain", "--url", server.metrics_url],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    anchors = re.findall(r"^   see docs/troubleshooting\.md#(\S+)$", result.stdout, re.M)
    for anchor in anchors:  # each link lands on its section or its reason's row
        assert f'id="{anchor}"' in TROUBLESHOOTING or f"{{ #{anchor} }}" in TROUBLESHOOTING, anchor
    return anchors, result.stdout


def test_explain_ranks_the_reasons_a_running_instance_counted(server: ServerProcess) -> None:
    anchors, out = explain(server)
    assert anchors == ["no-spans"], out

    for _ in range(6):  # NaN TTFT: refused as malformed, never observed
        assert post(server, vllm_span(os.urandom(16), ttft=math.nan).SerializeToString()) == 200
    for _ in range(3):  # good requests whose spans name no model, as vLLM 0.32 sends them without OTEL_SERVICE_NAME
        assert post(server, vllm_span(os.urandom(16)).SerializeToString()) == 200
    decided = os.urandom(16)
    assert post(server, vllm_span(decided).SerializeToString()) == 200
    server.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") == 4
                      and s.value("otel_llm_traces_in_memory") == 0, what="4 requests assembled, every trace decided")
    for _ in range(2):  # after the trace's decision: late
        assert post(server, plain_span(decided).SerializeToString()) == 200
    scrape = server.wait_until(lambda s: s.value("otel_llm_late_spans_total") == 2, what="2 late spans")
    assert scrape.value("otel_llm_spans_malformed_total", reason="nan_latency") == 6

    anchors, out = explain(server)
    assert anchors == ["spans-malformed-nan-latency", "empty-model-label", "late-spans"], out
    assert "1. 6 spans: otel_llm_spans_malformed_total{reason=\"nan_latency\"}" in out
    assert "2. 4 requests with an empty model label" in out
    assert "3. 2 spans arrived after their trace was decided" in out

    for _ in range(5):  # not OTLP at all: refused at the door, and now the second largest loss
        assert post(server, b"\xff\xff\xff not protobuf") == 400
    server.wait_until(lambda s: s.value("otel_llm_receiver_refused_requests_total", reason="malformed") == 5,
                      what="5 malformed requests refused")
    anchors, out = explain(server)
    assert anchors == ["spans-malformed-nan-latency", "receiver-refused-requests-malformed", "empty-model-label"], out

    # Every span-derived family this running instance exposes is in the generated metrics reference.
    reference = (ROOT / "docs" / "reference" / "metrics.md").read_text(encoding="utf-8")
    exposed = {re.sub(r"_(bucket|sum|count|created)$", "", name)
               for name in re.findall(r"^([a-zA-Z_:][\w:]*)(?:\{| )", server.scrape().text, re.M)
               if name.startswith(("vllm:", "gen_ai_", "otel_llm_request_segment"))}
    assert "vllm:time_to_first_token_seconds" in exposed and "vllm:request_success_total" in exposed
    missing = sorted(name for name in exposed if f"`{name}`" not in reference)
    assert not missing, f"exposed but not in docs/reference/metrics.md: {missing}"


def test_explain_says_when_it_cannot_reach_the_instance() -> None:
    result = subprocess.run([sys.executable, "-m", "otel_llm", "validate", "--explain", "--url", "http://127.0.0.1:9"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "cannot read http://127.0.0.1:9/metrics" in result.stderr


@pytest.mark.parametrize("args,message", [
    (["--explain", "otel-llm.yaml"], "not a config file"),
    (["--explain", "--top", "0"], "--top must be at least 1"),
    (["--top", "5", "otel-llm.yaml"], "--url, --top and --timeout go with --explain"),
    (["--url", "http://127.0.0.1:9", "otel-llm.yaml"], "--url, --top and --timeout go with --explain"),
    (["--timeout", "5", "otel-llm.yaml"], "--url, --top and --timeout go with --explain"),
    (["--explain", "--timeout", "0"], "--timeout must be between 0 and 3600 seconds"),
])
def test_explain_refuses_options_it_would_ignore(args: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "otel_llm", "validate", *args], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr


# --- a hostile or broken /metrics: bounded bytes and a total deadline (issue 50, item 6) ---------------

class _Answers(http.server.BaseHTTPRequestHandler):
    """``/metrics`` answered as the test's server says: ``huge`` streams 512 MiB with no
    Content-Length (the issue's case), ``declared`` announces 512 MiB, ``trickle`` sends a byte every
    0.5 s for ever, ``small`` a normal exposition."""

    protocol_version = "HTTP/1.0"  # the body ends when the connection does

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        kind = self.server.kind  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        if kind == "declared":
            self.send_header("Content-Length", str(512 << 20))
        self.end_headers()
        try:
            if kind == "small":
                self.wfile.write(b"# TYPE otel_llm_late_spans_total counter\notel_llm_late_spans_total 0\n")
            elif kind in ("huge", "declared"):
                block = b"# " + b"x" * ((1 << 20) - 3) + b"\n"
                for _ in range(512):
                    self.wfile.write(block)
            else:
                while not self.server.stopping.is_set():  # type: ignore[attr-defined]
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    self.server.stopping.wait(0.5)  # type: ignore[attr-defined]
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: what the test wants

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[Callable[[str], str]]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(kind: str) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
        server.daemon_threads = True
        server.kind, server.stopping = kind, threading.Event()  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.stopping.set()  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()


def _explain_process(url: str, *options: str) -> tuple[int, str, int]:
    """Exit code, stderr and peak RSS (KiB, the child's own, from wait4) of `validate --explain`."""
    process = subprocess.Popen([sys.executable, "-m", "otel_llm", "validate", "--explain", "--url", url, *options],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    stderr = process.stderr.read().decode()  # EOF once the process exits
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, stderr, usage.ru_maxrss


@pytest.mark.parametrize("kind", ["huge", "declared"])
def test_explain_reads_at_most_64_mib(metrics_server: Callable[[str], str], kind: str) -> None:
    """A 512 MiB answer (read whole, it held 2.6 GB): refused past 64 MiB, or at once when its
    Content-Length says so, saying so; the process's peak RSS stays within the bytes read of the
    same process reading a small answer."""
    code, stderr, _ = _explain_process(metrics_server("small"))
    assert code == 0, stderr
    _, _, baseline_kib = _explain_process(metrics_server("small"))
    code, stderr, peak_kib = _explain_process(metrics_server(kind))
    assert code == 1
    assert "cannot read" in stderr and "64 MiB read at most" in stderr, stderr
    assert peak_kib < baseline_kib + 2 * 64 * 1024, (peak_kib, baseline_kib)


def test_explain_gives_up_at_its_total_deadline(metrics_server: Callable[[str], str]) -> None:
    """A byte every 0.5 s for ever (each read within any per-read timeout: the issue's run was still
    reading after 90 s): ``--timeout 2`` ends it, saying which bound it was."""
    result = subprocess.run([sys.executable, "-m", "otel_llm", "validate", "--explain", "--url",
                             metrics_server("trickle"), "--timeout", "2"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "no complete answer within 2s (--timeout)" in result.stderr, result.stderr


# A sender as an OpenTelemetry SDK app builds one from an endpoint (vLLM releases that do not pass
# insecure=True too): the OTLP gRPC exporter of the project's own environment, its env read as users set it.
SENDER = r'''
import sys
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
provider.get_tracer("scheme-pitfall").start_span("one span").end()
print(OTLPSpanExporter(endpoint=sys.argv[1]).export(memory.get_finished_spans()).name)
'''


def send_one_span(endpoint: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run([sys.executable, "-c", SENDER, endpoint], capture_output=True, text=True, timeout=60,
                          env={**clean, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "3", **env})


def test_a_grpc_scheme_without_insecure_never_arrives_and_explain_names_it(server: ServerProcess) -> None:
    """``grpc://host:4317`` (what vLLM's page showed) to an SDK's OTLP gRPC exporter: TLS against the plaintext
    receiver, the failure in the sender's log only, nothing counted; with OTEL_EXPORTER_OTLP_TRACES_INSECURE=true
    (vLLM's own OpenTelemetry example, our vLLM lines) the same endpoint delivers."""
    endpoint = f"grpc://127.0.0.1:{server.grpc_port}"
    tls = send_one_span(endpoint)
    assert tls.stdout.strip() == "FAILURE", tls.stdout + tls.stderr
    assert "StatusCode.UNAVAILABLE" in tls.stderr and "Tls handshake failed" in tls.stderr, tls.stderr[-3000:]
    assert server.scrape().value("otel_llm_receiver_accepted_spans_total") == 0
    anchors, out = explain(server)
    assert anchors == ["no-spans"], out
    assert "OTEL_EXPORTER_OTLP_TRACES_INSECURE=true" in out and "grpc://" in out
    section = TROUBLESHOOTING.split("{ #no-spans }", 1)[1].split("\n## ", 1)[0]
    assert "OTEL_EXPORTER_OTLP_TRACES_INSECURE=true" in section and "grpc://" in section

    plaintext = send_one_span(endpoint, OTEL_EXPORTER_OTLP_TRACES_INSECURE="true")
    assert plaintext.stdout.strip() == "SUCCESS", plaintext.stdout + plaintext.stderr
    server.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") == 1, what="the span accepted")
