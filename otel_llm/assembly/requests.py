"""From a completed trace to its request records: engine spans joined with their gateway ancestors."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.adapters.observation import EngineKind, EngineObservation
from otel_llm.assembly.records import Outcome, RequestRecord
from otel_llm.assembly.segments import build_segments, derive_timings
from otel_llm.assembly.traces import FIRST_TOKEN_EVENT, BufferedSpan, PendingTrace

_SERVER = Span.SPAN_KIND_SERVER

_FINISH_REASONS = {
    "stop": Outcome.STOP,
    "eos": Outcome.STOP,
    "end_turn": Outcome.STOP,
    "stop_sequence": Outcome.STOP,
    "tool_calls": Outcome.STOP,
    "length": Outcome.LENGTH,
    "max_tokens": Outcome.LENGTH,
    "abort": Outcome.ABORT,
    "cancelled": Outcome.ABORT,
    "error": Outcome.ERROR,
}

_ROUTE_OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    "/embeddings": "embeddings",
    "/generate": "text_completion",
    "/generate_stream": "text_completion",
}


@dataclass(slots=True, frozen=True)
class ResourceModelRule:
    """Model name from a resource attribute: mapped through ``values``, or taken as is when empty."""

    attribute: str
    values: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class Dimension:
    """An extra metric label read from the span, its gateway ancestors, then its resource."""

    name: str
    attribute: str
    allowed: frozenset[str]
    other: str = "other"


@dataclass(slots=True, frozen=True)
class RecordSettings:
    resource_model_rules: tuple[ResourceModelRule, ...] = ()
    default_model: str = "unknown"
    default_operation: str = "chat"
    edge_ttft_attributes: tuple[str, ...] = ("gen_ai.server.time_to_first_token",)
    dimensions: tuple[Dimension, ...] = ()


def _text(span: BufferedSpan, key: str) -> str | None:
    """As ``adapters.attributes.get_str`` reads an ``AnyValue``: the same label text either way."""
    value = span.attr(key)
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None or isinstance(value, dict):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _number(span: BufferedSpan, key: str) -> float | None:
    value = span.attr(key)
    return None if value is None or isinstance(value, bool) else float(value)


_REQUEST_MODEL = ("request_model", "gen_ai.request.model")  # (observation field, span attribute)
_RESPONSE_MODEL = ("response_model", "gen_ai.response.model")


def _first_model(spans: list[BufferedSpan], which: tuple[str, str]) -> str | None:
    field_name, attribute = which
    for buffered in spans:
        obs = buffered.observation
        value = getattr(obs, field_name) if obs is not None else _text(buffered, attribute)
        if value:
            return value
    return None


def resolve_model(
    own: EngineObservation, gateways: list[BufferedSpan], resource_attr: dict[str, str], settings: RecordSettings
) -> tuple[str, str]:
    """DESIGN.md §3 order; returns (model, the rule that fired)."""
    if own.response_model:
        return own.response_model, "span:gen_ai.response.model"
    if own.request_model:
        return own.request_model, "span:gen_ai.request.model"
    for which in (_RESPONSE_MODEL, _REQUEST_MODEL):
        value = _first_model(gateways, which)
        if value:
            return value, f"gateway:{which[1]}"
    for rule in settings.resource_model_rules:
        raw = resource_attr.get(rule.attribute)
        if raw is None:
            continue
        if not rule.values:
            return raw, f"resource:{rule.attribute}"
        if raw in rule.values:
            return rule.values[raw], f"resource:{rule.attribute}"
    return settings.default_model, "default"


def _outcome(obs: EngineObservation) -> str:
    if obs.is_error:
        return Outcome.ERROR
    if obs.finish_reason:
        return _FINISH_REASONS.get(obs.finish_reason.lower(), Outcome.UNKNOWN)
    if obs.max_tokens and obs.completion_tokens is not None and obs.completion_tokens >= obs.max_tokens:
        return Outcome.LENGTH
    return Outcome.UNKNOWN


def _edge_ttft(edge: BufferedSpan, settings: RecordSettings) -> float | None:
    for key in settings.edge_ttft_attributes:
        try:
            value = _number(edge, key)
        except (TypeError, ValueError):
            continue
        if value is not None and value >= 0:
            return value
    event_ns = edge.attr(FIRST_TOKEN_EVENT)
    if event_ns is not None and event_ns >= edge.start_unix_ns > 0:
        return (event_ns - edge.start_unix_ns) / 1e9
    return None


def _operation(obs: EngineObservation, gateways: list[BufferedSpan], settings: RecordSettings) -> str:
    if obs.operation_name:
        return obs.operation_name
    for buffered in gateways:
        if buffered.observation is not None and buffered.observation.operation_name:
            return buffered.observation.operation_name
        route = _text(buffered, "http.route")
        if route and route in _ROUTE_OPERATIONS:
            return _ROUTE_OPERATIONS[route]
    return settings.default_operation


def _dimensions(own: BufferedSpan, gateways: list[BufferedSpan], settings: RecordSettings) -> tuple[str, ...]:
    if not settings.dimensions:
        return ()
    values: list[str] = []
    for dim in settings.dimensions:
        found = None
        for buffered in (own, *gateways):
            found = _text(buffered, dim.attribute)
            if found is not None:
                break
        if found is None:
            found = own.origin.resource_strings.get(dim.attribute)
        values.append(found if found in dim.allowed else dim.other)
    return tuple(values)


def adjusted_count(trace_state: str) -> float:
    """1 / sampling probability from an OTel ``ot=th:`` threshold, so upstream sampling stays unbiased."""
    if "th:" not in trace_state:
        return 1.0
    for member in trace_state.split(","):
        key, _, value = member.strip().partition("=")
        if key != "ot":
            continue
        for field_ in value.split(";"):
            name, _, threshold = field_.partition(":")
            if name != "th" or not threshold or len(threshold) > 14:
                continue
            try:
                rejected = int(threshold.ljust(14, "0"), 16)
            except ValueError:
                return 1.0
            probability = (2**56 - rejected) / 2**56
            return 1.0 / probability if probability > 0 else 1.0
    return 1.0


def build_record(buffered: BufferedSpan, gateways: list[BufferedSpan], settings: RecordSettings) -> RequestRecord:
    obs = buffered.observation
    assert obs is not None
    model, source = resolve_model(obs, gateways, buffered.origin.resource_strings, settings)
    request_model = obs.request_model or _first_model(gateways, _REQUEST_MODEL) or model
    response_model = obs.response_model or _first_model(gateways, _RESPONSE_MODEL) or model
    record = RequestRecord(
        trace_id=buffered.trace_id,
        span_id=buffered.span_id,
        engine_kind=obs.engine_kind,
        adapter=obs.adapter,
        service_name=buffered.service_name,
        model=model,
        model_source=source,
        request_model=request_model,
        response_model=response_model,
        operation_name=_operation(obs, gateways, settings),
        provider_name=obs.provider_name or obs.engine_kind,
        outcome=_outcome(obs),
        error_type=obs.error_type or "",
        server_address=obs.server_address or "",
        server_port=obs.server_port or "",
        start_unix_ns=buffered.start_unix_ns,
        prompt_tokens=obs.prompt_tokens,
        completion_tokens=obs.completion_tokens,
        dimensions=_dimensions(buffered, gateways, settings),
        weight=adjusted_count(buffered.trace_state) if buffered.trace_state else 1.0,
    )
    t = derive_timings(obs, math.inf)  # validated at intake; derived again here, not stored per span
    record.ttft_s, record.e2e_s, record.queue_s = t.ttft_s, t.e2e_s, t.queue_s
    record.prefill_s, record.decode_s, record.inference_s, record.tpot_s = (
        t.prefill_s, t.decode_s, t.inference_s, t.tpot_s)
    record.segments = build_segments(buffered.start_unix_ns, t)
    if record.e2e_s is None and obs.engine_kind == EngineKind.GENAI and buffered.end_unix_ns > buffered.start_unix_ns:
        record.e2e_s = (buffered.end_unix_ns - buffered.start_unix_ns) / 1e9
    failed_gateway = next((g for g in gateways if g.status_code == Status.STATUS_CODE_ERROR), None)
    if failed_gateway is not None and record.outcome != Outcome.ERROR:
        # The client got an error from the edge: that is the request's outcome, whatever the engine saw.
        record.outcome = Outcome.ERROR
        record.error_type = _text(failed_gateway, "error.type") or "_OTHER"
    servers = [g for g in gateways if g.kind == _SERVER]
    if servers:
        edge = servers[-1]
        record.edge_span_id = edge.span_id
        edge_duration = (edge.end_unix_ns - edge.start_unix_ns) / 1e9
        if record.e2e_s is not None and obs.engine_kind != EngineKind.GENAI and edge_duration >= 0:
            record.gateway_overhead_s = max(edge_duration - record.e2e_s, 0.0)
        record.edge_ttft_s = _edge_ttft(edge, settings)
    return record


def _unanswered_record(buffered: BufferedSpan, gateways: list[BufferedSpan], settings: RecordSettings) -> RequestRecord:
    """A GenAI/gateway span with no engine span below it that failed (error) or never reported a
    response (a client abort: vLLM emits no span for those)."""
    record = build_record(buffered, gateways, settings)
    record.outcome = Outcome.ERROR if buffered.observation and buffered.observation.is_error else Outcome.ABORT
    if record.outcome == Outcome.ABORT:
        record.error_type = "aborted"
    record.engine_kind = EngineKind.GENAI
    record.edge_span_id = (gateways[-1] if gateways else buffered).span_id
    return record


def _has_response(obs: EngineObservation) -> bool:
    return bool(obs.response_model or obs.completion_tokens is not None or obs.finish_reason or obs.ttft_s is not None)


def records_of_trace(trace: PendingTrace, settings: RecordSettings) -> list[RequestRecord]:
    """One record per engine request; GenAI spans become records only where no engine span is below them."""
    records: list[RequestRecord] = []
    gateway_ids: set[bytes] = set()
    genai: list[BufferedSpan] = []
    for buffered in trace.spans.values():
        if buffered.observation is None:
            continue
        if buffered.is_engine:
            gateways = trace.ancestors(buffered)
            gateway_ids.update(g.span_id for g in gateways)
            records.append(build_record(buffered, gateways, settings))
        else:
            genai.append(buffered)
    if not genai:
        return records
    # A GenAI span with another GenAI span below it is that one's gateway, not a request of its own.
    for buffered in genai:
        if buffered.span_id in gateway_ids:
            continue
        for ancestor in trace.ancestors(buffered):
            gateway_ids.add(ancestor.span_id)
    for buffered in genai:
        if buffered.span_id in gateway_ids:
            continue
        gateways = trace.ancestors(buffered)
        obs = buffered.observation
        assert obs is not None
        answered = _has_response(obs) and not obs.is_error
        records.append((build_record if answered else _unanswered_record)(buffered, gateways, settings))
    return records
