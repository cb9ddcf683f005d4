"""Privacy by allowlist, end to end: spans carrying unique markers in prompts, system prompts and
completions, under the keys of instrumentations otel-llm's block lists never named (Logfire's
``request_data``/``response_data``/``events``, OpenInference agents' ``llm.invocation_parameters``,
Logfire agents' ``raw_input``, keys nobody has invented yet), in span, event and link attributes,
a URL's query, the span's ``Status.message`` (a provider error quoting the prompt, as GenAI
instrumentations write ``str(error)``), a resource attribute and a scope attribute, go through a real
otel-llm with its store, its intake log, an OTLP/HTTP exporter and an OTLP/gRPC exporter (each with
an on-disk queue) and the debug exporter. Not one marker byte is in the store, its WAL, the intake
log, the disk queues, the debug log, what the OTLP/HTTP peer received or what the OTLP backend (a
second otel-llm that keeps content, with an intake log of its own) received and wrote; every call is
still measured, and the status message is reduced to the span's error type. Before the status message
and the resources and scopes went through the allowlist, their three markers were in the store and
its WAL (the status message), the intake log, both disk queues, the peer's bodies and the backend's
intake log and store."""

from __future__ import annotations

import http.server
import json
import logging
import threading
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.exporter.store.sqlite import StoreReader
from tests.support.engine_fixtures import event, kv, make_span, span_id, trace_id, vllm_request_span
from tests.support.ports import free_port
from tests.test_bad_input import http_post

MARKERS = ("zqx-prompt-4417", "zqx-system-8812", "zqx-completion-2290", "zqx-query-6650", "zqx-status-3321",
           "zqx-resource-5150", "zqx-scope-7734")
ERROR_TYPE = "BadRequestError"
KEEP_ALL = {"decision_wait": "2s", "grace": "100ms",
            "policies": [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}
CALLS = 6


class _Sink(http.server.BaseHTTPRequestHandler):
    """The OTLP/HTTP exporter's peer: keeps every body exactly as received; answers once ``release`` is
    set, so that meanwhile what the exporter sent stays in its on-disk queue to be looked at."""

    bodies: list[bytes] = []
    lock = threading.Lock()
    release = threading.Event()

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.lock:
            self.bodies.append(body)
        self.release.wait(timeout=120)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _client_span(n: int, trace: bytes, sid: bytes, start_ns: int, end_ns: int) -> Span:
    prompt, system, completion, query, status = MARKERS[:5]
    return make_span(
        "Chat Completion with 'm'", trace=trace, sid=sid, parent=None, kind=Span.SPAN_KIND_CLIENT,
        start_ns=start_ns, end_ns=end_ns,
        attrs={
            "gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "m",
            "gen_ai.response.model": "m", "gen_ai.usage.input_tokens": 32, "gen_ai.usage.output_tokens": 8,
            "server.address": "127.0.0.1", "async": False,
            "request_data": json.dumps({"model": "m", "messages": [{"role": "system", "content": system},
                                                                     {"role": "user", "content": prompt}]}),
            "response_data": json.dumps({"message": {"role": "assistant", "content": completion}}),
            "events": json.dumps([{"event.name": "gen_ai.choice", "message": {"content": completion}}]),
            "logfire.msg": f"Chat Completion with {prompt}",
            "llm.invocation_parameters": json.dumps({"instructions": system}),
            "raw_input": [prompt],
            f"acme.turn.{n}": prompt, "acme.context": [system, "x"],
            "url.full": f"https://user:secret@127.0.0.1:8000/v1/chat/completions?q={query}",
            "error.type": ERROR_TYPE,
        },
        # openai-v2's shape: str(error) of the provider's answer, which quotes the request
        status_code=Status.STATUS_CODE_ERROR,
        status_message=f"Error code: 400 - {{'error': {{'message': 'bad request: {prompt} {status}'}}}}",
        events=[event("exception", start_ns + 1000, {"exception.type": "openai.APIStatusError",
                                                     "exception.message": "Error code: 429",
                                                     "acme.locals": f"messages={prompt}"}),
                event("acme.stream.chunk", start_ns + 2000, {"delta": completion, "index": 3})],
        links=[],
    )


def _request(n: int, t0_ns: int) -> ExportTraceServiceRequest:
    trace, client_id = trace_id(f"privacy-{n}"), span_id(f"privacy-client-{n}")
    engine = vllm_request_span(parent=(trace, client_id), t0_ns=t0_ns, seed=f"privacy-{n}",
                               request_id=f"chatcmpl-privacy-{n}")
    engine_span = engine.resource_spans[0].scope_spans[0].spans[0]
    client = _client_span(n, trace, client_id, engine_span.start_time_unix_nano - 5_000_000,
                          engine_span.end_time_unix_nano + 5_000_000)
    link = client.links.add(trace_id=trace_id(f"other-{n}"), span_id=span_id(f"other-{n}"))
    link.attributes.extend(kv({"acme.reason": MARKERS[0], "acme.n": n}))
    app = engine.resource_spans.add()
    app.resource.attributes.extend(kv({"service.name": "privacy-app", "acme.deploy.note": MARKERS[5]}))
    scope_spans = app.scope_spans.add()
    scope_spans.scope.name = "acme.instrumentation"
    scope_spans.scope.attributes.extend(kv({"acme.scope.note": MARKERS[6]}))
    scope_spans.spans.append(client)
    return engine


def _marker_hits(data: bytes) -> list[str]:
    return [m for m in MARKERS if m.encode() in data]


def _exported_spans(bodies: list[bytes]) -> list[tuple[str, Span]]:
    """(service.name, span) of every span in OTLP/HTTP request bodies."""
    return [(next(kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.name"), span)
            for body in bodies for rs in ExportTraceServiceRequest.FromString(body).resource_spans
            for ss in rs.scope_spans for span in ss.spans]


def _queued(directory: Path) -> list[Path]:
    """The on-disk queue's files that hold the privacy app's spans (its requests written, not yet sent)."""
    return [p for p in directory.rglob("*") if p.is_file() and b"privacy-app" in p.read_bytes()]


def test_no_marker_byte_on_any_disk_or_wire(make_server, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    _Sink.bodies = []
    _Sink.release.clear()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    backend_port = free_port()
    http_queue, grpc_queue = tmp_path / "http-queue", tmp_path / "grpc-queue"
    try:
        server = make_server({
            "receivers": {"otlp": {"intake_log": {}}},
            "processors": {"tail_sampling": KEEP_ALL},
            "exporters": {
                "otlphttp": {"endpoint": f"http://127.0.0.1:{sink.server_address[1]}", "compression": "none",
                             "sending_queue": {"storage": str(http_queue)}},
                # The OTLP backend starts later: until then what this exporter sends waits in its disk queue.
                "otlp": {"endpoint": f"127.0.0.1:{backend_port}", "sending_queue": {"storage": str(grpc_queue)},
                         "retry_on_failure": {"initial_interval": "50ms", "max_interval": "500ms",
                                              "max_elapsed_time": "0s"}},
                "debug": {"verbosity": "detailed", "sampling_initial": 1000},
            },
        })
        t0_ns = time.time_ns()
        sent = [_request(n, t0_ns + n * 1_000_000) for n in range(CALLS)]
        for request in sent:
            assert not set(MARKERS) - set(_marker_hits(request.SerializeToString()))  # every marker went out
            status, _, _ = http_post(server, request.SerializeToString())
            assert status == 200
        scrape = server.wait_until(
            lambda s: s.value("gen_ai_client_operation_duration_seconds_count") >= CALLS
            and s.value("otel_llm_traces_in_memory") == 0, timeout_s=60, what="every call measured and decided")
        # Measured as the client saw it, once on each side, joined.
        assert scrape.value("gen_ai_client_operation_duration_seconds_count") == CALLS
        assert scrape.value("vllm:e2e_request_latency_seconds_count") == CALLS
        assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == CALLS * 8
        # Removed before the intake log was written, counted; and no block-list rule was needed.
        assert scrape.value("otel_llm_intake_log_appended_requests_total") == CALLS
        # Per call: 8 text values on the client span, one on each of its two events, one on its link, its
        # status message, its resource's and its scope's note; and the engine's token ids (vllm#32573's
        # token_generated events' new_token_ids: they decode to the completion, so they are content too).
        token_id_lists = sum(1 for request in sent for rs in request.resource_spans for ss in rs.scope_spans
                             for span in ss.spans for e in span.events for a in e.attributes
                             if a.key == "new_token_ids")
        assert token_id_lists >= CALLS
        assert scrape.value("otel_llm_intake_log_attributes_redacted_total", reason="not_allowed") == \
            CALLS * 14 + token_id_lists
        assert scrape.value("otel_llm_intake_log_attributes_redacted_total", reason="url_reduced") == CALLS
        assert scrape.value("otel_llm_intake_log_attributes_redacted_total", reason="content_key") == 0
        # Both disk queues hold the kept traces while their peers do not answer.
        deadline = time.monotonic() + 30
        while not (_queued(http_queue) and _queued(grpc_queue)) and time.monotonic() < deadline:
            time.sleep(0.05)
        queued = _queued(http_queue) + _queued(grpc_queue)
        assert _queued(http_queue) and _queued(grpc_queue), "the disk queues never held the kept traces"
        found = {f"{p} (queued)": _marker_hits(p.read_bytes()) for p in queued}
        # Then the peers answer: the OTLP backend, a second otel-llm keeping everything it receives,
        # content included, so any marker that reached it is in its intake log and its store.
        backend = make_server({
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{backend_port}"}},
                                   "intake_log": {}}},
            "processors": {"tail_sampling": KEEP_ALL, "redaction": {"allow_content": True}},
        })
        _Sink.release.set()
        server.wait_until(lambda s: s.value("otel_llm_exporter_sent_spans_total", exporter="otlphttp") >= CALLS * 2
                          and s.value("otel_llm_exporter_sent_spans_total", exporter="otlp") >= CALLS * 2,
                          timeout_s=60, what="every kept trace sent by both OTLP exporters")
        backend.wait_until(lambda s: s.value("otel_llm_traces_completed_total") >= CALLS
                           and s.value("otel_llm_traces_in_memory") == 0, timeout_s=60,
                           what="every kept trace received and decided by the backend")
        server.service.store.flush()
        backend.service.store.flush()
    finally:
        _Sink.release.set()
        sink.shutdown()
    # Every byte either otel-llm wrote (stores, WALs, intake log segments and journals, what stayed in
    # the disk queues), every byte the OTLP/HTTP peer received, and the log.
    files = [p for p in Path(tmp_path).rglob("*") if p.is_file()]
    assert sum(p.name.endswith(".wal") for p in files) >= 2, [p.name for p in files]  # both intake logs
    assert sum(p.name.endswith("-wal") for p in files) >= 2, [p.name for p in files]  # both stores' WALs
    assert _Sink.bodies
    found.update({str(p): _marker_hits(p.read_bytes()) for p in files})
    found.update({f"peer body {i}": _marker_hits(b) for i, b in enumerate(_Sink.bodies)})
    assert caplog.text.count("kept trace ") >= CALLS  # the debug exporter logged every kept trace
    found["the log"] = _marker_hits(caplog.text.encode())
    assert not {where: hits for where, hits in found.items() if hits}
    # What stayed: the metadata a user needs, the reduced URL, and the status message as the error type.
    peer = b"".join(_Sink.bodies)
    for kept in (b"gen_ai.request.model", b"exception.type", b"openai.APIStatusError",
                 b"https://127.0.0.1:8000/v1/chat/completions", b"acme.n", b"acme.instrumentation"):
        assert kept in peer, kept
    assert b"secret" not in peer
    failed = [span for service, span in _exported_spans(_Sink.bodies) if service == "privacy-app"]
    assert len(failed) == CALLS and {(s.status.code, s.status.message) for s in failed} == {
        (Status.STATUS_CODE_ERROR, ERROR_TYPE)}
    for store in (server.service.store.path, backend.service.store.path):
        reader = StoreReader(store)
        with reader._connection() as connection:
            messages = [row[0] for row in connection.execute("SELECT status_message FROM spans WHERE status_code = 2")]
        assert messages == [ERROR_TYPE] * CALLS, store
