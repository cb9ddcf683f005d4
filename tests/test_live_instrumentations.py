"""The instrumentation matrix, live: each instrumentation installed at its pinned version in its own
cached virtualenv (``tests/live/instrumentations.sh``), run as its users run it with the real
``openai`` client against the local OpenAI-compatible upstream of ``tests/testdata/emitters/capture.py``
(whose prompts, system prompts and completions carry unique markers), its HTTP span's traceparent
reaching a vLLM V1 engine span emitted behind the upstream. otel-llm runs with its store, its intake
log and an OTLP/HTTP exporter with an on-disk queue to a peer that keeps every body.

Per instrumentation: every call counted once on the client side with what the client saw (tokens,
the error's class), each engine request once on the server side, and not one marker byte on any
disk otel-llm wrote or in what its exporter sent. Logfire 5.4: ``instrument_openai(version=1)``
and the default ``version=2``; openai-agents 0.24 with Logfire's ``instrument_openai_agents()`` and
with OpenInference's openai-agents instrumentation 2.6.0."""

from __future__ import annotations

import http.server
import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

from otel_llm_simulate.emitters import RequestTiming, emit_vllm_v1, engine_tracer_provider
from tests.support.captures import CAPTURES

# A cold run installs the instrumentations first (tests/live/instrumentations.sh, ~5 min for every
# group on a loaded machine; `make test` builds them before pytest, so a warm run waits 0 s).
pytestmark = pytest.mark.timeout(900)

LIVE = Path(__file__).parent / "live"
CALLS = ["chat", "stream", "err500", "err400"]
KEEP_ALL = {"decision_wait": "2s", "grace": "100ms",
            "policies": [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}


def _capture() -> ModuleType:
    spec = importlib.util.spec_from_file_location("emitter_capture_live", CAPTURES / "capture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _python(group: str) -> str:
    script = str(LIVE / "instrumentations.sh")
    built = subprocess.run([script, "build", group], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    return subprocess.run([script, "path", group], capture_output=True, text=True, check=True).stdout.strip()


class _Sink(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802
        self.bodies.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("version", [1, 2])
def test_logfire_live(make_server, tmp_path, version):
    python = _python("logfire")
    capture = _capture()
    upstream, upstream_port = capture.serve(capture.UpstreamHandler)
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    _Sink.bodies = []
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    try:
        server = make_server({
            "receivers": {"otlp": {"intake_log": {}}},
            "processors": {"tail_sampling": KEEP_ALL},
            "exporters": {"otlphttp": {"endpoint": f"http://127.0.0.1:{sink.server_address[1]}", "compression": "none",
                                       "sending_queue": {"storage": str(tmp_path / "queue")}}},
        })
        capture.STATE.scenario = f"logfire_v{version}"
        result_file = tmp_path / "results.json"
        env = {"PATH": "/usr/bin:/bin", "OTLP": f"http://127.0.0.1:{server.http_port}",
               "UPSTREAM": f"http://127.0.0.1:{upstream_port}", "LF_VERSION": str(version), "RESULTS": str(result_file),
               "PROMPT_MARKER": capture.PROMPT_MARKER, "SYSTEM_MARKER": capture.SYSTEM_MARKER,
               "OTEL_RESOURCE_ATTRIBUTES": "", "LOGFIRE_SEND_TO_LOGFIRE": "false"}
        child = subprocess.run([python, str(LIVE / "logfire_child.py"), *CALLS], env=env, capture_output=True,
                               text=True, timeout=120)
        assert child.returncode == 0, child.stderr[-3000:]
        outcome = json.loads(result_file.read_text())
        results = outcome["results"]
        assert outcome["versions"] == {"logfire": "5.4.0", "openai": "3.57.0"}
        assert [r["ok"] for r in results] == [True, True, False, False]
        assert [r["error"] for r in results[2:]] == ["InternalServerError", "BadRequestError"]
        # Behind the upstream: vLLM's span for each call that reached it with a traceparent.
        with capture.STATE.lock:
            reached = [u for u in capture.STATE.upstream if u["scenario"] == capture.STATE.scenario]
        assert len(reached) == len(CALLS) and all(u["traceparent"] for u in reached)
        answered = [u for u in reached if u["status"] == 200]
        provider = engine_tracer_provider("vllm-v1", server.exporter("http"), service_name="vllm-behind-logfire")
        for u in answered:
            emit_vllm_v1(provider, RequestTiming(time.time_ns() - 50_000_000, 0.001, 0.001, 0.002, 0.004, completion_tokens=capture.COMPLETION_TOKENS),
                         request_id=f"lf-{u['seq']}", traceparent_headers={"traceparent": u["traceparent"]})
        provider.shutdown()

        calls, failed = len(results), sum(1 for r in results if not r["ok"])
        scrape = server.wait_until(
            lambda s: s.value("gen_ai_client_operation_duration_seconds_count") >= calls
            and s.value("vllm:request_success_total") >= len(answered)
            and s.value("otel_llm_traces_in_memory") == 0, timeout_s=60, what="every live call decided")
        # Client side: each call once, the errors named by class (Logfire's exception event), not _OTHER.
        assert scrape.value("gen_ai_client_operation_duration_seconds_count") == calls
        assert scrape.value("gen_ai_client_operation_duration_seconds_count", error_type="InternalServerError") == 1
        assert scrape.value("gen_ai_client_operation_duration_seconds_count", error_type="BadRequestError") == 1
        assert scrape.value("gen_ai_client_operation_duration_seconds_count", error_type="_OTHER") == 0
        # Tokens as the client saw them: the non-streamed call's; Logfire's CLIENT span of a stream
        # ends when create() returns and carries none (README: Logfire's row).
        assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == results[0]["tokens"]
        # Server side: each engine request once, joined to its client span (an overhead measured, or,
        # where Logfire's span ended before the engine's request did, counted as not measurable).
        assert scrape.value("vllm:request_success_total") == len(answered) == calls - failed
        joined = scrape.value("otel_llm_client_overhead_seconds_count") + \
            scrape.value("otel_llm_values_rejected_total", reason="negative_client_overhead")
        assert joined == len(answered)
        server.wait_until(lambda s: s.value("otel_llm_exporter_sent_spans_total") > 0, timeout_s=30,
                          what="the exporter sent")
        server.service.store.flush()
    finally:
        upstream.shutdown()
        sink.shutdown()
    markers = [m.encode() for m in capture.MARKERS.values()]
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "results.json"]
    assert any(p.name.endswith(".wal") for p in files)
    hits = {str(p): [m for m in markers if m in p.read_bytes()] for p in files}
    hits.update({f"peer body {i}": [m for m in markers if m in b] for i, b in enumerate(_Sink.bodies)})
    assert _Sink.bodies and not {k: v for k, v in hits.items() if v}
    print(f"logfire v{version}: calls {calls}, client records "
          f"{scrape.value('gen_ai_client_operation_duration_seconds_count'):g}, server records "
          f"{scrape.value('vllm:request_success_total'):g}, marker bytes found 0 in {len(files)} files and "
          f"{len(_Sink.bodies)} exported bodies")


def _marker_hits(tmp_path: Path, markers: list[bytes]) -> dict[str, list[bytes]]:
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "results.json"]
    assert any(p.name.endswith(".wal") for p in files)  # the intake log was written
    hits = {str(p): [m for m in markers if m in p.read_bytes()] for p in files}
    hits.update({f"peer body {i}": [m for m in markers if m in b] for i, b in enumerate(_Sink.bodies)})
    assert _Sink.bodies
    return {k: v for k, v in hits.items() if v}


@pytest.mark.parametrize("group", ["logfire", "openinference"])
def test_openai_agents_live(make_server, tmp_path, group):
    """An openai-agents run: its system prompt (``instructions``) goes into Logfire's ``events``
    and ``request_data`` and OpenInference's ``llm.invocation_parameters``, none of which any block
    list names. Logfire's agents LLM span (INTERNAL ``Chat completion with …``) is the client call,
    counted once with its tokens (with ``instrument_openai`` too, the CLIENT span inside it is a
    nested client span, part of the same call); OpenInference's carry no ``gen_ai.*`` and are not
    counted."""
    python = _python(group)
    capture = _capture()
    upstream, upstream_port = capture.serve(capture.UpstreamHandler)
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    _Sink.bodies = []
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    calls = ["agent1", "agent2"]
    try:
        server = make_server({
            "receivers": {"otlp": {"intake_log": {}}},
            "processors": {"tail_sampling": KEEP_ALL},
            "exporters": {"otlphttp": {"endpoint": f"http://127.0.0.1:{sink.server_address[1]}", "compression": "none",
                                       "sending_queue": {"storage": str(tmp_path / "queue")}}},
        })
        capture.STATE.scenario = f"agents_{group}"
        result_file = tmp_path / "results.json"
        env = {"PATH": "/usr/bin:/bin", "OTLP": f"http://127.0.0.1:{server.http_port}", "GROUP": group,
               "UPSTREAM": f"http://127.0.0.1:{upstream_port}", "RESULTS": str(result_file),
               "PROMPT_MARKER": capture.PROMPT_MARKER, "SYSTEM_MARKER": capture.SYSTEM_MARKER,
               "OPENAI_AGENTS_DISABLE_TRACING": "0", "LOGFIRE_SEND_TO_LOGFIRE": "false"}
        child = subprocess.run([python, str(LIVE / "agents_child.py"), *calls], env=env, capture_output=True,
                               text=True, timeout=180)
        assert child.returncode == 0, child.stderr[-3000:]
        results = json.loads(result_file.read_text())["results"]
        assert [r["ok"] for r in results] == [True, True], results
        with capture.STATE.lock:
            reached = [u for u in capture.STATE.upstream if u["scenario"] == capture.STATE.scenario]
        assert len(reached) == len(calls)  # one LLM call per run
        scrape = server.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") > 0
                                   and s.value("otel_llm_traces_in_memory") == 0
                                   and s.value("otel_llm_exporter_sent_spans_total") > 0, timeout_s=60,
                                   what="every run decided and exported")
        expected = len(calls) if group == "logfire" else 0
        server.wait_until(lambda s: s.value("gen_ai_client_operation_duration_seconds_count") >= expected,
                          timeout_s=30, what="the agents' LLM calls counted")
        scrape = server.scrape()
        assert scrape.value("gen_ai_client_operation_duration_seconds_count") == expected
        # The content went over the wire to otel-llm (and was removed before the intake log): text under
        # keys no list names, at least the system prompt and the prompt of each run.
        assert scrape.value("otel_llm_intake_log_attributes_redacted_total", reason="not_allowed") >= 2 * len(calls)
        if group == "logfire":
            assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == \
                len(calls) * capture.COMPLETION_TOKENS
        server.service.store.flush()
    finally:
        upstream.shutdown()
        sink.shutdown()
    markers = [m.encode() for m in capture.MARKERS.values()]
    assert not _marker_hits(tmp_path, markers)
    print(f"openai-agents + {group}: calls {len(calls)}, client records "
          f"{scrape.value('gen_ai_client_operation_duration_seconds_count'):g}, server records 0 (no engine behind the "
          f"agents' calls: no propagation), spans {scrape.value('otel_llm_receiver_accepted_spans_total'):g}, "
          f"redacted at intake {scrape.value('otel_llm_intake_log_attributes_redacted_total'):g}, marker bytes found 0")


# The capture scenarios run live (tests/testdata/emitters/capture.py's children, in the capture group's
# virtualenv): calls, and how many client records each instrumentation's spans make of them.
CAPTURE_CALLS = ["chat", "stream", "err500", "err400", "abort"]
LITELLM_CALLS = ["chat", "stream", "err500", "err400"]  # its capture child has no abort
MATRIX: dict[str, tuple[list[str], int]] = {
    # OpenTelemetry's openai-v2 with the httpx instrumentation (its HTTP span carries the traceparent)
    "openai_v2_httpx": (CAPTURE_CALLS, len(CAPTURE_CALLS)),
    # OpenLLMetry: injects the traceparent itself
    "openllmetry_openai": (CAPTURE_CALLS, len(CAPTURE_CALLS)),
    # OpenInference: no gen_ai.* keys (README), so no client record; no propagation
    "openinference_openai": (CAPTURE_CALLS, 0),
    # LiteLLM SDK, its legacy callback as a new user sets it up (content on by default), and its V2
    # logger with content opted in
    "litellm_sdk_v1": (LITELLM_CALLS, len(LITELLM_CALLS)),
    "litellm_sdk_v2_content": (LITELLM_CALLS, len(LITELLM_CALLS)),
}


@pytest.mark.parametrize("scenario", sorted(MATRIX))
def test_capture_scenarios_live(make_server, tmp_path, scenario):
    calls, expected = MATRIX[scenario]
    _matrix_case(make_server, tmp_path, scenario, "capture", [str(CAPTURES / "capture.py"), "--child", scenario],
                 {}, calls, expected)


def _matrix_case(make_server, tmp_path, scenario: str, group: str, argv: list[str], extra_env: dict[str, str],
                 calls: list[str], expected: int) -> None:
    python = _python(group)
    capture = _capture()
    upstream, upstream_port = capture.serve(capture.UpstreamHandler)
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    _Sink.bodies = []
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    try:
        server = make_server({
            "receivers": {"otlp": {"intake_log": {}}},
            "processors": {"tail_sampling": KEEP_ALL},
            "exporters": {"otlphttp": {"endpoint": f"http://127.0.0.1:{sink.server_address[1]}", "compression": "none",
                                       "sending_queue": {"storage": str(tmp_path / "queue")}}},
        })
        capture.STATE.scenario = scenario
        result_file = tmp_path / "results.json"
        env = capture.child_env(scenario, f"http://127.0.0.1:{server.http_port}", f"http://127.0.0.1:{upstream_port}",
                                str(result_file))
        env.update(extra_env)
        env["CAPTURE_CALLS"] = ",".join(calls)
        child = subprocess.run([python, *argv], env=env, capture_output=True, text=True, timeout=180)
        assert child.returncode == 0, child.stderr[-3000:]
        results = json.loads(result_file.read_text())
        assert [r["call"] for r in results] == calls
        assert [r["ok"] for r in results] == [True, True] + [False] * (len(calls) - 2), results
        with capture.STATE.lock:
            reached = [u for u in capture.STATE.upstream if u["scenario"] == scenario]
        # vLLM's span behind each answered call that carried a traceparent; a client abort gets none
        # (vLLM emits no span for an aborted request).
        answered = [u for u in reached if u["status"] == 200 and u["traceparent"] and not u["call"].startswith("abort")]
        provider = engine_tracer_provider("vllm-v1", server.exporter("http"), service_name=f"vllm-behind-{scenario}")
        for u in answered:
            emit_vllm_v1(provider, RequestTiming(time.time_ns() - 50_000_000, 0.001, 0.001, 0.002, 0.004,
                                                 completion_tokens=capture.COMPLETION_TOKENS),
                         request_id=f"{scenario}-{u['seq']}", traceparent_headers={"traceparent": u["traceparent"]})
        provider.shutdown()
        scrape = server.wait_until(
            lambda s: s.value("gen_ai_client_operation_duration_seconds_count") >= expected
            and s.value("vllm:request_success_total") >= len(answered)
            and s.value("otel_llm_traces_in_memory") == 0
            and s.value("otel_llm_exporter_sent_spans_total") > 0, timeout_s=60, what="every live call decided")
        assert scrape.value("gen_ai_client_operation_duration_seconds_count") == expected
        assert scrape.value("vllm:request_success_total") == len(answered)
        if expected:
            joined = scrape.value("otel_llm_client_overhead_seconds_count") + \
                scrape.value("otel_llm_values_rejected_total", reason="negative_client_overhead")
            assert joined == len(answered)
            assert scrape.value("gen_ai_client_operation_duration_seconds_count", error_type="_OTHER") == 0
        server.service.store.flush()
    finally:
        upstream.shutdown()
        sink.shutdown()
    markers = [m.encode() for m in capture.MARKERS.values()]
    assert not _marker_hits(tmp_path, markers)
    print(f"{group} {scenario}: calls {len(results)}, client records "
          f"{scrape.value('gen_ai_client_operation_duration_seconds_count'):g}, server records "
          f"{scrape.value('vllm:request_success_total'):g} (of {len(reached)} upstream requests, {len(answered)} "
          f"answered with a traceparent), marker bytes found 0")


def test_a_stream_ten_times_longer_than_decision_wait_is_measured_joined(make_server, tmp_path):
    """openai-v2 with httpx, streaming for 20 s against a 2 s ``decision_wait``: its HTTP span (ended
    at the response headers) arrives ~20 s before its GenAI client span. The trace is held for the
    call in flight, so the engine span (it came last here) and the client span are one request:
    joined, nothing late, measured once on each side."""
    python = _python("capture")
    capture = _capture()
    stream_s = 20.0
    capture.STREAM_CHUNK_DELAY_S = stream_s / 3  # three content chunks
    upstream, upstream_port = capture.serve(capture.UpstreamHandler)
    try:
        server = make_server({"processors": {"tail_sampling": KEEP_ALL}})
        scenario = "openai_v2_httpx"
        capture.STATE.scenario = scenario
        result_file = tmp_path / "results.json"
        env = capture.child_env(scenario, f"http://127.0.0.1:{server.http_port}", f"http://127.0.0.1:{upstream_port}",
                                str(result_file))
        env["CAPTURE_CALLS"] = "stream"
        started = time.monotonic()
        child = subprocess.Popen([python, str(CAPTURES / "capture.py"), "--child", scenario], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = started + 30
            while True:  # the request reached the upstream: its traceparent is known
                with capture.STATE.lock:
                    reached = [u for u in capture.STATE.upstream if u["scenario"] == scenario]
                if reached or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert len(reached) == 1
            requested = time.monotonic()
            # vLLM exports its span as the request finishes, just before the stream's last bytes.
            time.sleep(max(0.0, requested + stream_s - 1.0 - time.monotonic()))
            provider = engine_tracer_provider("vllm-v1", server.exporter("http"), service_name="vllm-long-stream")
            emit_vllm_v1(provider, RequestTiming(time.time_ns() - int((stream_s - 1.5) * 1e9), 0.001, 0.001, 0.05,
                                                 stream_s - 1.6, completion_tokens=capture.COMPLETION_TOKENS),
                         request_id="long-stream", traceparent_headers={"traceparent": reached[0]["traceparent"]})
            provider.shutdown()
            _, stderr = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == 0, stderr[-3000:]
        assert time.monotonic() - started >= stream_s
        assert [r["ok"] for r in json.loads(result_file.read_text())] == [True]
        scrape = server.wait_until(
            lambda s: s.value("gen_ai_client_operation_duration_seconds_count") >= 1
            and s.value("vllm:request_success_total") >= 1 and s.value("otel_llm_traces_in_memory") == 0,
            timeout_s=30, what="the long call decided")
        assert scrape.value("otel_llm_late_spans_total") == 0
        assert scrape.value("gen_ai_client_operation_duration_seconds_count") == 1
        assert scrape.value("gen_ai_client_operation_duration_seconds_sum") >= stream_s
        assert scrape.value("vllm:request_success_total") == 1
        assert scrape.value("otel_llm_client_overhead_seconds_count") == 1  # joined: the client's view of the engine
        # ... labelled with the engine's service name (vLLM V1's span names no model), not the client's model
        assert scrape.value("vllm:e2e_request_latency_seconds_count", model_name="vllm-long-stream") == 1
    finally:
        upstream.shutdown()
