"""Privacy by allowlist, end to end: spans carrying unique markers in prompts, system prompts and
completions, under the keys of instrumentations otel-llm's block lists never named (Logfire's
``request_data``/``response_data``/``events``, OpenInference agents' ``llm.invocation_parameters``,
Logfire agents' ``raw_input``, keys nobody has invented yet), in span, event and link attributes
and a URL's query, go through a real otel-llm with its store, its intake log and an OTLP/HTTP
exporter with an on-disk queue. Not one marker byte is in the store, its WAL, the intake log, the
disk queue or what the exporter's peer received; every call is still measured."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.support.engine_fixtures import event, kv, make_span, span_id, trace_id, vllm_request_span
from tests.test_bad_input import http_post

MARKERS = ("zqx-prompt-4417", "zqx-system-8812", "zqx-completion-2290", "zqx-query-6650")
KEEP_ALL = {"decision_wait": "2s", "grace": "100ms",
            "policies": [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}
CALLS = 6


class _Sink(http.server.BaseHTTPRequestHandler):
    """The exporter's peer: keeps every body exactly as received."""

    bodies: list[bytes] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with self.lock:
            self.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _client_span(n: int, trace: bytes, sid: bytes, start_ns: int, end_ns: int) -> Span:
    prompt, system, completion, query = MARKERS
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
        },
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
    app.resource.attributes.extend(kv({"service.name": "privacy-app"}))
    app.scope_spans.add().spans.append(client)
    return engine


def _marker_hits(data: bytes) -> list[str]:
    return [m for m in MARKERS if m.encode() in data]


def test_no_marker_byte_on_any_disk_or_wire(make_server, tmp_path):
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    _Sink.bodies = []
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    queue_dir = tmp_path / "queue"
    try:
        server = make_server({
            "receivers": {"otlp": {"intake_log": {}}},
            "processors": {"tail_sampling": KEEP_ALL},
            "exporters": {"otlphttp": {"endpoint": f"http://127.0.0.1:{sink.server_address[1]}",
                                       "compression": "none", "sending_queue": {"storage": str(queue_dir)}}},
        })
        t0_ns = time.time_ns()
        sent = [_request(n, t0_ns + n * 1_000_000) for n in range(CALLS)]
        for request in sent:
            assert any(m.encode() in request.SerializeToString() for m in MARKERS)  # the markers went out
            status, _, _ = http_post(server, request.SerializeToString())
            assert status == 200
        scrape = server.wait_until(
            lambda s: s.value("gen_ai_client_operation_duration_seconds_count") >= CALLS
            and s.value("otel_llm_traces_in_memory") == 0
            and s.value("otel_llm_exporter_sent_spans_total") >= CALLS * 2, timeout_s=60,
            what="every call measured, decided and exported")
        # Measured as the client saw it, once on each side, joined.
        assert scrape.value("gen_ai_client_operation_duration_seconds_count") == CALLS
        assert scrape.value("vllm:e2e_request_latency_seconds_count") == CALLS
        assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == CALLS * 8
        # Removed before the intake log was written, counted; and no block-list rule was needed.
        assert scrape.value("otel_llm_intake_log_appended_requests_total") == CALLS
        # Per call: 8 text values on the client span, one on each of its two events, one on its link;
        # and the engine's token ids (vllm#32573's token_generated events' new_token_ids: they decode to
        # the completion, so they are content too; nothing reads them).
        token_id_lists = sum(1 for request in sent for rs in request.resource_spans for ss in rs.scope_spans
                             for span in ss.spans for e in span.events for a in e.attributes
                             if a.key == "new_token_ids")
        assert token_id_lists >= CALLS
        assert scrape.value("otel_llm_intake_log_attributes_redacted_total", reason="not_allowed") == \
            CALLS * 11 + token_id_lists
        assert scrape.value("otel_llm_intake_log_attributes_redacted_total", reason="url_reduced") == CALLS
        assert scrape.value("otel_llm_intake_log_attributes_redacted_total", reason="content_key") == 0
        server.service.store.flush()
    finally:
        sink.shutdown()
    # Every byte otel-llm wrote (store, WAL, intake log segments and journals, the disk queue) and
    # every byte its peer received.
    files = [p for p in Path(tmp_path).rglob("*") if p.is_file()]
    assert any(p.name.endswith(".wal") for p in files), [p.name for p in files]  # the intake log was written
    assert any(p.name.endswith("-wal") or p.suffix == ".db" for p in files)
    assert _Sink.bodies
    found = {str(p): _marker_hits(p.read_bytes()) for p in files}
    found.update({f"peer body {i}": _marker_hits(b) for i, b in enumerate(_Sink.bodies)})
    assert not {where: hits for where, hits in found.items() if hits}
    # What stayed: the metadata a user needs, and the reduced URL.
    peer = b"".join(_Sink.bodies)
    for kept in (b"gen_ai.request.model", b"exception.type", b"openai.APIStatusError",
                 b"https://127.0.0.1:8000/v1/chat/completions", b"acme.n"):
        assert kept in peer, kept
    assert b"secret" not in peer
