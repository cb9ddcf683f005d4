"""Engine adapters: the shape table (``shapes.py``) read in Python, and the few shapes read by
functions of their own (their numbers are in events, or spread over a request's spans).

``classify`` is the single entry point; it returns ``None`` for spans that match no shape (they
are passed through, counted). The native engine compiles the same table (``rust/engine/src/shapes.rs``)
and hands the spans of ``python_reading`` shapes to the functions here.
Facts behind every key: ``shared/research/engine-spans.md``, ``tests/testdata/engines/FACTS.md``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.pdata.attributes import AttrMap, attribute_map, get_float, get_int, get_str, get_str_list
from otel_llm.pdata.observation import EngineKind, EngineObservation, MalformedSpan, Part
from otel_llm.pdata.otlp_view import Span as ViewSpan
from otel_llm.processor.llm_metrics.adapters import shapes
from otel_llm.processor.llm_metrics.adapters.durations import parse_rust_duration
from otel_llm.processor.llm_metrics.adapters.shapes import (
    CANDIDATES, GENAI_OPERATIONS, LOGFIRE_AGENT_LLM_PREFIXES, RULES, SGLANG_STAGES, SHAPES, SPEC_DECODE_KEYS,
    TGI_HANDLER_SPANS, VLLM_EVENT_LIMIT, VLLM_SPAN_NAME, Read, Rule, Shape)

__all__ = ["GENAI_OPERATIONS", "LOGFIRE_AGENT_LLM_PREFIXES", "SGLANG_STAGES", "TGI_HANDLER_SPANS", "VLLM_SPAN_NAME",
           "classify", "may_be_llm", "sglang_stage_observation"]

_LAT = "gen_ai.latency."
_STATUS_ERROR = Status.STATUS_CODE_ERROR
TRITON_ROOT_EVENTS = frozenset({"HTTP_RECV_END", "GRPC_WAITREAD_END"})
TRITON_MODEL_EVENTS = frozenset({"REQUEST_START", "QUEUE_START", "REQUEST_END"})
TRITON_COMPUTE_EVENTS = frozenset({"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"})
NOT_MEASURED = -1.0  # trtllm-serve's value for a metric it did not get (PR NVIDIA/TensorRT-LLM#5897)
_NO_ATTRS: AttrMap = {}

# The names ``may_be_llm`` lets through for a span of any kind (the compiled core's old reader took them).
_INTERNAL_NAMES = CANDIDATES.names


# --- the table's readings ---------------------------------------------------------------------------


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


def _first_present(attrs: AttrMap, keys: tuple[str, ...], read: Callable[[AttrMap, str], Any]) -> Any:
    """``read`` of the first of ``keys`` the span has (None if it has none)."""
    for key in keys:
        if key in attrs:
            return read(attrs, key)
    return None


def _first_text(attrs: AttrMap, keys: tuple[str, ...]) -> str | None:
    for key in keys:
        if key in attrs:
            value = get_str(attrs, key)
            if value:
                return value
    return None


def _tgi_duration(attrs: AttrMap, key: str) -> float | None:
    text = get_str(attrs, key)
    if text is None:
        return None
    try:
        return parse_rust_duration(text)
    except ValueError as exc:
        raise MalformedSpan("unparsable_duration", f"{key}: {exc}") from None


_FINISH_CACHE: dict[str, str | None] = {}  # finish_reasons text -> first reason: a handful of distinct values


def _finish_reason(attrs: AttrMap, key: str) -> str | None:
    """The first of an array, or of a JSON string (vLLM main writes ``'["stop"]'``); JSON strings are
    parsed once per distinct text."""
    value = attrs.get(key)
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
        reasons = get_str_list(attrs, key)
        first = reasons[0] if reasons else None
        if len(_FINISH_CACHE) < 256 and len(text) <= 64:
            _FINISH_CACHE[text] = first
        return first
    reasons = get_str_list(attrs, key)
    return reasons[0] if reasons else None


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
                    return str(kv.value.string_value.rsplit(".", 1)[-1])
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


def _cache_and_spec(attrs: AttrMap) -> tuple[int | None, int | None, int | None, int | None, int | None, str | None]:
    """(cache reads, cache writes, accepted, draft, steps, why speculative decoding was not taken).

    Speculative decoding counts only when all three numbers are there and consistent: accepted
    draft tokens never exceed proposed ones. Otherwise only it is dropped (a rejected value, counted
    at assembly): the request's latencies and its join do not depend on an optional extra."""
    read = _first_present(attrs, shapes.CACHE_READ_KEYS, _count)
    write = _first_present(attrs, shapes.CACHE_WRITE_KEYS, _count)
    if not any(key in attrs for key in SPEC_DECODE_KEYS):
        return read, write, None, None, None, None
    accepted, draft, steps = (_count(attrs, key) for key in SPEC_DECODE_KEYS)
    if accepted is None or draft is None or steps is None:
        return read, write, None, None, None, "incomplete_spec_decode"
    if accepted < 0 or draft < 0 or steps < 0 or accepted > draft:
        return read, write, None, None, None, "inconsistent_spec_decode"
    return read, write, accepted, draft, steps, None


def _read(read: Read, span: Span, attrs: AttrMap) -> tuple[Any, ...]:
    """The values ``read`` gives (one per field it reads, in order)."""
    how, keys = read.how, read.keys
    if how == "seconds":
        return (_first_present(attrs, keys, _number),)
    if how == "milliseconds":
        value = _first_present(attrs, keys, _number)
        return (value / 1000.0 if value is not None else None,)
    if how == "count":
        return (_first_present(attrs, keys, _count),)
    if how == "text":
        return (_first_present(attrs, keys, get_str),)
    if how == "first_text":
        return (_first_text(attrs, keys),)
    if how == "finish_reason":
        return (_finish_reason(attrs, keys[0]) if keys[0] in attrs else None,)
    if how == "rust_duration":
        return (_tgi_duration(attrs, keys[0]),)
    if how == "constant":
        return (read.arg,)
    if how == "by_span_name":
        mapping, default = read.arg
        return (dict(mapping).get(span.name, default),)
    if how == "text_or_mapped":
        key, fallback = keys
        if key in attrs:
            return (get_str(attrs, key),)
        if fallback in attrs:
            return (dict(read.arg).get(get_str(attrs, fallback) or ""),)
        return (None,)
    if how == "error":
        return _error_of(span, attrs)
    if how == "cache_and_spec":
        return _cache_and_spec(attrs)
    if how == "token_events":
        return _token_events(span) if span.events else (None, ())
    raise AssertionError(f"reading {how!r} is declared in shapes.READINGS but not read here")


def _table_reading(shape: Shape, span: Span, attrs: AttrMap) -> EngineObservation | None:
    """The observation ``shape``'s reads make of ``span``; raises ``MalformedSpan``."""
    values: dict[str, Any] = {}
    for fields, read in shape.reads:
        for name, value in zip(fields, _read(read, span, attrs)):
            if name == "ttft_s" and read.how == "token_events" and value is None:
                continue  # no token events: the attribute's TTFT stands
            values[name] = value
    for after in shape.afterwards:
        if after == shapes.SGLANG_SINGLE_OUTPUT:
            decode, completion = values.get("decode_s"), values.get("completion_tokens")
            if decode == 0 and completion is not None and completion > 1:
                # Non-streaming without --enable-metrics: SGLang's "first token" is the final output (ttft == e2e).
                values["ttft_s"] = values["decode_s"] = None
        elif after == shapes.TGI_UNFINISHED:
            if values.get("e2e_s") is None:
                if not values.get("is_error"):
                    # TGI records its fields only on success; the inner infer spans share these names and carry none.
                    return None
                values["error_type"] = values.get("error_type") or "_OTHER"
    return observation_of(shape, values)


def observation_of(shape: Shape, values: dict[str, Any]) -> EngineObservation:
    """``shape``'s observation with ``values`` by field name (``shapes.FIELDS``; absent: None)."""
    values = {name: value for name, value in values.items() if value is not None}
    accepted = values.pop("spec_accepted_tokens", None)
    draft = values.pop("spec_draft_tokens", None)
    steps = values.pop("spec_steps", None)
    if accepted is not None and draft is not None and steps is not None:
        values["spec_decode"] = (accepted, draft, steps)
    dispatch = values.pop("dispatch_to_first_token_s", None)
    if dispatch is not None:
        values["marks"] = ("dispatch_to_first_token_s", dispatch)
    if "itl_s" in values:
        values["itl_s"] = tuple(values["itl_s"])
    if "derived" in values:
        values["derived"] = tuple(values["derived"])
    return EngineObservation(engine_kind=shape.engine_kind, adapter=shape.adapter, part=shape.part,
                             may_be_gateway=shape.may_be_gateway, **values)


# --- the shapes read by functions of their own ------------------------------------------------------


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
    kv = _measured(attrs, shapes.TRTLLM_KV)
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
        prompt_tokens=_first_present(attrs, ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"), _count),
        completion_tokens=_first_present(attrs, ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
                                         _count),
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


def _event_marks(span: Span, names: frozenset[str]) -> tuple[Any, ...]:
    marks: list[Any] = []
    for e in span.events:
        if e.name in names and e.name not in marks[::2]:
            marks += (e.name, e.time_unix_nano)
    return tuple(marks)


def _span_duration(span: Span) -> float | None:
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if start <= 0 or end < start:
        raise MalformedSpan("invalid_span_times", f"{span.name}: end before start")
    return (end - start) / 1e9


def _triton_root(span: Span, attrs: AttrMap) -> EngineObservation:
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


def _triton_model(span: Span, attrs: AttrMap) -> EngineObservation:
    marks = ("model", get_str(attrs, "triton.model_name"), "parent_id", get_str(attrs, "triton.trace_parent_id"),
             *_event_marks(span, TRITON_MODEL_EVENTS))
    return _part(EngineKind.TRITON, "triton_model", Part.TRITON_MODEL, marks)


def _triton_compute(span: Span, attrs: AttrMap) -> EngineObservation | None:
    marks = _event_marks(span, TRITON_COMPUTE_EVENTS)
    return _part(EngineKind.TRITON, "triton_compute", Part.TRITON_COMPUTE, marks) if marks else None


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


def _dynamo_worker(span: Span, attrs: AttrMap) -> EngineObservation:
    ttft_ms = _number(attrs, "ttft_ms")
    return EngineObservation(
        engine_kind=EngineKind.DYNAMO, adapter="dynamo_worker", part=Part.DYNAMO_WORKER,
        marks=("role", get_str(attrs, "disagg_role"), "ttft_s", ttft_ms / 1000.0 if ttft_ms is not None else None,
               "finish_reason", get_str(attrs, "finish_reason")))


def _llmd_proxy(span: Span, attrs: AttrMap) -> EngineObservation:
    return _part(EngineKind.LLM_D, "llm-d_proxy", Part.LLMD_PROXY, ("role", shapes.LLMD_PROXY_SPANS[span.name]))


def _llmd_orchestration(span: Span, attrs: AttrMap) -> EngineObservation:
    return _part(EngineKind.LLM_D, "llm-d_orchestration", Part.LLMD_ORCHESTRATION,
                 ("target_model", get_str(attrs, "target_model")))


def _part(kind: str, adapter: str, part: str, marks: tuple[Any, ...]) -> EngineObservation:
    return EngineObservation(engine_kind=kind, adapter=adapter, part=part, marks=marks)


# The shapes whose spans these functions read (``Shape.python_reading``).
PYTHON_READINGS: dict[str, Callable[[Span, AttrMap], EngineObservation | None]] = {
    "trtllm": _trtllm, "triton": _triton_root, "triton_model": _triton_model, "triton_compute": _triton_compute,
    "dynamo": _dynamo_root, "dynamo_worker": _dynamo_worker, "llm-d_proxy": _llmd_proxy,
    "llm-d_orchestration": _llmd_orchestration}
if set(PYTHON_READINGS) != {name for name, shape in SHAPES.items() if shape.python_reading}:
    raise ImportError("shapes.py's python_reading shapes and engines.PYTHON_READINGS differ")


# --- classify ----------------------------------------------------------------------------------------


def may_be_llm(kind: int, name: str) -> bool:
    """``classify``'s first test, on a span's kind and name alone: ``False`` means ``classify``
    returns ``(None, no attributes)`` without reading anything else."""
    return CANDIDATES.match(kind, name)


def _is_true(attrs: AttrMap, key: str) -> bool:
    value = attrs.get(key)
    return value is not None and (value.bool_value or value.string_value == "true")


def _matches(rule: Rule, span: Span, kind: int, name: str, attrs: AttrMap) -> bool:
    return ((not rule.kinds or kind in rule.kinds) and (not rule.names or name in rule.names)
            and all(key in attrs for key in rule.present) and not any(key in attrs for key in rule.absent)
            and (not rule.any_of or any(key in attrs for key in rule.any_of))
            and all(get_str(attrs, key) == value for key, value in rule.equals)
            and all(_is_true(attrs, key) for key in rule.true)
            and (not rule.no_attributes or not attrs) and (not rule.has_events or bool(span.events)))


@functools.cache  # bounded: called only for the names of SGLANG_STAGES
def sglang_stage_observation(name: str) -> EngineObservation:
    """One observation per SGLang stage, shared by every buffered span of that stage (~300 B each
    otherwise); nothing changes an observation once its adapter made it."""
    return _part(EngineKind.SGLANG, "sglang_stage", Part.SGLANG_STAGE, ("stage", name))


def classify(span: Span) -> tuple[EngineObservation | None, AttrMap]:
    """The shape's reading of ``span`` (the first rule of ``shapes.RULES`` that matches), or ``None``
    when no shape claims it; with the span's attributes, which assembly keeps a few of.

    Raises ``MalformedSpan`` when a shape claims the span but its values are unusable.
    """
    name, kind = span.name, span.kind
    if not CANDIDATES.match(kind, name):
        return None, _NO_ATTRS
    # The adapter stage reads spans through ``otlp_view``, whose attributes are already a map.
    attrs = span.attributes if type(span) is ViewSpan else attribute_map(span.attributes)
    for rule in RULES:
        if not _matches(rule, span, kind, name, attrs):
            continue
        if rule.malformed is not None:
            raise MalformedSpan(*rule.malformed)
        assert rule.shape is not None
        shape = SHAPES[rule.shape]
        if not shape.reads_attributes:
            return (sglang_stage_observation(name) if shape.part == Part.SGLANG_STAGE
                    else observation_of(shape, {})), _NO_ATTRS
        reading = PYTHON_READINGS.get(shape.adapter)
        return (reading(span, attrs) if reading is not None else _table_reading(shape, span, attrs)), attrs
    return None, attrs
