"""What the real programs in front of the engines send, replayed from captures of their own code
(``tests/testdata/emitters``: the official openai-v2 instrumentation, LiteLLM's OTel loggers, ...).

Expected values come from the captured spans and the calls the capture script made, never from
otel-llm: client spans feed ``gen_ai.client.*`` and nothing server-side; an engine span joined to
its client is one request; no prompt marker reaches the store, its WAL or the OTLP export.
"""

from __future__ import annotations

import pytest

from otel_llm_simulate.emitters import RequestTiming, emit_vllm_v1, engine_tracer_provider
from otel_llm.exporter.store.sqlite import StoreReader
from tests.support.captures import (
    MARKERS,
    Replay,
    attribute,
    duration_s,
    manifest,
    post,
    replay,
    scenario,
    trace_requests,
)
from tests.support.otelllm import RunningServer
from tests.support.payloads import gateway_batch, vllm_batch
from tests.support.workload import GENAI_DURATION_BUCKETS, expected_cumulative
from tests.test_hardening import store_bytes

KEEP_ALL = {"tail_sampling": {"decision_wait": "2s", "grace": "100ms", "policies": [
    {"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}}
CLIENT_TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
                        67108864]  # semconv v1.41.0 gen_ai.client.token.usage advice
SERVER_FAMILIES = ("vllm:request_success_total", "vllm:e2e_request_latency_seconds_count",
                   "gen_ai_server_request_duration_seconds_count", "otel_llm_request_segment_seconds_count")

# scenario -> the span name each call of the capture script produced (one GenAI span per call)
CLIENT_SCENARIOS = {
    "openai_v2_span_only": "chat gpt-4o-mini",  # opentelemetry-instrumentation-openai-v2, CLIENT
    "litellm_sdk_v1": "litellm_request",  # LiteLLM's legacy logger, INTERNAL
    "litellm_sdk_v1_semconv": "chat gpt-4o-mini",  # the same logger with the semconv opt-in, CLIENT
    "litellm_sdk_v2": "chat gpt-4o-mini",  # LITELLM_OTEL_V2=true, CLIENT
}


def _wait_for_client_requests(server: RunningServer, count: int):
    return server.wait_until(lambda s: s.value("gen_ai_client_operation_duration_seconds_count") >= count
                             and s.value("otel_llm_traces_in_memory") == 0, timeout_s=30,
                             what=f"{count} client operations, nothing pending")


def _failed_calls(name: str) -> int:
    return sum(1 for result in scenario(name)["call_results"] if not result["ok"])


@pytest.mark.parametrize("name", sorted(CLIENT_SCENARIOS))
def test_client_spans_feed_the_client_metrics_and_nothing_server_side(make_server, name):
    server = make_server()
    sent = replay(server, name)
    calls = sent.named(CLIENT_SCENARIOS[name])
    assert len(calls) == len(scenario(name)["calls"])  # one GenAI span per call the capture made
    scrape = _wait_for_client_requests(server, len(calls))

    assert scrape.buckets("gen_ai_client_operation_duration_seconds") == \
        expected_cumulative([duration_s(span) for span in calls], GENAI_DURATION_BUCKETS)
    failed = scrape.value("gen_ai_client_operation_duration_seconds_count") - \
        scrape.value("gen_ai_client_operation_duration_seconds_count", error_type="")
    assert failed == _failed_calls(name)
    for span in calls:
        model = attribute(span, "gen_ai.request.model")
        assert scrape.value("gen_ai_client_operation_duration_seconds_count", gen_ai_request_model=model) > 0
    inputs = [attribute(span, "gen_ai.usage.input_tokens") for span in calls]
    outputs = [attribute(span, "gen_ai.usage.output_tokens") for span in calls]
    assert scrape.buckets("gen_ai_client_token_usage", gen_ai_token_type="input") == \
        expected_cumulative([v for v in inputs if v is not None], CLIENT_TOKEN_BUCKETS)
    assert scrape.buckets("gen_ai_client_token_usage", gen_ai_token_type="output") == \
        expected_cumulative([v for v in outputs if v is not None], CLIENT_TOKEN_BUCKETS)
    # A client's failure (a 500 upstream, a refused connection) is no server error, and no client
    # span is a server request.
    for family in SERVER_FAMILIES:
        assert scrape.value(family) == 0, family
    assert scrape.value("otel_llm_requests_assembled_total", engine_kind="client") == len(calls)


def test_streaming_time_to_first_chunk_is_what_the_client_measured(make_server):
    server = make_server()
    sent = replay(server, "litellm_sdk_v2")
    chunks = [attribute(span, "gen_ai.response.time_to_first_chunk") for span in sent.spans]
    chunks = [value for value in chunks if value is not None]
    assert len(chunks) == 1  # the stream call
    scrape = _wait_for_client_requests(server, 3)
    assert scrape.value("gen_ai_client_operation_time_to_first_chunk_seconds_count") == 1
    assert scrape.value("gen_ai_client_operation_time_to_first_chunk_seconds_sum") == pytest.approx(chunks[0])
    assert scrape.value("gen_ai_server_time_to_first_token_seconds_count") == 0


def _engines_for_upstream_calls(server: RunningServer, name: str, sent: Replay) -> dict[str, float]:
    """vLLM V1's ``llm_request`` (simulator: vLLM's ``do_tracing``) for each successful upstream call,
    as a child of the traceparent that call carried, timed inside its HTTP client span. Returns
    {client GenAI span id (hex): engine e2e}."""
    provider = engine_tracer_provider("vllm-v1", server.exporter("http"), service_name="vllm-behind-client")
    by_id = {span.span_id.hex(): span for span in sent.spans}
    engines: dict[str, float] = {}
    for upstream in scenario(name)["upstream_requests"]:
        if upstream["status"] != 200 or not upstream["traceparent"]:
            continue
        http_span = by_id[upstream["traceparent"].split("-")[2]]
        client = by_id[http_span.parent_span_id.hex()]
        arrival = http_span.start_time_unix_nano + 1_000_000
        room_s = (client.end_time_unix_nano - arrival) / 1e9
        timing = RequestTiming(arrival, preprocess_s=0.1 * room_s, queue_s=0.1 * room_s, prefill_s=0.2 * room_s,
                               decode_s=0.4 * room_s, completion_tokens=7)
        emit_vllm_v1(provider, timing, request_id=f"up-{upstream['seq']}",
                     traceparent_headers={"traceparent": upstream["traceparent"]})
        engines[client.span_id.hex()] = timing.e2e_s
    provider.shutdown()
    return engines


def test_engine_behind_an_instrumented_client_is_one_request_per_side(make_server):
    server = make_server()
    name = "openai_v2_httpx"
    sent = replay(server, name)
    engines = _engines_for_upstream_calls(server, name, sent)
    assert len(engines) == 2  # chat and stream reached the upstream; the 500 did too, but failed
    clients = {span.span_id.hex(): span for span in sent.named("chat gpt-4o-mini")}
    scrape = _wait_for_client_requests(server, len(clients))
    server.wait_for_requests(len(clients) + len(engines))
    scrape = server.scrape()

    # Server side: each engine request once, never again as a "genai" request of its client.
    assert scrape.value("vllm:request_success_total") == len(engines)
    assert scrape.value("vllm:request_success_total", engine_kind="vllm") == len(engines)
    assert scrape.value("gen_ai_server_request_duration_seconds_count") == len(engines)
    # ... labelled with what the engine's side names (vLLM V1's span names no model: its service name),
    # not what its caller names; the model the client asked for is the request model.
    assert scrape.value("vllm:e2e_request_latency_seconds_count", model_name="vllm-behind-client") == len(engines)
    request_model = attribute(next(iter(clients.values())), "gen_ai.request.model")
    assert scrape.value("gen_ai_server_request_duration_seconds_count", gen_ai_request_model=request_model,
                        gen_ai_response_model=attribute(next(iter(clients.values())), "gen_ai.response.model")) \
        == len(engines)
    # Client side: every call, the failed one included.
    assert scrape.value("gen_ai_client_operation_duration_seconds_count") == len(clients)
    # Client-observed overhead: the client span's duration minus the engine's e2e, per joined request.
    overheads = [duration_s(clients[span_id]) - e2e for span_id, e2e in engines.items()]
    assert scrape.value("otel_llm_client_overhead_seconds_count") == len(engines)
    assert scrape.value("otel_llm_client_overhead_seconds_sum") == pytest.approx(sum(overheads), abs=1e-6)


def test_without_propagation_each_side_counts_on_its_own(make_server):
    server = make_server()
    name = "openai_v2_span_only"  # no HTTP instrumentation: the upstream got no traceparent
    sent = replay(server, name)
    assert all(not upstream["traceparent"] for upstream in scenario(name)["upstream_requests"])
    provider = engine_tracer_provider("vllm-v1", server.exporter("http"))
    ok = [span for span in sent.named("chat gpt-4o-mini") if attribute(span, "gen_ai.response.model")]
    for index, span in enumerate(ok):
        emit_vllm_v1(provider, RequestTiming(span.start_time_unix_nano, 0.001, 0.002, 0.003, 0.004),
                     request_id=f"np-{index}")
    provider.shutdown()
    scrape = server.wait_for_requests(len(scenario(name)["calls"]) + len(ok))
    assert scrape.value("vllm:request_success_total") == len(ok)
    assert scrape.value("gen_ai_client_operation_duration_seconds_count") == len(scenario(name)["calls"])
    assert scrape.value("otel_llm_client_overhead_seconds_count") == 0  # nothing joined them


CONTENT_SCENARIOS = sorted(name for name in manifest()["scenarios"] if scenario(name)["files"] and any(
    marker.encode() in b"".join(r.SerializeToString() for r in trace_requests(name)) for marker in MARKERS))


def test_capture_set_has_content_to_redact():
    assert len(CONTENT_SCENARIOS) >= 3, CONTENT_SCENARIOS  # else the redaction test proves nothing


@pytest.mark.parametrize("name", CONTENT_SCENARIOS)
def test_no_prompt_of_a_real_instrumentation_reaches_store_or_export(make_server, name):
    backend = make_server({"processors": {**KEEP_ALL, "redaction": {"allow_content": True}}})
    server = make_server({"processors": KEEP_ALL,
                          "exporters": {"otlp": {"endpoint": f"127.0.0.1:{backend.grpc_port}"}}})
    sent = replay(server, name)
    raw = b"".join(request.SerializeToString() for request in sent.requests)
    present = [marker for marker in MARKERS if marker.encode() in raw]
    assert present  # the capture does carry content ...
    total = len(sent.spans)
    trace_ids = {span.trace_id.hex() for span in sent.spans}
    for peer in (server, backend):
        peer.wait_until(lambda s: s.value("otel_llm_traces_completed_total") >= len(trace_ids)
                        and s.value("otel_llm_traces_in_memory") == 0, timeout_s=30,
                        what=f"{len(trace_ids)} traces decided")
    server.service.store.flush()
    backend.service.store.flush()
    scrape = server.scrape()
    assert scrape.value("otel_llm_attributes_redacted_total") > 0
    for store in (server.service.store.path, backend.service.store.path):
        reader = StoreReader(store)
        stored = sum(len(reader.get_trace(trace_id)["spans"]) for trace_id in trace_ids)  # type: ignore[index]
        assert stored >= total  # ... every span was stored (and exported), the synthesized ones besides ...
        db = store_bytes(store)
        for marker in present:
            assert marker.encode() not in db, (marker, store)  # ... and none of the content


def test_litellm_metadata_and_content_keys_are_removed_but_the_model_stays(make_server):
    server = make_server({"processors": KEEP_ALL})
    replay(server, "litellm_sdk_v1")
    _wait_for_client_requests(server, 3)
    server.service.store.flush()
    reader = StoreReader(server.service.store.path)
    rows = reader.list_requests()
    assert len(rows) == 3
    for row in rows:
        for span in reader.get_trace(row["trace_id"])["spans"]:
            keys = set(span["attributes"])
            assert not {k for k in keys if k.startswith("llm.openai.") and k.endswith(("messages", "choices"))}
            assert "gen_ai.input.messages" not in keys and "gen_ai.output.messages" not in keys
            if span["name"] == "litellm_request":
                assert span["attributes"]["gen_ai.request.model"] == "gpt-4o-mini"


def _engines_for_forwarded_traceparents(server: RunningServer, name: str, sent: Replay) -> list[tuple[float, int, int]]:
    """vLLM V1's span for each successful upstream call that LiteLLM's proxy made with a forwarded
    traceparent (``forward_traceparent_to_llm_provider``): a child of that traceparent, inside the
    proxy's own span for the call. Returns (engine e2e, tightest, widest proxy SERVER span in ns)."""
    provider = engine_tracer_provider("vllm-v1", server.exporter("http"), service_name="vllm-behind-litellm")
    spans = sent.spans
    out = []
    for upstream in scenario(name)["upstream_requests"]:
        if upstream["status"] != 200 or not upstream["traceparent"]:
            continue
        trace_hex, parent_hex = upstream["traceparent"].split("-")[1:3]
        # The proxy's SERVER spans of this call: children of the forwarded (caller's) span, or, where the
        # proxy forwarded one of its own spans (pass-through routes), its nearest SERVER span at or above it.
        in_trace = {s.span_id.hex(): s for s in spans if s.trace_id.hex() == trace_hex}
        proxies = [s for s in in_trace.values() if s.kind == s.SPAN_KIND_SERVER and s.parent_span_id.hex() == parent_hex]
        cursor = in_trace.get(parent_hex)
        while not proxies and cursor is not None:
            if cursor.kind == cursor.SPAN_KIND_SERVER:
                proxies = [cursor]
            cursor = in_trace.get(cursor.parent_span_id.hex())
        assert proxies, upstream
        inner = min(proxies, key=duration_s)
        arrival = inner.start_time_unix_nano + 2_000_000
        room_s = (inner.end_time_unix_nano - arrival) / 1e9 - 0.002
        timing = RequestTiming(arrival, preprocess_s=0.1 * room_s, queue_s=0.1 * room_s, prefill_s=0.2 * room_s,
                               decode_s=0.5 * room_s, completion_tokens=7)
        emit_vllm_v1(provider, timing, request_id=f"lp-{upstream['seq']}",
                     traceparent_headers={"traceparent": upstream["traceparent"]})
        out.append((timing.e2e_s, min(int(duration_s(p) * 1e9) for p in proxies),
                    max(int(duration_s(p) * 1e9) for p in proxies)))
    provider.shutdown()
    return out


@pytest.mark.parametrize("name", ["litellm_proxy_v1", "litellm_proxy_v2"])
def test_litellm_proxy_in_front_of_vllm_is_the_requests_gateway(make_server, name):
    server = make_server()
    sent = replay(server, name)
    engines = _engines_for_forwarded_traceparents(server, name, sent)
    assert len(engines) >= 3  # chat and stream with a caller traceparent, and the pass-through route
    server.wait_until(lambda s: s.value("vllm:request_success_total") >= len(engines)
                      and s.value("otel_llm_traces_in_memory") == 0, timeout_s=30, what="engine requests decided")
    scrape = server.scrape()
    # One server record per engine request, none for LiteLLM's own spans.
    assert scrape.value("vllm:request_success_total") == len(engines)
    assert scrape.value("vllm:request_success_total", engine_kind="genai") == 0
    # The model LiteLLM routed to, although vLLM V1's span names none.
    assert scrape.value("vllm:request_success_total", model_name="") == 0
    # Gateway overhead from the proxy's span around each engine request.
    assert scrape.value("otel_llm_gateway_overhead_seconds_count") == len(engines)
    low = sum(tight / 1e9 - e2e for e2e, tight, _ in engines)
    high = sum(wide / 1e9 - e2e for e2e, _, wide in engines)
    assert low - 1e-6 <= scrape.value("otel_llm_gateway_overhead_seconds_sum") <= high + 1e-6
    # LiteLLM's calls out are client-side requests; counted there, once per call.
    calls = scenario(name)["calls"]
    assert 0 < scrape.value("gen_ai_client_operation_duration_seconds_count") <= len(calls)


def test_nothing_made_up_in_exported_spans_rows_or_labels(make_server):
    """vLLM V1 names no model and a gateway-only request no provider: neither is invented (issue 11). The
    engine's model label is its service name (README: model_name.from_service_name), never written into
    its span as a request model."""
    server = make_server({"processors": KEEP_ALL})
    alone = vllm_batch(1)  # vLLM V1 with no gateway, no model attribute, no resource mapping
    gateway_only = gateway_batch(engine=False)  # a GenAI SERVER span: gen_ai.request.model, no provider
    for request in (alone, gateway_only):
        assert post(server, request) == 200
    scrape = server.wait_for_requests(2)
    assert scrape.value("vllm:request_success_total", model_name="raw", engine_kind="vllm", service_name="raw") == 1
    assert scrape.value("gen_ai_server_request_duration_seconds_count", gen_ai_request_model="raw",
                        gen_ai_response_model="", gen_ai_provider_name="vllm") == 1
    assert scrape.value("gen_ai_server_request_duration_seconds_count", gen_ai_provider_name="") == 1  # gateway-only
    server.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == 0, what="both traces decided")
    server.service.store.flush()
    reader = StoreReader(server.service.store.path)
    engine_trace = alone.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()
    gateway_trace = gateway_only.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()
    engine_span = next(s for s in reader.get_trace(engine_trace)["spans"] if s["name"] == "llm_request")  # type: ignore[index]
    assert "gen_ai.request.model" not in engine_span["attributes"]
    assert engine_span["attributes"]["gen_ai.provider.name"] == "vllm"  # the engine that emitted it
    assert engine_span["attributes"]["otel_llm.model_source"] == "resource:service.name"
    gateway_span = reader.get_trace(gateway_trace)["spans"][0]  # type: ignore[index]
    assert "gen_ai.provider.name" not in gateway_span["attributes"]
    assert gateway_span["attributes"]["gen_ai.request.model"] == "absurd-model"  # observed, so kept
    rows = {row["trace_id"]: row for row in reader.list_requests()}
    assert rows[engine_trace]["model"] == "raw"
