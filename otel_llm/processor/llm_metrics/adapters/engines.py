"""Engine adapters: one function per span shape, each reading only the keys it needs.

Facts behind every key: ``shared/research/engine-spans.md``. ``classify`` is the single entry
point; it returns ``None`` for spans that match no adapter (they are passed through, counted).
"""

from __future__ import annotations

import functools

from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.pdata.otlp_view import Span as ViewSpan
from otel_llm.pdata.attributes import AttrMap, attribute_map, get_float, get_int, get_str, get_str_list
from otel_llm.processor.llm_metrics.adapters.durations import parse_rust_duration
from otel_llm.pdata.observation import EngineKind, EngineObservation, MalformedSpan, Part

_LAT = "gen_ai.latency."
# The hot path's keys, spelled once (a global concatenation per lookup costs more than the lookup).
_E2E = _LAT + "e2e"
_TTFT = _LAT + "time_to_first_token"
_QUEUE = _LAT + "time_in_queue"
_PREFILL = _LAT + "time_in_model_prefill"
_DECODE = _LAT + "time_in_model_decode"
_INFERENCE = _LAT + "time_in_model_inference"
VLLM_SPAN_NAME = "llm_request"
TGI_HANDLER_SPANS = frozenset({"generate", "generate_stream", "chat_completions", "completions", "compat_generate"})
_TGI_OPERATION = {"chat_completions": "chat"}
_STATUS_ERROR = Status.STATUS_CODE_ERROR
_SPAN_KIND_SERVER = Span.SPAN_KIND_SERVER
_SPAN_KIND_INTERNAL = Span.SPAN_KIND_INTERNAL

# SGLang 0.5.23 stage spans (RequestStage, req_time_stats.py:106-226; tests/testdata/engines/sglang/README.md).
SGLANG_STAGES = frozenset({
    "tokenize", "api_server_dispatch", "dpc_dispatch", "request_process", "prefill_waiting", "prefill_forward",
    "chunked_prefill", "decode_waiting", "decode_forward", "decode_loop", "prefill_prepare", "prefill_bootstrap",
    "prefill_transfer_kv_cache", "decode_prepare", "decode_bootstrap", "decode_transferred", "fake_output",
    "quick_finish"})
# Triton (server src/tracer.cc @ e1db8a60): the request root and a model's compute child, both SERVER.
TRITON_ROOT = "InferRequest"
TRITON_COMPUTE = "compute"
TRITON_ROOT_EVENTS = frozenset({"HTTP_RECV_END", "GRPC_WAITREAD_END"})
TRITON_MODEL_EVENTS = frozenset({"REQUEST_START", "QUEUE_START", "REQUEST_END"})
TRITON_COMPUTE_EVENTS = frozenset({"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"})
# Dynamo (lib/runtime/src/logging.rs @ b4d7ad45): the frontend's root and a worker's engine span.
DYNAMO_ROOT = "http-request"
DYNAMO_WORKER = "engine.generate"
# llm-d (llm-d-router @ ebab6879): the P/D sidecar's request span and its prefill/decode spans.
LLMD_FORWARD = "forward_request"
LLMD_PROXY_SPANS = {"prefill": "prefill", "decode": "decode", "llm_d.pd_proxy.prefill": "prefill",
                    "llm_d.pd_proxy.decode": "decode"}
LLMD_ORCHESTRATION = "gateway.request_orchestration"
# trtllm-serve's keys beside vLLM's (tensorrt_llm/llmapi/tracing.py @ 0fb7f758); vLLM's own phase keys.
_TRTLLM_KV = _LAT + "kv_cache_transfer_time"
_VLLM_PHASE_KEYS = tuple(_LAT + k for k in ("time_in_model_prefill", "time_in_model_inference",
                                            "time_in_model_decode", "time_in_scheduler", "time_in_model_forward",
                                            "time_in_model_execute"))
NOT_MEASURED = -1.0  # trtllm-serve's value for a metric it did not get (PR NVIDIA/TensorRT-LLM#5897)
VLLM_EVENT_LIMIT = 128  # the OTel SDK's default span event limit: past it, token events are dropped


def _number(attrs: AttrMap, key: str) -> float | None:
    try:
        return get_float(attrs, key)
    except ValueError as exc:
        raise MalformedSpan("non_numeric_latency", str(exc)) from None


def _count(attrs: AttrMap, key: str) -> int | None:
    try:
        return get_int(attrs, key)
    except ValueError as exc:
        raise MalformedSpan("non_integer_tokens", str(exc)) from None


def _first(attrs: AttrMap, *keys: str) -> str | None:
    for key in keys:
        if key not in attrs:
            continue
        value = get_str(attrs, key)
        if value:
            return value
    return None


def _error_of(span: Span, attrs: AttrMap) -> tuple[bool, str | None]:
    if span.status.code != _STATUS_ERROR:
        return False, None
    return True, get_str(attrs, "error.type") or _exception_type(span) or "_OTHER"


def _exception_type(span: Span) -> str | None:
    """The class name of the last ``exception`` event's ``exception.type`` (Logfire records
    ``openai.RateLimitError`` there and sets no ``error.type``): ``RateLimitError``, the name the
    official openai-v2 instrumentation and Logfire's own streaming span give ``error.type``."""
    for event in reversed(span.events):
        if event.name == "exception":
            for kv in event.attributes:
                if kv.key == "exception.type" and kv.value.string_value:
                    return kv.value.string_value.rsplit(".", 1)[-1]
    return None


def _token_events(span: Span) -> tuple[float | None, tuple[float, ...]]:
    """vllm#32573's ``token_generated`` events: (exact TTFT, per-step ITLs); (None, ()) without them.

    One event per engine step that produced tokens; the first is the first token. Past the SDK's event
    limit the later ones are dropped, so the per-step latencies are only taken from a complete span."""
    events = span.events
    generated = [e.time_unix_nano for e in events if e.name == "token_generated"]
    if not generated:
        if any(e.name == "token_scheduled" for e in events):
            raise MalformedSpan("missing_event", "token_scheduled events without token_generated")
        return None, ()
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    previous = start
    for time_ns in generated:
        if time_ns < previous:
            raise MalformedSpan("out_of_order_events", "token_generated events not in time order")
        previous = time_ns
    if end and previous > end:
        raise MalformedSpan("out_of_order_events", "a token_generated event after the span's end")
    ttft = (generated[0] - start) / 1e9
    if span.dropped_events_count or len(events) >= VLLM_EVENT_LIMIT:
        return ttft, ()
    return ttft, tuple((b - a) / 1e9 for a, b in zip(generated, generated[1:]))


_FINISH_CACHE: dict[str, str | None] = {}  # finish_reasons text -> first reason: a handful of distinct values


def _finish_reason(attrs: AttrMap) -> str | None:
    """The first of ``gen_ai.response.finish_reasons``, an array or a JSON string (vLLM main writes
    ``'["stop"]'``); JSON strings are parsed once per distinct text."""
    value = attrs.get("gen_ai.response.finish_reasons")
    if value is None:
        return None
    kind = value.WhichOneof("value")
    if kind == "array_value":  # the first string of the array, without a list of them all
        for item in value.array_value.values:
            if item.WhichOneof("value") == "string_value":
                return item.string_value
        return None
    if kind == "string_value":
        text = value.string_value
        if text in _FINISH_CACHE:
            return _FINISH_CACHE[text]
        reasons = get_str_list(attrs, "gen_ai.response.finish_reasons")
        first = reasons[0] if reasons else None
        if len(_FINISH_CACHE) < 256 and len(text) <= 64:
            _FINISH_CACHE[text] = first
        return first
    reasons = get_str_list(attrs, "gen_ai.response.finish_reasons")
    return reasons[0] if reasons else None


def _vllm(span: Span, attrs: AttrMap) -> EngineObservation:
    is_error, error_type = _error_of(span, attrs)
    inference = _number(attrs, _INFERENCE)
    prefill = _number(attrs, _PREFILL)
    v1 = prefill is not None or inference is not None
    ttft = _number(attrs, _TTFT)
    itl: tuple[float, ...] = ()
    if span.events:
        event_ttft, itl = _token_events(span)
        if event_ttft is not None:
            ttft = event_ttft
    # vllm#40799 renames the token keys; the old ones stay accepted. Guarded lookups: this is the hot path.
    prompt = _count(attrs, "gen_ai.usage.prompt_tokens")
    if prompt is None:
        prompt = _count(attrs, "gen_ai.usage.input_tokens")
    completion = _count(attrs, "gen_ai.usage.completion_tokens")
    if completion is None:
        completion = _count(attrs, "gen_ai.usage.output_tokens")
    cached, written, spec, spec_problem = _cache_and_spec(attrs)
    return EngineObservation(
        engine_kind=EngineKind.VLLM,
        adapter="vllm_v1" if v1 else "vllm_v0",
        ttft_s=ttft,
        e2e_s=_number(attrs, _E2E),
        queue_s=_number(attrs, _QUEUE),
        prefill_s=prefill,
        decode_s=_number(attrs, _DECODE),
        inference_s=inference,
        prompt_tokens=prompt,
        completion_tokens=completion,
        max_tokens=_count(attrs, "gen_ai.request.max_tokens"),
        request_model=get_str(attrs, "gen_ai.request.model") if "gen_ai.request.model" in attrs else None,
        response_model=get_str(attrs, "gen_ai.response.model") if "gen_ai.response.model" in attrs else None,
        finish_reason=_finish_reason(attrs) if "gen_ai.response.finish_reasons" in attrs else None,
        operation_name=get_str(attrs, "gen_ai.operation.name") if "gen_ai.operation.name" in attrs else None,
        provider_name="vllm",
        server_address=get_str(attrs, "server.address") if "server.address" in attrs else None,
        server_port=get_str(attrs, "server.port") if "server.port" in attrs else None,
        is_error=is_error,
        error_type=error_type,
        cached_tokens=cached,
        cache_write_tokens=written,
        spec_decode=spec,
        spec_decode_rejected=spec_problem,
        itl_s=itl,
    )


def _is_trtllm(attrs: AttrMap) -> bool:
    """trtllm-serve's key set: its KV-transfer key, or vLLM's latency keys without any of vLLM's phases."""
    if _TRTLLM_KV in attrs:
        return True
    return (_LAT + "time_in_queue") in attrs and not any(key in attrs for key in _VLLM_PHASE_KEYS)


def _measured(attrs: AttrMap, key: str) -> float | None:
    value = _number(attrs, key)
    return None if value == NOT_MEASURED else value


def _trtllm(span: Span, attrs: AttrMap) -> EngineObservation:
    """trtllm-serve (FACTS.md): ttft, e2e, queue measured (−1 = not measured); prefill and decode only
    derivable (prefill = ttft − queue includes the frontend's overhead)."""
    is_error, error_type = _error_of(span, attrs)
    ttft = _measured(attrs, _LAT + "time_to_first_token")
    e2e = _measured(attrs, _LAT + "e2e")
    queue = _measured(attrs, _LAT + "time_in_queue")
    kv = _measured(attrs, _TRTLLM_KV)
    if e2e is None:
        raise MalformedSpan("not_measured", "trtllm-serve span without a measured gen_ai.latency.e2e")
    reasons = get_str_list(attrs, "gen_ai.response.finish_reasons")
    prefill = ttft - queue if ttft is not None and queue is not None else None
    decode = e2e - ttft if ttft is not None else None
    # A negative derived prefill or decode is not measurable for this request (derive_timings), not malformed.
    return EngineObservation(
        engine_kind=EngineKind.TRTLLM,
        adapter="trtllm",
        ttft_s=ttft,
        e2e_s=e2e,
        queue_s=queue,
        prefill_s=prefill,
        decode_s=decode,
        prompt_tokens=_first_count(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
        completion_tokens=_first_count(attrs, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
        max_tokens=_count(attrs, "gen_ai.request.max_tokens"),
        request_model=get_str(attrs, "gen_ai.request.model"),
        response_model=get_str(attrs, "gen_ai.response.model"),
        finish_reason=reasons[0] if reasons else None,
        provider_name="trtllm",
        is_error=is_error,
        error_type=error_type,
        marks=("kv_transfer_s", kv) if kv is not None else (),
        derived=tuple(name for name, value in (("prefill", prefill), ("decode", decode)) if value is not None),
    )


def _event_marks(span: Span, names: frozenset[str]) -> tuple:
    marks: list = []
    for e in span.events:
        if e.name in names and e.name not in marks[::2]:
            marks += (e.name, e.time_unix_nano)
    return tuple(marks)


def _triton_root(span: Span) -> EngineObservation:
    """Triton's ``InferRequest``: e2e is its duration; the rest is read from its models at assembly."""
    marks = list(_event_marks(span, TRITON_ROOT_EVENTS))
    responses = [e.time_unix_nano for e in span.events if e.name == "INFER_RESPONSE_COMPLETE"]
    if responses:
        marks += ("first_response", min(responses), "responses", len(responses))
    is_error = span.status.code == _STATUS_ERROR
    return EngineObservation(
        engine_kind=EngineKind.TRITON, adapter="triton", provider_name="triton",
        e2e_s=_span_duration(span), is_error=is_error, error_type="_OTHER" if is_error else None,
        marks=tuple(marks))


def _span_duration(span: Span) -> float | None:
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if start <= 0 or end < start:
        raise MalformedSpan("invalid_span_times", f"{span.name}: end before start")
    return (end - start) / 1e9


def _dynamo_root(span: Span, attrs: AttrMap) -> EngineObservation:
    """Dynamo's frontend ``http-request``: ``ttft_ms``/``avg_itl_ms`` in milliseconds, tokens, model, outcome."""
    ttft_ms = _number(attrs, "ttft_ms")
    itl_ms = _number(attrs, "avg_itl_ms")
    outcome = get_str(attrs, "request.outcome")
    is_error, error_type = _error_of(span, attrs)
    return EngineObservation(
        engine_kind=EngineKind.DYNAMO, adapter="dynamo", provider_name="dynamo",
        ttft_s=ttft_ms / 1000.0 if ttft_ms is not None else None,
        e2e_s=_span_duration(span),
        tpot_s=itl_ms / 1000.0 if itl_ms is not None else None,
        prompt_tokens=_count(attrs, "input_tokens"), completion_tokens=_count(attrs, "output_tokens"),
        request_model=get_str(attrs, "model"),
        finish_reason="cancelled" if outcome == "cancelled" else None,
        is_error=is_error, error_type=error_type,
        marks=tuple(item for key in ("prefill_worker_id", "decode_worker_id") if key in attrs
                    for item in (key, get_str(attrs, key))))


def _dynamo_worker(attrs: AttrMap) -> EngineObservation:
    ttft_ms = _number(attrs, "ttft_ms")
    return EngineObservation(
        engine_kind=EngineKind.DYNAMO, adapter="dynamo_worker", part=Part.DYNAMO_WORKER,
        marks=("role", get_str(attrs, "disagg_role"), "ttft_s", ttft_ms / 1000.0 if ttft_ms is not None else None,
               "finish_reason", get_str(attrs, "finish_reason")))


def _is_true(attrs: AttrMap, key: str) -> bool:
    value = attrs.get(key)
    return value is not None and (value.bool_value or value.string_value == "true")


def _sglang(span: Span, attrs: AttrMap) -> EngineObservation:
    is_error, error_type = _error_of(span, attrs)
    finish = _finish_reason(attrs)
    ttft = _number(attrs, _LAT + "time_to_first_token")
    decode = _number(attrs, _LAT + "time_in_model_decode")
    completion = _first_count(attrs, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
    if decode == 0 and completion is not None and completion > 1:
        # Non-streaming without --enable-metrics: SGLang's "first token" is the final output (ttft == e2e).
        ttft = decode = None
    # SGLang's time_in_model_prefill runs from the hand-off to the scheduler to the first output: it holds
    # the scheduler queue, so it is neither a prefill nor (with inference) a running time. Assembly reads
    # queue/prefill/decode from the stage spans, or reports them missing.
    dispatch_to_first = _number(attrs, _LAT + "time_in_model_prefill")
    return EngineObservation(
        engine_kind=EngineKind.SGLANG,
        adapter="sglang",
        ttft_s=ttft,
        e2e_s=_number(attrs, _LAT + "e2e"),
        queue_s=_number(attrs, _LAT + "time_in_queue"),  # declared by SGLang but never set today
        decode_s=decode,
        prompt_tokens=_first_count(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
        completion_tokens=completion,
        cached_tokens=_count(attrs, "gen_ai.usage.cached_tokens"),
        marks=("dispatch_to_first_token_s", dispatch_to_first) if dispatch_to_first is not None else (),
        max_tokens=_count(attrs, "gen_ai.request.max_tokens"),
        request_model=get_str(attrs, "gen_ai.request.model"),
        response_model=get_str(attrs, "gen_ai.response.model"),
        finish_reason=finish,
        provider_name="sglang",
        is_error=is_error,
        error_type=error_type,
    )


def _tgi_duration(attrs: AttrMap, key: str) -> float | None:
    text = get_str(attrs, key)
    if text is None:
        return None
    try:
        return parse_rust_duration(text)
    except ValueError as exc:
        raise MalformedSpan("unparsable_duration", f"{key}: {exc}") from None


def _tgi(span: Span, attrs: AttrMap) -> EngineObservation | None:
    total = _tgi_duration(attrs, "total_time")
    is_error, error_type = _error_of(span, attrs)
    if total is None and not is_error:
        # TGI records its fields only on success; the inner infer spans share these names and carry none.
        return None
    inference = _tgi_duration(attrs, "inference_time")
    return EngineObservation(
        engine_kind=EngineKind.TGI,
        adapter="tgi",
        e2e_s=total,
        preprocess_s=_tgi_duration(attrs, "validation_time"),
        queue_s=_tgi_duration(attrs, "queue_time"),
        inference_s=inference,
        operation_name=_TGI_OPERATION.get(span.name, "text_completion"),
        provider_name="tgi",
        is_error=is_error or total is None,
        error_type=error_type or ("_OTHER" if total is None else None),
    )


def _genai(span: Span, attrs: AttrMap) -> EngineObservation:
    is_error, error_type = _error_of(span, attrs)
    finish = _finish_reason(attrs)
    cached, written, spec, spec_problem = _cache_and_spec(attrs)
    return EngineObservation(
        engine_kind=EngineKind.GENAI,
        adapter="genai",
        # A client's time to first chunk (semconv v1.41, LiteLLM's V2 logger); the older server-named
        # attribute some gateways (and, from the client, OpenLLMetry) write otherwise.
        ttft_s=_first_number(attrs, "gen_ai.response.time_to_first_chunk", "gen_ai.server.time_to_first_token"),
        prompt_tokens=_first_count(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
        completion_tokens=_first_count(attrs, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
        max_tokens=_count(attrs, "gen_ai.request.max_tokens") if "gen_ai.request.max_tokens" in attrs else None,
        request_model=get_str(attrs, "gen_ai.request.model") if "gen_ai.request.model" in attrs else None,
        response_model=get_str(attrs, "gen_ai.response.model") if "gen_ai.response.model" in attrs else None,
        finish_reason=finish,
        operation_name=_genai_operation(attrs),
        provider_name=_first(attrs, "gen_ai.provider.name", "gen_ai.system"),
        server_address=get_str(attrs, "server.address") if "server.address" in attrs else None,
        server_port=get_str(attrs, "server.port") if "server.port" in attrs else None,
        is_error=is_error,
        error_type=error_type,
        may_be_gateway=True,
        cached_tokens=cached,
        cache_write_tokens=written,
        spec_decode=spec,
        spec_decode_rejected=spec_problem,
        # Reasoning tokens: the same key in semconv v1.41.0 and genai v0.1.0 (research/genai-semconv.md §2a-2b).
        reasoning_tokens=_first_count(attrs, "gen_ai.usage.reasoning.output_tokens"),
    )


# Traceloop's own key, on OpenLLMetry releases before gen_ai.operation.name (0.54: "chat", "completion",
# "embedding", "rerank"; opentelemetry-semantic-conventions-ai LLMRequestTypeValues), as semconv names.
_TRACELOOP_REQUEST_TYPES = {"chat": "chat", "completion": "text_completion", "embedding": "embeddings"}


def _genai_operation(attrs: AttrMap) -> str | None:
    if "gen_ai.operation.name" in attrs:
        return get_str(attrs, "gen_ai.operation.name")
    if "llm.request.type" in attrs:
        return _TRACELOOP_REQUEST_TYPES.get(get_str(attrs, "llm.request.type") or "")
    return None


def _first_number(attrs: AttrMap, *keys: str) -> float | None:
    for key in keys:  # a loop, not a generator: this runs for every GenAI span
        if key in attrs:
            value = _number(attrs, key)
            if value is not None:
                return value
    return None


def _first_count(attrs: AttrMap, *keys: str) -> int | None:
    for key in keys:
        if key in attrs:
            value = _count(attrs, key)
            if value is not None:
                return value
    return None


# Cache reads and writes on a span, first key present wins. Reads: semconv v1.41 (written by
# opentelemetry-instrumentation-openai-v2 2.4b0 response_extractors.py:371-374, OpenLLMetry 0.62.4
# openai/shared/__init__.py:285-290, LiteLLM 1.110 gen_ai_semconv.py:77-80, Logfire 5.4 semconv.py:75;
# vllm#40799/#54476 on the engine span). Writes: semconv v1.41's cache_creation (same emitters) and the
# genai repo's rename cache_write (genai #440).
CACHE_READ_KEYS = ("gen_ai.usage.cache_read.input_tokens",)
CACHE_WRITE_KEYS = ("gen_ai.usage.cache_creation.input_tokens", "gen_ai.usage.cache_write.input_tokens")
# vLLM's per-request speculative-decoding object (response ``metrics.speculative_decoding``, vllm PR #48915;
# RequestSpecDecodeMetrics.to_dict, vllm/v1/metrics/stats.py @ 0.32.0), read where a span carries it
# under the vendor prefix ``vllm.``. No emitter in reach writes it on a span yet (vLLM 0.32 returns it
# in the response body only).
SPEC_DECODE_PREFIX = "vllm.metrics.speculative_decoding."
_SPEC_ACCEPTED = SPEC_DECODE_PREFIX + "num_accepted_draft_tokens"
_SPEC_DRAFT = SPEC_DECODE_PREFIX + "num_draft_tokens"
_SPEC_STEPS = SPEC_DECODE_PREFIX + "num_spec_steps"


def _cache_and_spec(attrs: AttrMap) -> tuple[int | None, int | None, tuple[int, int, int] | None, str | None]:
    """(cache reads, cache writes, speculative decoding, why speculative decoding was not taken) a span
    reports; None for what it does not say.

    Speculative decoding counts only when all three numbers are there and consistent: accepted
    draft tokens never exceed proposed ones. Otherwise only it is dropped (a rejected value, counted
    at assembly): the request's latencies and its join do not depend on an optional extra."""
    read = _first_count(attrs, *CACHE_READ_KEYS)
    write = _first_count(attrs, *CACHE_WRITE_KEYS)
    if not any(key in attrs for key in (_SPEC_ACCEPTED, _SPEC_DRAFT, _SPEC_STEPS)):
        return read, write, None, None
    accepted, draft, steps = _count(attrs, _SPEC_ACCEPTED), _count(attrs, _SPEC_DRAFT), _count(attrs, _SPEC_STEPS)
    if accepted is None or draft is None or steps is None:
        return read, write, None, "incomplete_spec_decode"
    if accepted < 0 or draft < 0 or steps < 0 or accepted > draft:
        return read, write, None, "inconsistent_spec_decode"
    return read, write, (accepted, draft, steps), None


# GenAI semconv span names are "{gen_ai.operation.name} {model}".
GENAI_OPERATIONS = frozenset({"chat", "text_completion", "embeddings", "generate_content", "execute_tool",
                              "invoke_agent", "create_agent", "invoke_workflow", "retrieval"})
_NO_ATTRS: AttrMap = {}
# LiteLLM's legacy OTel logger (litellm/integrations/opentelemetry.py, 1.110): an INTERNAL span with
# gen_ai.* attributes; its child raw_gen_ai_request carries only llm.<provider>.* (no adapter reads it).
LITELLM_SPAN_NAMES = frozenset({"litellm_request"})


# Logfire's openai-agents LLM spans (INTERNAL; their names are Logfire's message templates,
# logfire/_internal/integrations/openai_agents.py @ 5.4.0: "Responses API with {gen_ai.request.model!r}",
# "Chat completion with {gen_ai.request.model!r}"): client calls, counted like any GenAI client span.
LOGFIRE_AGENT_LLM_PREFIXES = ("Responses API", "Chat completion with ")


_INTERNAL_NAMES = frozenset({VLLM_SPAN_NAME, *TGI_HANDLER_SPANS, *LITELLM_SPAN_NAMES, *SGLANG_STAGES, DYNAMO_ROOT,
                             DYNAMO_WORKER, *LLMD_PROXY_SPANS})


def _may_be_llm(span: Span, name: str) -> bool:
    """Cheap test on name and kind, so the attributes of plain application spans are never read."""
    return may_be_llm(span.kind, name)


def may_be_llm(kind: int, name: str) -> bool:
    """``classify``'s first test, on a span's kind and name alone: ``False`` means ``classify``
    returns ``(None, no attributes)`` without reading anything else (the compiled core's callers
    then never parse the span)."""
    if kind in (_SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT):
        return True  # engines' request spans, gateways, GenAI client calls
    return (name in _INTERNAL_NAMES or " Req " in name or name.split(" ", 1)[0] in GENAI_OPERATIONS
            or name.startswith(LOGFIRE_AGENT_LLM_PREFIXES))


def _part(kind: str, adapter: str, part: str, marks: tuple) -> EngineObservation:
    return EngineObservation(engine_kind=kind, adapter=adapter, part=part, marks=marks)


@functools.cache  # bounded: called only for the names of SGLANG_STAGES
def sglang_stage_observation(name: str) -> EngineObservation:
    """One observation per SGLang stage, shared by every buffered span of that stage (~300 B each
    otherwise); nothing changes an observation once its adapter made it."""
    return _part(EngineKind.SGLANG, "sglang_stage", Part.SGLANG_STAGE, ("stage", name))


def classify(span: Span) -> tuple[EngineObservation | None, AttrMap]:
    """The adapter's reading of ``span``, or ``None`` when no adapter claims it.

    Raises ``MalformedSpan`` when an adapter claims the span but its values are unusable.
    """
    name = span.name
    if not _may_be_llm(span, name):
        return None, _NO_ATTRS
    kind = span.kind
    if kind == _SPAN_KIND_INTERNAL and name in SGLANG_STAGES:
        # No attribute is read: the stage's name and interval are what assembly needs.
        return sglang_stage_observation(name), _NO_ATTRS
    # The adapter stage reads spans through ``otlp_view``, whose attributes are already a map.
    attrs = span.attributes if type(span) is ViewSpan else attribute_map(span.attributes)
    if name == VLLM_SPAN_NAME and kind == _SPAN_KIND_SERVER:
        if _E2E not in attrs:
            raise MalformedSpan("missing_latency", "llm_request span without gen_ai.latency.e2e")
        if _INFERENCE not in attrs and _is_trtllm(attrs):
            return _trtllm(span, attrs), attrs
        return _vllm(span, attrs), attrs
    if name in TGI_HANDLER_SPANS and "gen_ai.latency.e2e" not in attrs:
        return _tgi(span, attrs), attrs
    if _E2E in attrs:
        if kind == _SPAN_KIND_SERVER:
            # vLLM under any name (vllm#47633 "{operation} {model}"), by its attributes.
            if _INFERENCE in attrs or _PREFILL in attrs:
                return _vllm(span, attrs), attrs
            if _is_trtllm(attrs):
                return _trtllm(span, attrs), attrs
            if "gen_ai.operation.name" in attrs:
                return _vllm(span, attrs), attrs  # vllm#47633's attributes, whatever latencies it has
        return _sglang(span, attrs), attrs
    if get_str(attrs, "module") == "sglang::request":
        return _sglang(span, attrs), attrs
    if kind == _SPAN_KIND_SERVER:
        if "triton.model_name" in attrs:
            marks = ("model", get_str(attrs, "triton.model_name"),
                     "parent_id", get_str(attrs, "triton.trace_parent_id"),
                     *_event_marks(span, TRITON_MODEL_EVENTS))
            return _part(EngineKind.TRITON, "triton_model", Part.TRITON_MODEL, marks), attrs
        if name == TRITON_ROOT:
            return _triton_root(span), attrs
        if name == TRITON_COMPUTE and not attrs and span.events:
            marks = _event_marks(span, TRITON_COMPUTE_EVENTS)
            if marks:
                return _part(EngineKind.TRITON, "triton_compute", Part.TRITON_COMPUTE, marks), attrs
        if name == LLMD_FORWARD and _is_true(attrs, "llm_d.pd_proxy.disaggregation_used"):
            return EngineObservation(engine_kind=EngineKind.LLM_D, adapter="llm-d"), attrs
        if name == LLMD_ORCHESTRATION and "target_model" in attrs:
            return _part(EngineKind.LLM_D, "llm-d_orchestration", Part.LLMD_ORCHESTRATION,
                         ("target_model", get_str(attrs, "target_model"))), attrs
    elif kind == _SPAN_KIND_INTERNAL:
        if name == DYNAMO_ROOT and ("ttft_ms" in attrs or "request.outcome" in attrs):
            return _dynamo_root(span, attrs), attrs
        if name == DYNAMO_WORKER and "disagg_role" in attrs:
            return _dynamo_worker(attrs), attrs
        role = LLMD_PROXY_SPANS.get(name)
        if role is not None and "llm_d.pd_proxy.connector" in attrs:
            return _part(EngineKind.LLM_D, "llm-d_proxy", Part.LLMD_PROXY, ("role", role)), attrs
    if "gen_ai.operation.name" in attrs or "gen_ai.request.model" in attrs or "gen_ai.response.model" in attrs:
        return _genai(span, attrs), attrs
    return None, attrs
