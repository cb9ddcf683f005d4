"""The simulator's application tier and LiteLLM proxy: span shapes copied from the real emitters'
captures (tests/testdata/emitters), and otel-llm fed with the fleet counts every request once per
side, with the values the plan says (computed here, never read back from otel-llm)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from otel_llm.exporter.store.sqlite import StoreReader
from otel_llm_simulate.clients import (
    APP_GENAI_SCOPE,
    APP_HTTPX_SCOPE,
    FASTAPI_SCOPE,
    LITELLM_SCOPE,
    ClientCall,
    ProxyTimes,
    emit_app_client,
    emit_litellm_proxy,
)
from otel_llm_simulate.emitters import RequestTiming, SamplingParams, emit_vllm_v1, engine_tracer_provider
from otel_llm_simulate.runner import run_plan
from otel_llm_simulate.scenarios import APP_SHARES, plan
from tests.support.workload import GENAI_DURATION_BUCKETS, expected_cumulative
from tests.test_simulator import FAST_DECISIONS, Collect, feed, make_plan

MANIFEST = Path(__file__).parent / "testdata" / "emitters" / "MANIFEST.json"
T0 = 1_700_000_000_000_000_000
MS = 1_000_000
OK = ("stop", "length")
# Keys a capture has that the simulator leaves out on purpose: content (never emitted), what vLLM
# does not return (openai's service tier / fingerprint) and LiteLLM's per-key metadata and cost.
NOT_SIMULATED = frozenset({"openai.response.service_tier", "openai.response.system_fingerprint", "hidden_params",
                           "gen_ai.openai.response.service_tier", "litellm.preprocessing.duration_ms"})


def capture(scenario: str) -> dict[str, Any]:
    return json.loads(MANIFEST.read_text(encoding="utf-8"))["scenarios"][scenario]


def captured_keys(entry: dict[str, Any]) -> set[str]:
    """A captured span's attribute keys minus content keys (the manifest lists both)."""
    keys = set(entry.get("attributes") or {}) | set(entry.get("attribute_keys") or ())
    return keys - set(entry.get("content_attribute_keys") or ()) - NOT_SIMULATED


def kind_name(kind: SpanKind) -> str:
    return kind.name  # "CLIENT", "SERVER", "INTERNAL": the manifest's spelling


def scope_of(span: ReadableSpan) -> str:
    scope = span.instrumentation_scope
    return f"{scope.name} {scope.version}" if scope.version else scope.name


# --- (1) the shapes are the captures' ------------------------------------------------------------


def app_call(stream: bool, status: int = 200, top_p: float | None = 0.9) -> ClientCall:
    ok = status < 400
    return ClientCall(
        start_ns=T0, end_ns=T0 + 140 * MS, http_start_ns=T0 + 2 * MS,
        http_end_ns=T0 + (4 if stream else 130) * MS, request_model="gpt-4o-mini", stream=stream,
        params=SamplingParams(max_tokens=64, temperature=0.2, top_p=top_p), http_status=status,
        response_model="gpt-4o-mini-2024-07-18" if ok else None, response_id="chatcmpl-1" if ok else None,
        input_tokens=23 if ok else None, output_tokens=7 if ok else None, finish_reason="stop" if ok else None)


def test_app_client_spans_are_the_openai_v2_httpx_capture():
    spans = capture("openai_v2_httpx")["spans"]
    genai = [s for s in spans if s["kind"] == "CLIENT" and s["name"].startswith("chat ")]
    http = [s for s in spans if s["name"] == "POST"]
    assert len(genai) == len(http) == 3  # chat, stream, err500, in that order
    mem = InMemorySpanExporter()
    provider = engine_tracer_provider("app", mem, seed=3)
    # The capture's stream call passed no top_p; its span has none.
    calls = [app_call(False), app_call(True, top_p=None), app_call(False, status=500)]
    for call, want_genai, want_http in zip(calls, genai, http, strict=True):
        mem.clear()
        received: list[dict[str, str]] = []
        emit_app_client(provider, call, upstream_call=received.append)
        ours = {s.name: s for s in mem.get_finished_spans()}
        assert set(ours) == {want_genai["name"], "POST"}
        chat, post = ours[want_genai["name"]], ours["POST"]
        for span, want in ((chat, want_genai), (post, want_http)):
            assert kind_name(span.kind) == want["kind"] == "CLIENT"
            assert scope_of(span) == want["scope"]
            assert set(span.attributes) == captured_keys(want), span.name
            assert span.status.status_code.name == want["status"]
        assert chat.instrumentation_scope.name == APP_GENAI_SCOPE and post.instrumentation_scope.name == APP_HTTPX_SCOPE
        assert chat.parent is None and post.parent.span_id == chat.context.span_id  # "child of 'chat …'"
        # The upstream receives the POST span's context: an engine span becomes its child.
        assert received == [{"traceparent": f"00-{post.context.trace_id:032x}-{post.context.span_id:016x}-01"}]
        if call.http_status >= 400:
            assert chat.attributes["error.type"] == want_genai["attributes"]["error.type"]
            assert chat.status.description.startswith("Error code: 500")
        else:
            assert chat.attributes["gen_ai.provider.name"] == "openai"
            assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert post.attributes["http.status_code"] == want_http["attributes"]["http.status_code"]
        # A plain call's POST ends after the body, a stream's at the headers (the capture's 1.2 ms).
        assert (post.end_time - post.start_time < 10 * MS) == call.stream


def test_app_without_http_instrumentation_propagates_nothing():
    want = capture("openai_v2_span_only")
    assert all(u["traceparent"] is None for u in want["upstream_requests"])
    mem = InMemorySpanExporter()
    received: list[dict[str, str]] = []
    emit_app_client(engine_tracer_provider("app", mem, seed=4), app_call(False), propagate=False,
                    upstream_call=received.append)
    (chat,) = mem.get_finished_spans()
    assert received == [{}] and chat.parent is None
    first = next(s for s in want["spans"] if s["name"].startswith("chat "))
    assert set(chat.attributes) == captured_keys(first)


def proxy_times(start: int) -> ProxyTimes:
    """Offsets shaped like the capture's chat_tp (ms from the FastAPI span's start)."""
    at = lambda a, b: (start + round(a * MS), start + round(b * MS))  # noqa: E731
    return ProxyTimes(server=at(0, 186.4), received=at(4.9, 180.2), auth=at(4.9, 18.5), pre_call=at(81.6, 81.7),
                      router=at(83.5, 183.6), deployment=at(84.5, 85.7), request=at(87.9, 180.2),
                      self_call=at(110.7, 179.6))


def engine_timing(arrival_ns: int, e2e_s: float = 0.06) -> RequestTiming:
    return RequestTiming(arrival_unix_ns=arrival_ns, preprocess_s=0.002, queue_s=0.001, prefill_s=0.01,
                         decode_s=e2e_s - 0.0135, postprocess_s=0.0005, prompt_tokens=23, completion_tokens=7)


def test_litellm_proxy_spans_are_the_litellm_proxy_v1_capture():
    want = capture("litellm_proxy_v1")
    caller = want["caller_traceparents"][0]  # the chat_tp call's
    caller_trace, caller_span = caller.split("-")[1:3]
    captured = [s for s in want["spans"] if s["trace_id"] == caller_trace]
    by_id = {s["span_id"]: s for s in captured}

    def shape(name: str, kind: str, parent_id: str | None) -> tuple[str, str, str]:
        parent = "caller" if parent_id == caller_span else by_id[parent_id]["name"] if parent_id in by_id else "?"
        return name, kind, parent

    mem = InMemorySpanExporter()
    proxy = engine_tracer_provider("litellm-proxy", mem, seed=5)
    engine = engine_tracer_provider("vllm-v1", mem, seed=6)
    times = proxy_times(T0)
    forwarded: list[dict[str, str]] = []

    def upstream(headers: dict[str, str]) -> None:
        forwarded.append(headers)
        emit_vllm_v1(engine, engine_timing(times.self_call[0] + MS), request_id="chatcmpl-x",
                     traceparent_headers=headers)

    emit_litellm_proxy(proxy, times, model="gpt-4o-mini",
                       caller_headers={"traceparent": caller, "tracestate": "app=capture"}, upstream_call=upstream,
                       params=SamplingParams(max_tokens=64, temperature=0.2),
                       upstream_response_model="gpt-4o-mini-2024-07-18", response_id="chatcmpl-x", input_tokens=23,
                       output_tokens=7, finish_reason="stop")
    spans = mem.get_finished_spans()
    ours = [s for s in spans if s.name != "llm_request"]
    ids = {s.context.span_id: s for s in ours}
    caller_id = int(caller_span, 16)

    def our_shape(s: ReadableSpan) -> tuple[str, str, str]:
        parent = s.parent.span_id if s.parent else None
        where = "caller" if parent == caller_id else ids[parent].name if parent in ids else "?"
        return s.name, kind_name(s.kind), where

    # Same spans, kinds and parentage as the real proxy (the two SERVER spans siblings under the caller).
    assert Counter(map(our_shape, ours)) == Counter(shape(s["name"], s["kind"], s["parent_span_id"]) for s in captured)
    for span in ours:
        matching = [s for s in captured if s["name"] == span.name]
        allowed = set().union(*(captured_keys(s) for s in matching)) | {"exception"}
        assert set(span.attributes) <= allowed, (span.name, set(span.attributes) - allowed)
        assert scope_of(span) in {s["scope"] for s in matching}
    request = next(s for s in ours if s.name == "litellm_request")
    wanted = next(s for s in captured if s["name"] == "litellm_request")["attributes"]
    for key in ("gen_ai.operation.name", "gen_ai.system", "gen_ai.request.model", "gen_ai.response.model",
                "gen_ai.response.finish_reasons", "llm.is_streaming", "litellm.model_group", "litellm.provider.model"):
        assert request.attributes[key] == wanted[key], key
    assert {s.instrumentation_scope.name for s in ours} == {LITELLM_SCOPE, FASTAPI_SCOPE}
    # The caller's traceparent reaches the engine verbatim (not its tracestate): vLLM's span is a
    # sibling of the proxy's SERVER spans, as the capture's upstream request says.
    assert forwarded == [{"traceparent": caller}] and want["upstream_requests"][0]["traceparent"] == caller
    (vllm,) = [s for s in spans if s.name == "llm_request"]
    assert vllm.parent.span_id == caller_id and vllm.context.trace_id == int(caller_trace, 16)
    servers = [s for s in ours if s.kind == SpanKind.SERVER]
    assert len(servers) == 2 and all(s.start_time <= vllm.start_time and vllm.end_time <= s.end_time for s in servers)
    assert all(s.status.status_code in (StatusCode.OK, StatusCode.UNSET) for s in ours)


# --- (2) the plan: who calls, deterministic, consistent -----------------------------------------


def test_app_tier_is_deterministic_and_has_the_declared_shares():
    a, b = make_plan("steady", start_ns=T0), make_plan("steady", start_ns=T0)
    assert a == b and a.client_legs()
    other = make_plan("steady", seed=12, start_ns=T0)
    assert [c.call for c in other.client_legs()] != [c.call for c in a.client_legs()]
    many = plan("steady", seed=3, rate=20.0, duration_s=60.0, start_ns=T0)
    vllm_ok = [r for r in many.requests if r.engine == "vllm-v1" and r.outcome in OK]
    via = Counter(r.client.via if r.client else "none" for r in vllm_ok)
    for path, share in (("litellm", APP_SHARES["vllm_via_litellm"]), ("direct", APP_SHARES["vllm_direct"]),
                        ("gateway", APP_SHARES["vllm_via_gateway"])):
        assert abs(via[path] / len(vllm_ok) - share) < 0.05, (path, via)
    sglang_direct_ok = [r for r in many.requests if r.engine == "sglang" and r.gateway is None and r.outcome in OK]
    unpropagated = sum(1 for r in sglang_direct_ok if r.client is not None)
    assert abs(unpropagated / len(sglang_direct_ok) - APP_SHARES["sglang_unpropagated"]) < 0.08
    assert not any(r.client for r in many.requests if r.outcome == "abort")
    for r in many.requests:
        c = r.client
        if c is None:
            continue
        call = c.call
        assert call.start_ns < call.http_start_ns < call.http_end_ns <= call.end_ns == r.send_at_ns
        assert c.joined == (c.propagates and r.timing is not None)
        if r.timing is not None:  # the engine works inside the application's call
            assert call.start_ns < r.timing.arrival_unix_ns and r.timing.end_unix_ns < call.end_ns
        if c.via == "litellm":
            assert r.proxy is not None and r.gateway is None and r.timing is not None
            server, received = r.proxy.server, r.proxy.received
            assert call.http_start_ns < server[0] < received[0] < r.timing.arrival_unix_ns
            assert r.timing.end_unix_ns <= received[1] == r.proxy.request[1] < server[1] < call.end_ns
        if c.via == "gateway":
            assert r.gateway is not None and call.http_start_ns < r.gateway.start_ns
        if call.stream and call.ok:  # httpx returns at the headers; the stream is read after
            assert call.http_end_ns < call.end_ns - 1 * MS or r.timing.e2e_s < 0.01


# --- (3) otel-llm fed with the fleet: each side counted once, with the plan's values -------------


def vllm_e2e(r) -> float:
    return float(r.timing.e2e_s)


def test_client_and_server_sides_of_the_fleet(make_server):
    p = make_plan("errors")
    legs = p.client_legs()
    _, scrape = feed(make_server, p)
    # Client side: every application call once, with its own duration (semconv buckets).
    durations = [(c.call.end_ns - c.call.start_ns) / 1e9 for c in legs]
    assert scrape.value("gen_ai_client_operation_duration_seconds_count") == len(legs) > 30
    assert scrape.buckets("gen_ai_client_operation_duration_seconds") == \
        expected_cumulative(durations, GENAI_DURATION_BUCKETS)
    failed = [c for c in legs if not c.call.ok]
    assert failed and scrape.value("gen_ai_client_operation_duration_seconds_count",
                                   error_type="<class 'openai.InternalServerError'>") == len(failed)
    assert scrape.value("gen_ai_client_operation_duration_seconds_count", gen_ai_provider_name="openai",
                        gen_ai_operation_name="chat") == len(legs)
    assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="input") == \
        sum(c.call.input_tokens or 0 for c in legs)
    assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="output") == \
        sum(c.call.output_tokens or 0 for c in legs)

    # Server side: one record per engine request, never one more for the client span in front of it.
    assert scrape.value("vllm:request_success_total") == len(p.requests)
    assert scrape.value("gen_ai_server_request_duration_seconds_count") == len(p.requests)
    assert scrape.value("vllm:request_success_total", engine_kind="client") == 0
    errors = sum(1 for r in p.requests if r.outcome == "error")
    assert scrape.value("vllm:request_success_total", finished_reason="error") == errors

    # Client-observed overhead: once per application call joined with an engine span.
    joined = [r for r in p.requests if r.client is not None and r.client.joined]
    assert scrape.value("otel_llm_client_overhead_seconds_count") == len(joined) > 20
    vllm_joined = [r for r in joined if r.engine in ("vllm-v1", "vllm-next")]  # engine_kind="vllm"
    assert scrape.buckets("otel_llm_client_overhead_seconds", engine_kind="vllm") == expected_cumulative(
        [max((r.client.call.end_ns - r.client.call.start_ns) / 1e9 - vllm_e2e(r), 0.0) for r in vllm_joined],
        GENAI_DURATION_BUCKETS)

    # vLLM names no model: whoever is in front does (gateway, application or the proxy's
    # litellm_request), so every vLLM request has one, and the proxy's outer SERVER span is its edge.
    for model in {r.model for r in p.requests if r.engine == "vllm-v1"}:
        served = [r for r in p.requests if r.engine == "vllm-v1" and r.model == model and r.timing is not None]
        assert scrape.value("vllm:request_success_total", engine_kind="vllm", model_name=model) == len(served)
        # The edge: the proxy's FastAPI SERVER span (the outer of its two), or the gateway's span.
        edge_ns = [(r.proxy.server[1] - r.proxy.server[0]) if r.proxy else (r.gateway.end_ns - r.gateway.start_ns)
                   for r in served if r.proxy or r.gateway]
        overheads = [max(d / 1e9 - vllm_e2e(r), 0.0)
                     for d, r in zip(edge_ns, [r for r in served if r.proxy or r.gateway], strict=True)]
        assert any(r.proxy for r in served) and len(overheads) < len(served)  # app -> vLLM has no gateway
        assert scrape.buckets("otel_llm_gateway_overhead_seconds", engine_kind="vllm", model_name=model) == \
            expected_cumulative(overheads, GENAI_DURATION_BUCKETS)
    assert scrape.value("vllm:request_success_total", engine_kind="vllm", model_name="") == 0


def test_proxy_names_the_model_of_a_request_it_forwarded(make_server):
    """The capture's own shape: a caller that sent a traceparent (and exported nothing), the proxy's
    spans and vLLM's span siblings under it. vLLM runs without OTEL_SERVICE_NAME (its service name is the
    SDK's placeholder, no model label): the model can only come from litellm_request."""
    server = make_server(FAST_DECISIONS)
    exporter = server.exporter("grpc")
    proxy = engine_tracer_provider("litellm-proxy", exporter, seed=21)
    engine = engine_tracer_provider("vllm-v1", exporter, seed=22)
    now = time.time_ns() - 30 * 10**9
    n, model = 6, "proxy-only-model"
    edges: list[float] = []
    for i in range(n):
        times = proxy_times(now + i * 10**9)
        timing = engine_timing(times.self_call[0] + MS, e2e_s=0.03 + 0.005 * i)  # inside "self"
        caller = f"00-{i + 1:032x}-{i + 1:016x}-01"
        emit_litellm_proxy(
            proxy, times, model=model, caller_headers={"traceparent": caller},
            upstream_call=lambda h, t=timing, i=i: emit_vllm_v1(engine, t, request_id=f"chatcmpl-{i}",
                                                               traceparent_headers=h),
            params=SamplingParams(max_tokens=64), response_id=f"chatcmpl-{i}", input_tokens=23, output_tokens=7,
            finish_reason="stop")
        edges.append(max((times.server[1] - times.server[0]) / 1e9 - float(timing.e2e_s), 0.0))
    for provider in (proxy, engine):
        provider.shutdown()
    scrape = server.wait_until(
        lambda s: s.value("vllm:request_success_total") >= n and s.value("otel_llm_traces_in_memory") == 0,
        what=f"{n} engine requests")
    assert scrape.value("vllm:request_success_total") == n
    assert scrape.value("vllm:request_success_total", engine_kind="vllm", model_name=model) == n
    assert scrape.value("gen_ai_server_request_duration_seconds_count", gen_ai_request_model=model) == n
    assert scrape.buckets("otel_llm_gateway_overhead_seconds", model_name=model) == \
        expected_cumulative(edges, GENAI_DURATION_BUCKETS)



def _proxied(server, alias: str, service_name: str | None, n: int) -> None:
    """``n`` calls to the LiteLLM proxy's model group ``alias``, each forwarded to a vLLM started with
    ``OTEL_SERVICE_NAME=service_name`` (``None``: without it), the caller's traceparent carried through."""
    exporter = server.exporter("grpc")
    proxy = engine_tracer_provider("litellm-proxy", exporter, seed=31)
    engine = engine_tracer_provider("vllm-v1", exporter, service_name=service_name, seed=32)
    now = time.time_ns() - 30 * 10**9
    for i in range(n):
        times = proxy_times(now + i * 10**9)
        timing = engine_timing(times.self_call[0] + MS)
        emit_litellm_proxy(
            proxy, times, model=alias, caller_headers={"traceparent": f"00-{i + 1:032x}-{i + 1:016x}-01"},
            upstream_call=lambda h, t=timing, i=i: emit_vllm_v1(engine, t, request_id=f"chatcmpl-{i}",
                                                               traceparent_headers=h),
            params=SamplingParams(max_tokens=64), response_id=f"chatcmpl-{i}", input_tokens=23, output_tokens=7,
            finish_reason="stop")
    for provider in (proxy, engine):
        provider.shutdown()


KEEP_EVERY_TRACE = {"policies": [
    {"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}


def test_behind_a_gateway_the_engine_names_the_model_it_served(make_server):
    """A model group ``llama-3.1-8b-instruct`` routed to a vLLM serving ``tiny-chat`` with
    ``OTEL_SERVICE_NAME=tiny-chat`` (as docs/engines/vllm.md says): vLLM's own /metrics label those
    requests ``model_name="tiny-chat"``, and so does otel-llm, not with the gateway's alias, which stays
    the request model; the served model's ``max_model_len_by_model`` gives its token histograms vLLM's
    buckets. With ``from_service_name: false`` the alias is the label again."""
    alias, served, n = "llama-3.1-8b-instruct", "tiny-chat", 4
    server = make_server({"processors": {
        "tail_sampling": {**FAST_DECISIONS["processors"]["tail_sampling"], **KEEP_EVERY_TRACE},
        "llm_metrics": {"max_model_len_by_model": {served: 2048}}}})
    _proxied(server, alias, served, n)
    scrape = server.wait_until(
        lambda s: s.value("vllm:request_success_total") >= n and s.value("otel_llm_traces_in_memory") == 0,
        what=f"{n} engine requests")
    assert scrape.value("vllm:request_success_total", engine_kind="vllm", model_name=served) == n
    assert scrape.value("vllm:request_success_total", model_name=alias) == 0
    assert scrape.value("gen_ai_server_request_duration_seconds_count", gen_ai_request_model=alias) == n
    # vLLM's token buckets for --max-model-len 2048 (vllm/v1/metrics/loggers.py build_1_2_5_buckets): 1 ... 2000.
    bounds = set(scrape.buckets("vllm:request_prompt_tokens", model_name=served))
    assert {"2000.0", "+Inf"} <= bounds and "5000.0" not in bounds
    server.service.store.flush()
    rows = StoreReader(server.service.store.path).list_requests(engine="vllm", limit=100)
    assert [(r["model"], r["model_source"]) for r in rows] == [(served, "resource:service.name")] * n

    # The rule turned off: what the gateway names.
    off = make_server({"processors": {"tail_sampling": FAST_DECISIONS["processors"]["tail_sampling"],
                                      "llm_metrics": {"model_name": {"from_service_name": False}}}})
    _proxied(off, alias, served, n)
    scrape = off.wait_until(
        lambda s: s.value("vllm:request_success_total") >= n and s.value("otel_llm_traces_in_memory") == 0,
        what=f"{n} engine requests")
    assert scrape.value("vllm:request_success_total", engine_kind="vllm", model_name=alias) == n

def test_realtime_run_with_clients_sends_nothing_early():
    p = plan("steady", seed=8, rate=8.0, duration_s=1.5, start_ns=time.time_ns())
    assert any(r.client for r in p.requests) or len(p.requests) < 5
    sink: list[ReadableSpan] = []
    lags: list[float] = []
    result = run_plan(p, lambda: Collect(sink), on_sent=lambda r: lags.append((time.time_ns() - r.send_at_ns) / 1e9))
    assert result.ok and min(lags, default=0) >= 0
    # No span of a request ends after the request is sent: the application's span is its last.
    ends = Counter()
    for span in sink:
        ends[span.context.trace_id] = max(ends[span.context.trace_id], span.end_time)
    assert max(ends.values(), default=0) <= time.time_ns()
    assert result.client_calls_joined == sum(1 for c in p.client_legs() if c.joined)
