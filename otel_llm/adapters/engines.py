"""Engine adapters: one function per span shape, each reading only the keys it needs.

Facts behind every key: ``shared/research/engine-spans.md``. ``classify`` is the single entry
point; it returns ``None`` for spans that match no adapter (they are passed through, counted).
"""

from __future__ import annotations


from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.adapters.attributes import AttrMap, attribute_map, get_float, get_int, get_str, get_str_list
from otel_llm.adapters.durations import parse_rust_duration
from otel_llm.adapters.observation import EngineKind, EngineObservation, MalformedSpan

_LAT = "gen_ai.latency."
VLLM_SPAN_NAME = "llm_request"
TGI_HANDLER_SPANS = frozenset({"generate", "generate_stream", "chat_completions", "completions", "compat_generate"})
_TGI_OPERATION = {"chat_completions": "chat"}
_STATUS_ERROR = Status.STATUS_CODE_ERROR
_SPAN_KIND_SERVER = Span.SPAN_KIND_SERVER


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
        value = get_str(attrs, key)
        if value:
            return value
    return None


def _error_of(span: Span, attrs: AttrMap) -> tuple[bool, str | None]:
    if span.status.code != _STATUS_ERROR:
        return False, None
    return True, get_str(attrs, "error.type") or "_OTHER"


def _vllm(span: Span, attrs: AttrMap) -> EngineObservation:
    is_error, error_type = _error_of(span, attrs)
    inference = _number(attrs, _LAT + "time_in_model_inference")
    prefill = _number(attrs, _LAT + "time_in_model_prefill")
    v1 = prefill is not None or inference is not None
    return EngineObservation(
        engine_kind=EngineKind.VLLM,
        adapter="vllm_v1" if v1 else "vllm_v0",
        ttft_s=_number(attrs, _LAT + "time_to_first_token"),
        e2e_s=_number(attrs, _LAT + "e2e"),
        queue_s=_number(attrs, _LAT + "time_in_queue"),
        prefill_s=prefill,
        decode_s=_number(attrs, _LAT + "time_in_model_decode"),
        inference_s=inference,
        prompt_tokens=_count(attrs, "gen_ai.usage.prompt_tokens"),
        completion_tokens=_count(attrs, "gen_ai.usage.completion_tokens"),
        max_tokens=_count(attrs, "gen_ai.request.max_tokens"),
        request_model=get_str(attrs, "gen_ai.request.model"),
        response_model=get_str(attrs, "gen_ai.response.model"),
        provider_name="vllm",
        server_address=get_str(attrs, "server.address"),
        server_port=get_str(attrs, "server.port"),
        is_error=is_error,
        error_type=error_type,
    )


def _sglang(span: Span, attrs: AttrMap) -> EngineObservation:
    is_error, error_type = _error_of(span, attrs)
    reasons = get_str_list(attrs, "gen_ai.response.finish_reasons")
    finish = reasons[0] if reasons else None
    if finish == "abort" and not is_error:
        is_error, error_type = False, None
    return EngineObservation(
        engine_kind=EngineKind.SGLANG,
        adapter="sglang",
        ttft_s=_number(attrs, _LAT + "time_to_first_token"),
        e2e_s=_number(attrs, _LAT + "e2e"),
        queue_s=_number(attrs, _LAT + "time_in_queue"),  # declared by SGLang but never set today
        prefill_s=_number(attrs, _LAT + "time_in_model_prefill"),
        decode_s=_number(attrs, _LAT + "time_in_model_decode"),
        inference_s=_number(attrs, _LAT + "time_in_model_inference"),
        prompt_tokens=_count(attrs, "gen_ai.usage.prompt_tokens"),
        completion_tokens=_count(attrs, "gen_ai.usage.completion_tokens"),
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
    reasons = get_str_list(attrs, "gen_ai.response.finish_reasons")
    return EngineObservation(
        engine_kind=EngineKind.GENAI,
        adapter="genai",
        # A client's time to first chunk (semconv v1.41, LiteLLM's V2 logger); the older server-named
        # attribute some gateways (and, from the client, OpenLLMetry) write otherwise.
        ttft_s=_first_number(attrs, "gen_ai.response.time_to_first_chunk", "gen_ai.server.time_to_first_token"),
        prompt_tokens=_first_count(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
        completion_tokens=_first_count(attrs, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
        max_tokens=_count(attrs, "gen_ai.request.max_tokens"),
        request_model=get_str(attrs, "gen_ai.request.model"),
        response_model=get_str(attrs, "gen_ai.response.model"),
        finish_reason=reasons[0] if reasons else None,
        operation_name=get_str(attrs, "gen_ai.operation.name"),
        provider_name=_first(attrs, "gen_ai.provider.name", "gen_ai.system"),
        server_address=get_str(attrs, "server.address"),
        server_port=get_str(attrs, "server.port"),
        is_error=is_error,
        error_type=error_type,
        may_be_gateway=True,
    )


def _first_number(attrs: AttrMap, *keys: str) -> float | None:
    return next((value for value in (_number(attrs, key) for key in keys) if value is not None), None)


def _first_count(attrs: AttrMap, *keys: str) -> int | None:
    return next((value for value in (_count(attrs, key) for key in keys) if value is not None), None)


# GenAI semconv span names are "{gen_ai.operation.name} {model}".
GENAI_OPERATIONS = frozenset({"chat", "text_completion", "embeddings", "generate_content", "execute_tool",
                              "invoke_agent", "create_agent", "invoke_workflow", "retrieval"})
_NO_ATTRS: AttrMap = {}
# LiteLLM's legacy OTel logger (litellm/integrations/opentelemetry.py, 1.110): an INTERNAL span with
# gen_ai.* attributes; its child raw_gen_ai_request carries only llm.<provider>.* (no adapter reads it).
LITELLM_SPAN_NAMES = frozenset({"litellm_request"})


def _may_be_llm(span: Span, name: str) -> bool:
    """Cheap test on name and kind, so the attributes of plain application spans are never read."""
    if span.kind in (_SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT):
        return True  # engines' request spans, gateways, GenAI client calls
    return (name == VLLM_SPAN_NAME or name in TGI_HANDLER_SPANS or " Req " in name or name in LITELLM_SPAN_NAMES
            or name.split(" ", 1)[0] in GENAI_OPERATIONS)


def classify(span: Span) -> tuple[EngineObservation | None, AttrMap]:
    """The adapter's reading of ``span``, or ``None`` when no adapter claims it.

    Raises ``MalformedSpan`` when an adapter claims the span but its values are unusable.
    """
    name = span.name
    if not _may_be_llm(span, name):
        return None, _NO_ATTRS
    attrs = attribute_map(span.attributes)
    if name == VLLM_SPAN_NAME and span.kind == _SPAN_KIND_SERVER:
        if (_LAT + "e2e") not in attrs:
            raise MalformedSpan("missing_latency", "llm_request span without gen_ai.latency.e2e")
        return _vllm(span, attrs), attrs
    if name in TGI_HANDLER_SPANS and "gen_ai.latency.e2e" not in attrs:
        return _tgi(span, attrs), attrs
    if (_LAT + "e2e") in attrs or get_str(attrs, "module") == "sglang::request":
        return _sglang(span, attrs), attrs
    if "gen_ai.operation.name" in attrs or "gen_ai.request.model" in attrs or "gen_ai.response.model" in attrs:
        return _genai(span, attrs), attrs
    return None, attrs


