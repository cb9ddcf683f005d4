"""The simulated engines emit, through the real OTel SDK, the span shapes of research/engine-spans.md."""

from __future__ import annotations

import json
import re

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from otel_llm_simulate.emitters import (
    RequestTiming,
    SamplingParams,
    emit_gateway,
    emit_sglang,
    emit_tgi,
    emit_vllm_v0,
    emit_vllm_v1,
    engine_tracer_provider,
    rust_duration_debug,
)

T0 = 1_700_000_000_000_000_000  # a fixed wall clock: emitters never read the real one
TIMING = RequestTiming(
    arrival_unix_ns=T0,
    preprocess_s=0.005,
    queue_s=0.25,
    prefill_s=0.125,
    decode_s=2.0,
    postprocess_s=0.002,
    prompt_tokens=812,
    completion_tokens=201,
)
# W3C example ids, so parenting assertions compare against known values.
UPSTREAM_TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
UPSTREAM_SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "vendor=x"}


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _only(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> ReadableSpan:
    matches = [s for s in spans if s.name == name]
    assert len(matches) == 1, [s.name for s in spans]
    return matches[0]


def _parse_rust_duration(text: str) -> float:
    """Independent inverse of Rust's Duration Debug, to check the emitted strings round-trip."""
    match = re.fullmatch(r"(\d+)(?:\.(\d{1,9}))?(s|ms|µs|ns)", text)
    assert match, text
    whole, frac, unit = match.groups()
    value = float(f"{whole}.{frac or '0'}")
    return value * {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}[unit]


@pytest.fixture()
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


# ------------------------------------------------------------------------------- timing / helpers


def test_request_timing_derived_values() -> None:
    assert TIMING.ttft_s == pytest.approx(0.38)
    assert TIMING.e2e_s == pytest.approx(2.382)
    assert TIMING.inference_s == pytest.approx(2.125)
    assert TIMING.end_unix_ns == T0 + 2_382_000_000


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.00085, "850µs"),
        (2.5, "2.5s"),
        (0.001234567, "1.234567ms"),
        (0.0, "0ns"),
        (12e-9, "12ns"),
        (1.0, "1s"),
        (0.001, "1ms"),
        (1.5e-6, "1.5µs"),
        (999e-9, "999ns"),
        (60.000000001, "60.000000001s"),
        (0.1, "100ms"),
        (3.0405, "3.0405s"),
    ],
)
def test_rust_duration_debug_matches_rust(seconds: float, text: str) -> None:
    assert rust_duration_debug(seconds) == text


def test_rust_duration_debug_rejects_negative_and_nan() -> None:
    with pytest.raises(ValueError):
        rust_duration_debug(-0.001)
    with pytest.raises(ValueError):
        rust_duration_debug(float("nan"))


def test_unknown_engine_kind_is_refused(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError):
        engine_tracer_provider("onnxruntime", exporter)


# ------------------------------------------------------------------------------- vLLM V1


def test_vllm_v1_span_shape(exporter: InMemorySpanExporter) -> None:
    provider = engine_tracer_provider("vllm-v1", exporter, process_id=777)
    ctx = emit_vllm_v1(provider, TIMING, request_id="chatcmpl-abc")

    (span,) = exporter.get_finished_spans()  # exactly one span: no children
    assert span.name == "llm_request"
    assert span.kind is SpanKind.SERVER
    assert span.instrumentation_scope.name == "vllm.tracing.otel"
    assert span.parent is None  # no traceparent -> new root
    assert span.context.span_id == ctx.span_id and span.context.trace_id == ctx.trace_id
    assert span.start_time == T0
    assert span.end_time == T0 + _ns(TIMING.e2e_s)
    assert not span.events and not span.links

    res = span.resource.attributes
    assert res["service.name"] == "unknown_service:python"
    assert res["vllm.instrumenting_module_name"] == "vllm.llm_engine"
    assert res["vllm.process_id"] == 777 and isinstance(res["vllm.process_id"], int)

    attrs = dict(span.attributes or {})
    assert set(attrs) == {
        "gen_ai.latency.time_in_queue",
        "gen_ai.latency.time_to_first_token",
        "gen_ai.latency.e2e",
        "gen_ai.latency.time_in_model_prefill",
        "gen_ai.latency.time_in_model_decode",
        "gen_ai.latency.time_in_model_inference",
        "gen_ai.usage.prompt_tokens",
        "gen_ai.usage.completion_tokens",
        "gen_ai.request.id",
        "gen_ai.request.max_tokens",
        "gen_ai.request.top_p",
        "gen_ai.request.temperature",
        "gen_ai.request.n",
    }
    for key in [k for k in attrs if k.startswith("gen_ai.latency.")]:
        assert isinstance(attrs[key], float), key
    assert attrs["gen_ai.latency.time_in_queue"] == pytest.approx(0.25)
    assert attrs["gen_ai.latency.time_to_first_token"] == pytest.approx(0.38)
    assert attrs["gen_ai.latency.e2e"] == pytest.approx(2.382)
    assert attrs["gen_ai.latency.time_in_model_prefill"] == pytest.approx(0.125)
    assert attrs["gen_ai.latency.time_in_model_decode"] == pytest.approx(2.0)
    assert attrs["gen_ai.latency.time_in_model_inference"] == pytest.approx(2.125)
    assert attrs["gen_ai.usage.prompt_tokens"] == 812 and isinstance(attrs["gen_ai.usage.prompt_tokens"], int)
    assert attrs["gen_ai.usage.completion_tokens"] == 201
    assert attrs["gen_ai.request.id"] == "chatcmpl-abc"
    assert attrs["gen_ai.request.max_tokens"] == 256
    assert attrs["gen_ai.request.temperature"] == pytest.approx(0.7)


def test_vllm_v1_sets_request_params_only_when_truthy(exporter: InMemorySpanExporter) -> None:
    provider = engine_tracer_provider("vllm-v1", exporter)
    emit_vllm_v1(
        provider,
        TIMING,
        request_id="r1",
        params=SamplingParams(max_tokens=None, top_p=0.0, temperature=0.0, n=1, top_k=40),
    )
    attrs = dict(exporter.get_finished_spans()[0].attributes or {})
    assert "gen_ai.request.temperature" not in attrs  # greedy decoding is invisible on V1 spans
    assert "gen_ai.request.top_p" not in attrs
    assert "gen_ai.request.max_tokens" not in attrs
    assert "gen_ai.request.top_k" not in attrs  # V1 never reports top_k
    assert attrs["gen_ai.request.n"] == 1
    # No model and no finish reason on V1, whatever the input.
    assert "gen_ai.response.model" not in attrs
    assert not any("finish" in k for k in attrs)


def test_vllm_v1_service_name_override(exporter: InMemorySpanExporter) -> None:
    provider = engine_tracer_provider("vllm-v1", exporter, service_name="llama-8b")
    emit_vllm_v1(provider, TIMING, request_id="r1")
    assert exporter.get_finished_spans()[0].resource.attributes["service.name"] == "llama-8b"


def test_vllm_v1_parent_from_traceparent_keeps_tracestate(exporter: InMemorySpanExporter) -> None:
    provider = engine_tracer_provider("vllm-v1", exporter)
    headers = {**TRACEPARENT, "baggage": "user=1"}
    emit_vllm_v1(provider, TIMING, request_id="r1", traceparent_headers=headers)
    span = exporter.get_finished_spans()[0]
    assert span.parent is not None and span.parent.is_remote
    assert span.parent.span_id == UPSTREAM_SPAN_ID
    assert span.context.trace_id == UPSTREAM_TRACE_ID
    assert span.context.trace_state.get("vendor") == "x"


# ------------------------------------------------------------------------------- gateway + engines


def test_gateway_parents_engine_span_and_ends_after_it(exporter: InMemorySpanExporter) -> None:
    gateway = engine_tracer_provider("gateway", exporter, seed=1)
    engine = engine_tracer_provider("vllm-v1", exporter, seed=2)
    seen: dict[str, str] = {}

    def call_engine(headers: dict[str, str]) -> None:
        seen.update(headers)
        emit_vllm_v1(engine, TIMING, request_id="r1", traceparent_headers=headers)

    gw_ctx = emit_gateway(
        gateway,
        start_unix_ns=T0 - 3_000_000,
        end_unix_ns=TIMING.end_unix_ns + 4_000_000,
        model="meta-llama/Llama-3.1-8B-Instruct",
        engine_call=call_engine,
        ttft_s=0.39,
    )

    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["llm_request", "POST /v1/chat/completions"]  # engine exported first
    eng, gw = spans
    assert seen["traceparent"] == f"00-{gw_ctx.trace_id:032x}-{gw_ctx.span_id:016x}-01"
    assert eng.parent is not None and eng.parent.span_id == gw.context.span_id
    assert eng.context.trace_id == gw.context.trace_id
    assert gw.end_time > eng.end_time and gw.start_time < eng.start_time

    assert gw.kind is SpanKind.SERVER and gw.parent is None
    assert gw.resource.attributes["service.name"] == "llm-gateway"
    attrs = dict(gw.attributes or {})
    assert attrs["http.request.method"] == "POST"
    assert attrs["http.route"] == "/v1/chat/completions"
    assert attrs["http.response.status_code"] == 200
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert attrs["gen_ai.server.time_to_first_token"] == pytest.approx(0.39)
    assert isinstance(attrs["server.address"], str) and isinstance(attrs["server.port"], int)
    assert "gen_ai.provider.name" not in attrs
    assert gw.status.status_code is StatusCode.UNSET


def test_engine_without_headers_is_a_root_even_inside_gateway(exporter: InMemorySpanExporter) -> None:
    # The gateway span is the simulator's *current* span during engine_call; a real engine process
    # never sees it, so an engine called without headers must still start a new trace.
    gateway = engine_tracer_provider("gateway", exporter)
    engine = engine_tracer_provider("vllm-v1", exporter)
    emit_gateway(
        gateway,
        start_unix_ns=T0,
        end_unix_ns=TIMING.end_unix_ns + 1,
        model="m",
        engine_call=lambda _headers: emit_vllm_v1(engine, TIMING, request_id="r1"),
    )
    eng, gw = exporter.get_finished_spans()
    assert eng.parent is None
    assert eng.context.trace_id != gw.context.trace_id


def test_seeded_providers_replay_identical_ids() -> None:
    def ids(seed: int) -> tuple[int, int]:
        mem = InMemorySpanExporter()
        ctx = emit_vllm_v1(engine_tracer_provider("vllm-v1", mem, seed=seed), TIMING, request_id="r")
        return ctx.trace_id, ctx.span_id

    assert ids(5) == ids(5)
    assert ids(5) != ids(6)
    assert ids(5)[0] >= 2**64  # non-SGLang engines keep full 128-bit trace ids


def test_gateway_error(exporter: InMemorySpanExporter) -> None:
    provider = engine_tracer_provider("gateway", exporter)
    emit_gateway(provider, start_unix_ns=T0, end_unix_ns=T0 + 10, model="m", status_error=True)
    (gw,) = exporter.get_finished_spans()
    assert gw.status.status_code is StatusCode.ERROR
    assert gw.attributes is not None and gw.attributes["http.response.status_code"] == 500
    assert "gen_ai.server.time_to_first_token" not in gw.attributes


# ------------------------------------------------------------------------------- vLLM V0


def test_vllm_v0_span_shape(exporter: InMemorySpanExporter) -> None:
    provider = engine_tracer_provider("vllm-v0", exporter)
    emit_vllm_v0(
        provider,
        TIMING,
        request_id="cmpl-1",
        model="facebook/opt-125m",
        params=SamplingParams(temperature=0.0, n=2),
    )
    (span,) = exporter.get_finished_spans()
    assert span.name == "llm_request" and span.kind is SpanKind.SERVER
    assert span.instrumentation_scope.name == "vllm.llm_engine"
    assert "vllm.process_id" not in span.resource.attributes  # V0's bare TracerProvider()
    assert span.start_time == T0 and span.end_time == TIMING.end_unix_ns
    attrs = dict(span.attributes or {})
    assert attrs["gen_ai.response.model"] == "facebook/opt-125m"
    assert attrs["gen_ai.request.temperature"] == 0.0  # V0 sets params unconditionally
    assert attrs["gen_ai.request.n"] == 2
    assert attrs["gen_ai.usage.num_sequences"] == 2
    assert attrs["gen_ai.latency.time_in_scheduler"] == pytest.approx(0.25)
    assert attrs["gen_ai.latency.time_in_queue"] == pytest.approx(0.25)
    assert attrs["gen_ai.latency.time_to_first_token"] == pytest.approx(0.38)
    assert attrs["gen_ai.latency.e2e"] == pytest.approx(2.382)
    for absent in ("time_in_model_prefill", "time_in_model_decode", "time_in_model_inference"):
        assert f"gen_ai.latency.{absent}" not in attrs


# ------------------------------------------------------------------------------- SGLang


def test_sglang_request_tree(exporter: InMemorySpanExporter) -> None:
    provider = engine_tracer_provider("sglang", exporter, seed=7)
    params = SamplingParams(max_tokens=512, top_p=0.9, temperature=0.0, n=1, top_k=20)
    root_ctx = emit_sglang(
        provider, TIMING, rid="1a2b3c4d5e6f7a8b", model="Qwen/Qwen2.5-7B", params=params, cached_tokens=64
    )
    spans = exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}

    # 64-bit trace and span ids: SGLang's custom IdGenerator.
    for s in spans:
        assert s.context.trace_id < 2**64 and s.context.span_id < 2**64
        assert s.context.trace_id == root_ctx.trace_id
        assert s.kind is SpanKind.INTERNAL
        assert s.instrumentation_scope.name == "sglang server"
        assert s.resource.attributes["service.name"] == "sglang"

    root = _only(spans, " Req 1a2b3c4d")
    assert root.parent is None and root.context.span_id == root_ctx.span_id
    assert (root.start_time, root.end_time) == (T0, TIMING.end_unix_ns)
    attrs = dict(root.attributes or {})
    assert attrs["rid"] == "1a2b3c4d5e6f7a8b" and attrs["module"] == "sglang::request"
    assert attrs["gen_ai.request.id"] == "1a2b3c4d5e6f7a8b"
    assert attrs["gen_ai.response.model"] == "Qwen/Qwen2.5-7B"
    assert attrs["gen_ai.response.finish_reasons"] == '["stop"]'
    assert json.loads(str(attrs["gen_ai.response.finish_reasons"])) == ["stop"]
    assert (attrs["gen_ai.usage.prompt_tokens"], attrs["gen_ai.usage.completion_tokens"]) == (812, 201)
    assert attrs["gen_ai.usage.cached_tokens"] == 64
    assert attrs["gen_ai.request.max_tokens"] == 512 and attrs["gen_ai.request.top_k"] == 20
    assert attrs["gen_ai.request.top_p"] == pytest.approx(0.9) and attrs["gen_ai.request.n"] == 1
    assert "gen_ai.request.temperature" not in attrs  # truthy-only
    assert "gen_ai.latency.time_in_queue" not in attrs  # declared by SGLang, never set
    assert attrs["gen_ai.latency.time_to_first_token"] == pytest.approx(0.38)
    assert attrs["gen_ai.latency.e2e"] == pytest.approx(2.382)
    # SGLang's prefill and inference run from the hand-off to the scheduler: they hold the queue.
    assert attrs["gen_ai.latency.time_in_model_prefill"] == pytest.approx(0.375)  # first_token - hand-off
    assert attrs["gen_ai.latency.time_in_model_decode"] == pytest.approx(2.002)  # finished - first_token
    assert attrs["gen_ai.latency.time_in_model_inference"] == pytest.approx(2.377)  # finished - hand-off

    tokenizer = _only(spans, "Tokenizer(host:5e1f0c0f | pid:4242)")
    scheduler = _only(spans, "Scheduler [TP 0] (host:5e1f0c0f | pid:4243)")
    for thread in (tokenizer, scheduler):
        assert thread.parent is not None and thread.parent.span_id == root.context.span_id
        assert thread.status.status_code is StatusCode.UNSET
    assert dict(tokenizer.attributes or {}) == {
        "host_id": "5e1f0c0ffee04b1d9a7c3d2e1f0a9b8c",
        "pid": 4242,
        "thread_label": "Tokenizer",
    }
    assert scheduler.attributes is not None and scheduler.attributes["tp_rank"] == 0
    assert scheduler.attributes["thread_label"] == "Scheduler"

    expected = {
        "tokenize": (tokenizer, T0, T0 + _ns(0.005)),
        "prefill_waiting": (scheduler, T0 + _ns(0.005), T0 + _ns(0.255)),
        "prefill_forward": (scheduler, T0 + _ns(0.255), T0 + _ns(0.38)),
        "decode_loop": (scheduler, T0 + _ns(0.38), T0 + _ns(2.38)),
    }
    previous = None
    for name, (parent, start, end) in expected.items():
        stage = _only(spans, name)
        assert stage.parent is not None and by_id[stage.parent.span_id] is parent, name
        assert (stage.start_time, stage.end_time) == (start, end), name
        # Stages are chained by links, each to the one before it.
        if previous is None:
            assert not stage.links
        else:
            assert [link.context.span_id for link in stage.links] == [previous.context.span_id]
        previous = stage
    assert len(spans) == 7


def test_sglang_abort_marks_thread_span(exporter: InMemorySpanExporter) -> None:
    provider = engine_tracer_provider("sglang", exporter)
    emit_sglang(provider, TIMING, rid="deadbeefcafe", model="m", aborted=True, role="decode")
    spans = exporter.get_finished_spans()
    root = _only(spans, "decode Req deadbeef")
    assert root.attributes is not None and root.attributes["gen_ai.response.finish_reasons"] == '["abort"]'
    scheduler = next(s for s in spans if s.name.startswith("Scheduler"))
    assert scheduler.status.status_code is StatusCode.ERROR
    assert scheduler.attributes is not None and scheduler.attributes["type"] == "abort"
    assert isinstance(scheduler.attributes["message"], str)
    assert root.status.status_code is StatusCode.UNSET


def test_sglang_traceparent_and_seeded_ids(exporter: InMemorySpanExporter) -> None:
    provider = engine_tracer_provider("sglang", exporter, seed=3)
    emit_sglang(provider, TIMING, rid="abcdef0123", model="m", traceparent_headers=TRACEPARENT)
    root = _only(exporter.get_finished_spans(), " Req abcdef01")
    assert root.parent is not None and root.parent.span_id == UPSTREAM_SPAN_ID
    assert root.context.trace_id == UPSTREAM_TRACE_ID  # an adopted trace keeps its 128-bit id

    def ids(seed: int) -> list[tuple[int, int]]:
        mem = InMemorySpanExporter()
        emit_sglang(engine_tracer_provider("sglang", mem, seed=seed), TIMING, rid="x", model="m")
        return [(s.context.trace_id, s.context.span_id) for s in mem.get_finished_spans()]

    assert ids(11) == ids(11)
    assert ids(11) != ids(12)


# ------------------------------------------------------------------------------- TGI


def test_tgi_generate_span_shape(exporter: InMemorySpanExporter) -> None:
    provider = engine_tracer_provider("tgi", exporter)
    ctx = emit_tgi(provider, TIMING, handler="generate", traceparent_headers=TRACEPARENT, seed=42)
    spans = exporter.get_finished_spans()
    handler = next(s for s in spans if s.context.span_id == ctx.span_id)
    assert handler.name == "generate" and handler.kind is SpanKind.INTERNAL
    assert handler.instrumentation_scope.name == "opentelemetry-otlp"
    assert dict(handler.resource.attributes) == {"service.name": "text-generation-inference.router"}
    # TGI's middleware parses only traceparent: the parent is adopted, tracestate is not.
    assert handler.parent is not None and handler.parent.span_id == UPSTREAM_SPAN_ID
    assert handler.context.trace_id == UPSTREAM_TRACE_ID
    assert handler.context.trace_state.get("vendor") is None
    assert (handler.start_time, handler.end_time) == (T0, TIMING.end_unix_ns)

    attrs = dict(handler.attributes or {})
    assert set(attrs) == {
        "parameters",
        "total_time",
        "validation_time",
        "queue_time",
        "inference_time",
        "time_per_token",
        "seed",
    }
    assert all(isinstance(v, str) for v in attrs.values())
    assert attrs["total_time"] == "2.382s"
    assert attrs["validation_time"] == "5ms"
    assert attrs["queue_time"] == "250ms"
    assert attrs["inference_time"] == "2.125s"
    assert attrs["time_per_token"] == "10.572139ms"  # 2.125 s / 201 tokens, truncated to ns
    assert _parse_rust_duration(str(attrs["time_per_token"])) == pytest.approx(2.125 / 201, abs=1e-9)
    assert attrs["seed"] == "Some(42)"
    assert str(attrs["parameters"]).startswith("GenerateParameters { ")
    assert "max_new_tokens: Some(256)" in str(attrs["parameters"])
    assert not any(k.startswith("gen_ai.") or "token" in k and k != "time_per_token" for k in attrs)

    # Inner spans: generate (infer) -> generate_stream -> validate, schedule -> queued, infer*.
    by_id = {s.context.span_id: s for s in spans}

    def parent_name(span: ReadableSpan) -> str | None:
        return by_id[span.parent.span_id].name if span.parent and span.parent.span_id in by_id else None

    inner_generate = [s for s in spans if s.name == "generate" and s is not handler]
    assert len(inner_generate) == 1 and not inner_generate[0].attributes
    assert parent_name(_only(spans, "generate_stream")) == "generate"
    validate = _only(spans, "validate")
    schedule = _only(spans, "schedule")
    queued = _only(spans, "queued")
    assert parent_name(validate) == parent_name(schedule) == "generate_stream"
    assert parent_name(queued) == "schedule"
    assert (validate.start_time, validate.end_time) == (T0, T0 + _ns(0.005))
    assert (queued.start_time, queued.end_time) == (T0 + _ns(0.005), T0 + _ns(0.255))
    infers = sorted((s for s in spans if s.name == "infer"), key=lambda s: s.start_time or 0)
    assert len(infers) == 4  # one prefill step + 3 decode steps
    assert all(parent_name(s) == "schedule" for s in infers)
    assert (infers[0].start_time, infers[0].end_time) == (T0 + _ns(0.255), T0 + _ns(0.38))
    assert infers[-1].end_time == T0 + _ns(2.38) == schedule.end_time
    assert all(a.end_time == b.start_time for a, b in zip(infers, infers[1:]))
    assert all(s.kind is SpanKind.INTERNAL for s in spans)


def test_tgi_durations_round_trip(exporter: InMemorySpanExporter) -> None:
    timing = RequestTiming(T0, preprocess_s=0.000850, queue_s=0.0123456789, prefill_s=0.03, decode_s=0.7, completion_tokens=7)
    emit_tgi(engine_tracer_provider("tgi", exporter), timing, handler="chat_completions")
    handler = _only(exporter.get_finished_spans(), "chat_completions")
    attrs = dict(handler.attributes or {})
    assert attrs["validation_time"] == "850µs"
    assert attrs["queue_time"] == "12.345679ms"
    assert _parse_rust_duration(str(attrs["total_time"])) == pytest.approx(timing.e2e_s, abs=1e-9)
    assert _parse_rust_duration(str(attrs["inference_time"])) == pytest.approx(timing.inference_s, abs=1e-9)
    assert attrs["seed"] == "None"


def test_tgi_failure_records_no_timing_fields(exporter: InMemorySpanExporter) -> None:
    emit_tgi(engine_tracer_provider("tgi", exporter), TIMING, handler="generate_stream", success=False)
    spans = exporter.get_finished_spans()
    handler = next(s for s in spans if s.name == "generate_stream" and s.parent is None)
    attrs = dict(handler.attributes or {})
    assert set(attrs) == {"parameters"}  # recorded at span creation; the rest only on success
    assert handler.status.status_code is StatusCode.ERROR
    # Streaming has no inner `generate` span.
    assert not any(s.name == "generate" for s in spans)


def test_tgi_completions_has_no_parameters(exporter: InMemorySpanExporter) -> None:
    emit_tgi(engine_tracer_provider("tgi", exporter), TIMING, handler="completions")
    handler = _only(exporter.get_finished_spans(), "completions")
    attrs = dict(handler.attributes or {})
    assert "parameters" not in attrs
    assert attrs["total_time"] == "2.382s"


def test_tgi_unknown_handler_refused(exporter: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError):
        emit_tgi(engine_tracer_provider("tgi", exporter), TIMING, handler="health")


# ------------------------------------------------------------------------------- issue 14 shapes


def _records_of(exporter: InMemorySpanExporter):
    """The emitted spans through otel-llm's adapters and assembly: what a server would make of them."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_llm.processor.llm_metrics.digest import AttributeLimits, DigestSettings, digest_in_process
    from otel_llm.processor.llm_metrics.requests import RecordSettings, records_of_trace
    from otel_llm.pdata.spans import PendingTrace

    settings = DigestSettings(AttributeLimits(128, 4096), 86400.0, ("gen_ai.request.model",), frozenset())
    spans, counts = digest_in_process(encode_spans(exporter.get_finished_spans()), settings)
    assert not counts.malformed
    traces: dict[bytes, PendingTrace] = {}
    for span in spans:
        traces.setdefault(span.trace_id, PendingTrace(span.trace_id, 0.0)).spans[span.span_id] = span
    (trace,) = traces.values()
    malformed: list[str] = []
    records = records_of_trace(trace, RecordSettings(), malformed)
    assert not malformed
    return records


def _segments(record) -> dict[str, float]:
    return {s.name: s.duration_s for s in record.segments}


def test_vllm_next_shape_and_reading(exporter: InMemorySpanExporter) -> None:
    from otel_llm_simulate.emitters import emit_vllm_next

    timing = RequestTiming(arrival_unix_ns=T0, preprocess_s=0.005, queue_s=0.25, prefill_s=0.125, decode_s=0.5,
                           postprocess_s=0.002, prompt_tokens=812, completion_tokens=11)
    emit_vllm_next(engine_tracer_provider("vllm-v1", exporter), timing, model="Qwen/Qwen3-0.6B",
                   request_id="chatcmpl-1", cached_tokens=64)
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat Qwen/Qwen3-0.6B" and span.kind is SpanKind.SERVER
    assert [e.name for e in span.events][:2] == ["token_scheduled", "token_generated"]
    (record,) = _records_of(exporter)
    assert (record.engine_kind, record.model, record.operation_name, record.outcome) == (
        "vllm", "Qwen/Qwen3-0.6B", "chat", "stop")
    assert record.ttft_s == pytest.approx(timing.ttft_s, abs=1e-9)
    assert record.itl_s == pytest.approx([0.05] * 10, abs=1e-9)
    assert record.cached_tokens == 64 and record.completion_tokens == 11


def test_vllm_next_long_answer_has_no_step_latencies(exporter: InMemorySpanExporter) -> None:
    from otel_llm_simulate.emitters import emit_vllm_next

    emit_vllm_next(engine_tracer_provider("vllm-v1", exporter), TIMING, model="m", request_id="r")
    (span,) = exporter.get_finished_spans()
    assert len(span.events) == 128  # the SDK's limit: later steps are not there
    (record,) = _records_of(exporter)
    assert record.itl_s == () and record.ttft_s == pytest.approx(TIMING.ttft_s, abs=1e-9)


@pytest.mark.parametrize("ensemble", [None, "ensemble"])
def test_triton_shape_and_reading(exporter: InMemorySpanExporter, ensemble: str | None) -> None:
    from otel_llm_simulate.emitters import emit_triton

    emit_triton(engine_tracer_provider("triton", exporter), TIMING, ensemble=ensemble)
    spans = exporter.get_finished_spans()
    assert all(s.kind is SpanKind.SERVER and s.instrumentation_scope.name == "triton-server" for s in spans)
    assert len([s for s in spans if s.name == "InferRequest"]) == 1
    (record,) = _records_of(exporter)  # an ensemble is one request
    received = TIMING.preprocess_s / 2
    assert record.engine_kind == "triton" and record.model == (ensemble or "tensorrt_llm")
    assert record.e2e_s == pytest.approx(TIMING.e2e_s - received, abs=1e-9)
    assert record.ttft_s == pytest.approx(TIMING.ttft_s - received, abs=1e-9)
    assert record.queue_s == pytest.approx(TIMING.queue_s, abs=1e-9)
    assert _segments(record)["compute"] == pytest.approx(TIMING.prefill_s + TIMING.decode_s, abs=1e-9)
    assert record.segments_missing == ("prefill", "decode")


def test_trtllm_serve_shape_and_reading(exporter: InMemorySpanExporter) -> None:
    from otel_llm_simulate.emitters import emit_trtllm_serve

    emit_trtllm_serve(engine_tracer_provider("trtllm", exporter), TIMING, request_id="trt-1")
    (record,) = _records_of(exporter)
    assert record.engine_kind == "trtllm" and record.outcome == "stop"
    assert record.ttft_s == pytest.approx(TIMING.queue_s + TIMING.prefill_s)
    assert record.prefill_s == pytest.approx(TIMING.prefill_s) and record.decode_s == pytest.approx(TIMING.decode_s)
    assert record.segments_derived == ("prefill", "decode")


def test_dynamo_disaggregated_is_one_request(exporter: InMemorySpanExporter) -> None:
    from otel_llm_simulate.emitters import emit_dynamo

    providers = [engine_tracer_provider("dynamo", exporter, service_name=name)
                 for name in ("dynamo-frontend", "dynamo-prefill", "dynamo-decode")]
    emit_dynamo(*providers, TIMING, model="Qwen/Qwen3-0.6B", kv_transfer_s=0.005)
    (record,) = _records_of(exporter)
    assert (record.engine_kind, record.model, record.outcome) == ("dynamo", "Qwen/Qwen3-0.6B", "stop")
    assert record.ttft_s == pytest.approx(TIMING.ttft_s + 0.005)
    segments = _segments(record)
    assert segments["kv_transfer"] == pytest.approx(0.005, abs=1e-9)
    assert segments["queue_and_prefill"] == pytest.approx(TIMING.queue_s + TIMING.prefill_s, abs=1e-9)
    assert record.tpot_s == pytest.approx(TIMING.decode_s / (TIMING.completion_tokens - 1))


def test_llmd_disaggregated_is_one_request(exporter: InMemorySpanExporter) -> None:
    from otel_llm_simulate.emitters import emit_llmd

    providers = [engine_tracer_provider(kind, exporter, service_name=name) for kind, name in (
        ("llm-d", "llm-d-epp"), ("llm-d", "llm-d-disagg-sidecar"), ("vllm-v1", "vllm-prefill"),
        ("vllm-v1", "vllm-decode"))]
    emit_llmd(*providers, TIMING, model="meta-llama/Llama-3.1-8B-Instruct", kv_load_s=0.004)
    (record,) = _records_of(exporter)
    assert (record.engine_kind, record.model, record.outcome) == ("llm-d", "meta-llama/Llama-3.1-8B-Instruct", "stop")
    assert record.queue_s == pytest.approx(TIMING.queue_s) and record.prefill_s == pytest.approx(TIMING.prefill_s)
    assert record.decode_s == pytest.approx(TIMING.decode_s)
    assert _segments(record)["kv_transfer"] == pytest.approx(0.004, abs=1e-9)
    assert record.completion_tokens == TIMING.completion_tokens
