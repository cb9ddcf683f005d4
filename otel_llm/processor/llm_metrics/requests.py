"""From a completed trace to its request records, one per request and side (DESIGN.md §10).

- **Server side**: each engine span is a request, joined with the gateways in front of it: its
  SERVER ancestors, or — where a gateway forwards its caller's ``traceparent`` (LiteLLM's
  ``forward_traceparent_to_llm_provider``) — the sibling SERVER span whose interval contains it.
  A GenAI SERVER span with no engine span joined to it is a request of its own (a gateway-only
  request, or a client abort: vLLM emits no span for those).
- **Client side**: each outermost CLIENT/INTERNAL GenAI span (an application or a gateway calling
  out) is a request, joined with the engine span below it when the trace says so. Client spans
  never reach a server-side family, and nested client spans are part of the outer call.

Where an engine span and a client span are joined, the server record takes its model, operation
and dimensions from the client or gateway when the engine has none, and gains the client-observed
overhead (client duration − engine e2e).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, fields
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.processor.llm_metrics.adapters import shapes
from otel_llm.processor.llm_metrics.adapters.engines import GENAI_OPERATIONS, SGLANG_STAGES, sglang_stage_observation
from otel_llm.pdata.observation import EngineKind, EngineObservation, MalformedSpan, Part
from otel_llm.processor.llm_metrics import composite
from otel_llm.pdata.records import Outcome, RequestRecord, Segment, Side, Source
from otel_llm.processor.llm_metrics.segments import timings_and_segments
from otel_llm.pdata.spans import FIRST_TOKEN_EVENT, BufferedSpan, PendingTrace

_SERVER = Span.SPAN_KIND_SERVER
_ERROR = Status.STATUS_CODE_ERROR

_OTHER_ERROR = "_OTHER"  # semconv's error.type when nothing names the error

CLIENT_ENGINE_KIND = "client"  # the engine_kind of a client-side record (its store row, its CLI line)
NO_MODEL_SOURCE = "none"

# A gateway that forwards its caller's traceparent makes the engine span its sibling: the engine's
# interval must lie inside the gateway's, give or take this much clock skew between the two hosts.
SIBLING_SKEW_NS = 5_000_000
_MAX_BELOW = 64  # descendants of a gateway looked at for its GenAI spans: hostile traces stay cheap
_MAX_SIBLINGS = 4  # containing siblings kept (LiteLLM's proxy has two SERVER spans per call)

# A sane upstream sampler keeps at least one span in a million; a heavier adjusted count is a
# client-chosen weight, and one such span would swamp (and, in float, freeze) a counter.
MAX_ADJUSTED_COUNT = 2.0**20
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")  # int(x, 16) alone would take "-1", "+f" and "1_0"

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
class TenantRule:
    attributes: tuple[str, ...]  # the first a span carries names the tenant
    allowed: frozenset[str]
    other: str


@dataclass(slots=True, frozen=True)
class RecordSettings:
    resource_model_rules: tuple[ResourceModelRule, ...] = ()
    default_model: str = ""
    default_operation: str = ""
    model_from_service_name: bool = False
    edge_ttft_attributes: tuple[str, ...] = ("gen_ai.server.time_to_first_token",)
    dimensions: tuple[Dimension, ...] = ()
    tenant: TenantRule | None = None
    max_latency_s: float = 86400.0  # the bound every duration goes through, from any source
    # Configured LoRA adapter name -> its base model (vLLM's --lora-modules name and base_model_name).
    lora_adapters: dict[str, str] = field(default_factory=dict)


def _text(span: BufferedSpan, key: str) -> str | None:
    """As ``adapters.attributes.get_str`` reads an ``AnyValue``: the same label text either way."""
    if key not in span.attrs[::2]:  # one C-level scan of the keys (the values may be cold in memory)
        return None
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


def is_genai(span: BufferedSpan) -> bool:
    return span.observation is not None and span.observation.may_be_gateway


def is_client_side(span: BufferedSpan) -> bool:
    """A GenAI span that is not a SERVER span: an application or a gateway calling a model."""
    return span.kind != _SERVER and is_genai(span)


def adjusted_count(trace_state: str) -> float:
    """1 / sampling probability from an OTel ``ot=th:`` threshold, so upstream sampling stays unbiased.

    Raises ``MalformedSpan`` for a threshold that is not 1-14 hex digits, or whose adjusted count is
    beyond ``MAX_ADJUSTED_COUNT``.
    """
    if "th:" not in trace_state:
        return 1.0
    for member in trace_state.split(","):
        key, _, value = member.strip().partition("=")
        if key != "ot":
            continue
        for field_ in value.split(";"):
            name, _, threshold = field_.partition(":")
            if name != "th":
                continue
            if not 1 <= len(threshold) <= 14 or not _HEX_DIGITS.issuperset(threshold):
                raise MalformedSpan("invalid_sampling_threshold", f"tracestate th:{threshold[:20]!r}")
            rejected = int(threshold.ljust(14, "0"), 16)
            count = 2**56 / (2**56 - rejected)
            if count > MAX_ADJUSTED_COUNT:
                raise MalformedSpan("absurd_sampling_threshold",
                                    f"th:{threshold} means an adjusted count of {count:.3g}")
            return count
    return 1.0


# --- validated durations --------------------------------------------------------------------


def _valid_seconds(value: float | None, settings: RecordSettings, reason: str, rejected: list[str]) -> float | None:
    """``value`` if it is a usable duration, else ``None`` with ``reason`` noted: every duration read at
    assembly (span times, attributes, events) passes the bound engine latencies pass at intake."""
    if value is None:
        return None
    if math.isfinite(value) and 0.0 <= value <= settings.max_latency_s:
        return value
    rejected.append(reason)
    return None


def _span_seconds(span: BufferedSpan, settings: RecordSettings, rejected: list[str]) -> float | None:
    start, end = span.start_unix_ns, span.end_unix_ns
    if start <= 0 or end < start:
        rejected.append("invalid_span_times")
        return None
    seconds = (end - start) / 1e9  # finite and not negative: what _valid_seconds checks beside the bound
    if seconds <= settings.max_latency_s:
        return seconds
    rejected.append("absurd_span_duration")
    return None


def _edge_ttft(edge: BufferedSpan, settings: RecordSettings, rejected: list[str]) -> float | None:
    attrs = edge.attrs
    if not attrs:  # what it reads (attributes, the first-token event time) are all kept there
        return None
    keys = attrs[::2]  # scanned in C without touching the values, which may be cold in memory
    for key in settings.edge_ttft_attributes:
        if key not in keys:  # an absent key reads as None below
            continue
        try:
            value = _number(edge, key)
        except (TypeError, ValueError):
            rejected.append("invalid_edge_ttft")
            continue
        if value is not None:
            return _valid_seconds(value, settings, "invalid_edge_ttft", rejected)
    event_ns = edge.attr(FIRST_TOKEN_EVENT) if FIRST_TOKEN_EVENT in keys else None
    if event_ns is not None and edge.start_unix_ns > 0:
        return _valid_seconds((event_ns - edge.start_unix_ns) / 1e9, settings, "invalid_edge_ttft", rejected)
    return None


# --- joining a request's spans --------------------------------------------------------------


@dataclass(slots=True)
class Joined:
    """The spans a request is read with, beside its own.

    ``lookup``: where a missing model, operation or dimension is looked for, nearest first.
    ``servers``: the gateways in front of it (SERVER spans below the client), nearest first.
    ``client``: the outermost client GenAI span of the call, if the trace has it.
    """

    lookup: list[BufferedSpan]
    servers: list[BufferedSpan]
    client: BufferedSpan | None


class _TraceIndex:
    """A trace's spans by parent, built once per trace and only if a join needs it; what the joins
    ask of it is memoised, so each engine span costs the same however many share a gateway."""

    __slots__ = ("trace", "_children", "_below", "_candidates")

    def __init__(self, trace: PendingTrace) -> None:
        self.trace = trace
        self._children: dict[bytes, list[BufferedSpan]] | None = None
        self._below: dict[bytes, list[BufferedSpan]] = {}
        self._candidates: dict[bytes, list[BufferedSpan]] = {}

    def children(self, parent_span_id: bytes) -> list[BufferedSpan]:
        if self._children is None:
            index: dict[bytes, list[BufferedSpan]] = {}
            for buffered in self.trace.spans.values():
                if buffered.parent_span_id:
                    index.setdefault(buffered.parent_span_id, []).append(buffered)
            self._children = index
        return self._children.get(parent_span_id, [])

    def genai_below(self, top: BufferedSpan) -> list[BufferedSpan]:
        """GenAI spans under ``top``, breadth first (nearest first), among its first ``_MAX_BELOW`` descendants."""
        found = self._below.get(top.span_id)
        if found is not None:
            return found
        found = []
        frontier, seen = [top], 0
        while frontier and seen < _MAX_BELOW:
            next_frontier: list[BufferedSpan] = []
            for span in frontier:
                for child in self.children(span.span_id):
                    seen += 1
                    if seen > _MAX_BELOW:
                        break
                    if is_genai(child):
                        found.append(child)
                    next_frontier.append(child)
            frontier = next_frontier
        self._below[top.span_id] = found
        return found

    def sibling_candidates(self, parent_span_id: bytes) -> list[BufferedSpan]:
        """The children of ``parent_span_id`` a forwarded traceparent can make an engine's gateway:
        SERVER spans no adapter claimed and GenAI spans, tightest first."""
        found = self._candidates.get(parent_span_id)
        if found is None:
            found = [span for span in self.children(parent_span_id)
                     if span.kind == _SERVER and span.observation is None or is_genai(span)]
            found.sort(key=lambda span: span.end_unix_ns - span.start_unix_ns)
            self._candidates[parent_span_id] = found
        return found


def _containing_siblings(engine: BufferedSpan, index: _TraceIndex) -> list[BufferedSpan]:
    """Gateway (SERVER) or GenAI spans that share the engine span's parent and contain its interval,
    tightest first: a gateway that forwarded its caller's traceparent (LiteLLM's proxy has two)."""
    start, end = engine.start_unix_ns, engine.end_unix_ns
    found: list[BufferedSpan] = []
    for sibling in index.sibling_candidates(engine.parent_span_id)[:_MAX_BELOW]:  # bounded for hostile fan-outs
        if sibling.start_unix_ns - SIBLING_SKEW_NS <= start and end <= sibling.end_unix_ns + SIBLING_SKEW_NS:
            found.append(sibling)
            if len(found) == _MAX_SIBLINGS:
                break
    return found


def _route(span: BufferedSpan) -> str | None:
    return _text(span, "http.route") or _text(span, "url.path")


def _is_llm_endpoint(span: BufferedSpan) -> bool:
    """A SERVER span that serves a model API: a gateway wherever it stands (LiteLLM's proxy span
    sits above LiteLLM's own client spans), unlike an application's own SERVER span."""
    return is_genai(span) or _route(span) in _ROUTE_OPERATIONS


def _split(ancestors: list[BufferedSpan]) -> tuple[list[BufferedSpan], BufferedSpan | None]:
    """The gateways in front of a request, and the outermost client GenAI ancestor. SERVER spans
    above the client call are the application's own, unless they serve a model API themselves."""
    client_at = -1
    for position, span in enumerate(ancestors):
        if is_client_side(span):
            client_at = position
    servers = [s for position, s in enumerate(ancestors)
               if s.kind == _SERVER and (position < client_at or client_at < 0 or _is_llm_endpoint(s))]
    return servers, (ancestors[client_at] if client_at >= 0 else None)


def join_engine(engine: BufferedSpan, trace: PendingTrace, index: _TraceIndex, genai_in_trace: int) -> Joined:
    """``genai_in_trace``: how many GenAI spans the trace holds; when its ancestors hold them all,
    nothing beside the chain can name the model (the common case costs no index of the trace)."""
    ancestors = trace.ancestors(engine)
    parent = ancestors[0] if ancestors else None
    siblings: list[BufferedSpan] = []
    if engine.parent_span_id and (parent is None or parent.kind != _SERVER):
        siblings = _containing_siblings(engine, index)
    servers, client = _split(ancestors)
    if siblings:
        servers = [span for span in siblings if span.kind == _SERVER] + servers
    else:
        genai_above = 0
        for span in ancestors:
            observed = span.observation
            if observed is not None and observed.may_be_gateway:  # is_genai, inlined
                genai_above += 1
        if not servers or genai_in_trace == genai_above:
            return Joined(ancestors, servers, client)
    # A gateway's own GenAI spans (LiteLLM's litellm_request under its proxy span) are not above the
    # engine span but beside it: they name the model and are the gateway's call out.
    below: list[BufferedSpan] = []
    seen: set[bytes] = set()
    for top in (*siblings, *servers):
        for span in index.genai_below(top):
            if span.span_id not in seen:
                seen.add(span.span_id)
                below.append(span)
    if client is None:
        client = next((span for span in (*siblings, *below) if is_client_side(span)), None)
    return Joined([*below, *siblings, *ancestors], servers, client)


def join_ancestors(span: BufferedSpan, trace: PendingTrace) -> Joined:
    ancestors = trace.ancestors(span)
    servers, client = _split(ancestors)
    return Joined(ancestors, servers, client)


# --- what the request's spans say -----------------------------------------------------------


def _models(obs: EngineObservation | None, span: BufferedSpan) -> tuple[str | None, str | None]:
    if obs is not None:
        return obs.response_model, obs.request_model
    return _text(span, "gen_ai.response.model"), _text(span, "gen_ai.request.model")


def _resolve_model(own: EngineObservation, lookup: list[BufferedSpan], resource_attr: dict[str, str],
                   settings: RecordSettings) -> tuple[str, str, str, str, str, str]:
    """(model, its source, request model, response model, heard, its source): DESIGN.md §3's rules
    (the span, the spans joined with it, the resource mapping, the configured default: metric label and
    store row only, never written into a span), ordered by whose span it is; "" where nothing says.

    An engine's own span and resource come before its callers' spans (``_CALLER_FIRST_KINDS`` keep
    §3's order): a gateway names the model its caller asked for (LiteLLM's alias, which it also reports
    as the response's model), the engine serves its own, which its resource names (a mapping, or in
    ``_fallback_model`` its service name) and its own ``/metrics`` label. So for an engine, what the
    joined spans name (``heard``) is the request model here and the model label only in
    ``_fallback_model``, when the engine's side names none (docs/concepts/segments.md)."""
    response, request = own.response_model or "", own.request_model or ""
    if response:
        model, source = response, "span:gen_ai.response.model"
    elif request:
        model, source = request, "span:gen_ai.request.model"
    else:
        model = source = ""
    heard = heard_source = ""
    for span in lookup:  # a loop, and the side word and _models inlined, on this per-request path
        if response and request:
            break
        observed = span.observation
        if observed is not None:
            span_response, span_request = observed.response_model, observed.request_model
        else:
            span_response, span_request = _models(observed, span)
        if not model and not heard and (span_response or span_request):
            side = "client" if span.kind != _SERVER and observed is not None and observed.may_be_gateway else "gateway"
            heard = span_response or span_request or ""
            heard_source = side + (":gen_ai.response.model" if span_response else ":gen_ai.request.model")
        response = response or span_response or ""
        request = request or span_request or ""
    if model:
        return model, source, request or model, response, "", ""
    if heard and own.engine_kind in _CALLER_FIRST_KINDS:
        return heard, heard_source, request or heard, response, "", ""
    for rule in settings.resource_model_rules:
        raw = resource_attr.get(rule.attribute)
        if raw is None:
            continue
        if not rule.values:
            return raw, f"resource:{rule.attribute}", request or heard or raw, response, heard, heard_source
        if raw in rule.values:
            mapped = rule.values[raw]
            return mapped, f"resource:{rule.attribute}", request or heard or mapped, response, heard, heard_source
    return "", NO_MODEL_SOURCE, request or heard, response, heard, heard_source


def _fallback_model(own: EngineObservation, resource_attr: dict[str, str], settings: RecordSettings,
                    heard: str, heard_source: str) -> tuple[str, str]:
    """When the request's own spans and resource name no model (after its other parts were read): the
    engine's service name, then what a joined gateway or client span named, then the configured
    default. The model label only: not a request model anything said, so never written into a span."""
    if settings.model_from_service_name and own.engine_kind != EngineKind.GENAI:  # an engine's span, not an app's
        service = resource_attr.get("service.name")
        if service and not service.startswith("unknown_service"):
            return service, "resource:service.name"
    if heard:
        return heard, heard_source
    if settings.default_model:
        return settings.default_model, Source.DEFAULT
    return "", NO_MODEL_SOURCE


def _outcome(obs: EngineObservation) -> str:
    if obs.is_error:
        return Outcome.ERROR
    if obs.finish_reason:
        return _FINISH_REASONS.get(obs.finish_reason.lower(), Outcome.UNKNOWN)
    if obs.max_tokens and obs.completion_tokens is not None and obs.completion_tokens >= obs.max_tokens:
        return Outcome.LENGTH
    return Outcome.UNKNOWN


def _operation(obs: EngineObservation, own: BufferedSpan, lookup: list[BufferedSpan],
               settings: RecordSettings) -> tuple[str, str]:
    """The semconv rule: a well-known value wherever one applies (the span's, a joined span's, a
    route's), a custom value (LiteLLM's ``acompletion``) only where none does."""
    custom: tuple[str, str] | None = None
    name = obs.operation_name
    if name:
        if name in GENAI_OPERATIONS:
            return name, "span"
        custom = (name, "span")
    if own.attrs:  # a span without the attributes assembly reads has no route
        route = _route(own)
        if route and route in _ROUTE_OPERATIONS:
            return _ROUTE_OPERATIONS[route], "route"
    for span in lookup:  # loops, not generators, on this per-request path
        observed = span.observation
        name = observed.operation_name if observed is not None else None
        if name:
            side = "client" if span.kind != _SERVER and observed is not None and observed.may_be_gateway else "gateway"
            if name in GENAI_OPERATIONS:
                return name, side
            custom = custom or (name, side)
        if span.attrs:
            route = _route(span)
            if route and route in _ROUTE_OPERATIONS:
                return _ROUTE_OPERATIONS[route], "route"
    return custom or (settings.default_operation, Source.DEFAULT)


def _dimensions(own: BufferedSpan, lookup: list[BufferedSpan], settings: RecordSettings) -> tuple[str, ...]:
    if not settings.dimensions:
        return ()
    values: list[str] = []
    for dim in settings.dimensions:
        found = None
        for buffered in (own, *lookup):
            found = _text(buffered, dim.attribute)
            if found is not None:
                break
        if found is None:
            found = own.origin.resource_strings.get(dim.attribute)
        values.append(found if found in dim.allowed else dim.other)
    return tuple(values)


def _tenant(own: BufferedSpan, lookup: list[BufferedSpan], rule: TenantRule | None) -> str:
    """The nearest span's first tenant attribute (a gateway's ``metadata.user_api_key_team_alias``,
    a header it records as ``http.request.header.<name>``), then the resource's; "" if none has one."""
    if rule is None:
        return ""
    for buffered in (own, *lookup):
        for attribute in rule.attributes:
            found = _text(buffered, attribute)
            if found:
                return found if found in rule.allowed else rule.other
    for attribute in rule.attributes:
        found = own.origin.resource_strings.get(attribute)
        if found:
            return found if found in rule.allowed else rule.other
    return ""


# RequestRecord's fields up to those build_record passes positionally, in order.
_RECORD_ORDER = (
    "trace_id", "span_id", "engine_kind", "adapter", "service_name", "model", "model_source", "request_model",
    "response_model", "operation_name", "provider_name", "outcome", "side", "operation_source", "error_type",
    "server_address", "server_port", "start_unix_ns", "ttft_s", "tpot_s", "e2e_s", "queue_s", "prefill_s",
    "decode_s", "inference_s", "prompt_tokens", "completion_tokens", "gateway_overhead_s", "client_overhead_s",
    "edge_ttft_s", "edge_span_id", "joined_span_id", "segments", "dimensions", "weight", "rejected",
    "segments_missing", "not_measurable", "segments_derived", "cached_tokens", "cache_write_tokens",
    "reasoning_tokens", "itl_s", "tenant")
# All of RequestRecord's fields, in order: the compiled core's record must hold the same (its builder checks).
_RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))
if _RECORD_FIELDS[:len(_RECORD_ORDER)] != _RECORD_ORDER:
    raise ImportError("RequestRecord's fields moved: update build_record's positional construction")
# The record fields the rules of this module set (from an observation field of the same name or
# otherwise); every other field a shape and RequestRecord both declare is carried to the record by
# name, unchanged (an engine attribute read for a metric declared on it: ``adapters/shapes.py``).
_RULED = frozenset(_RECORD_ORDER) | {"spec_accepted_tokens", "spec_draft_tokens", "spec_steps", "lora_adapter",
                                     "lora_base_model"}
CARRIED = tuple(f.name for f in shapes.FIELDS if f.name in _RECORD_FIELDS and f.name not in _RULED)


def build_record(buffered: BufferedSpan, joined: Joined, settings: RecordSettings,
                 side: str = Side.SERVER, trace: PendingTrace | None = None,
                 partner: BufferedSpan | None = None, inner: list[BufferedSpan] | None = None) -> RequestRecord:
    """``trace``: read the request's other spans (composite.py) from it; ``partner``: the context
    server's span of a disaggregated trtllm-serve request; ``inner``: engine spans a Dynamo or llm-d
    request holds. Raises ``MalformedSpan`` when those spans cannot make one request."""
    obs = buffered.observation
    assert obs is not None
    lookup = joined.lookup
    model, source, request_model, response_model, heard, heard_source = _resolve_model(
        obs, lookup, buffered.origin.resource_strings, settings)
    operation, operation_source = _operation(obs, buffered, lookup, settings)
    dimensions = _dimensions(buffered, lookup, settings) if settings.dimensions else ()
    tenant = _tenant(buffered, lookup, settings.tenant) if settings.tenant is not None else ""
    weight = adjusted_count(buffered.trace_state) if buffered.trace_state else 1.0
    server = side == Side.SERVER
    start = buffered.start_unix_ns
    # Validated at intake; derived again here, not stored per span.
    timings, segments = timings_and_segments(obs, start, server)
    ttft, e2e, queue, prefill, decode, inference, _, _, tpot, not_measurable = timings
    # Positional, in RequestRecord's field order (_RECORD_ORDER, checked at import): keywords cost ~3x.
    record = RequestRecord(
        buffered.trace_id, buffered.span_id, CLIENT_ENGINE_KIND if side == Side.CLIENT else obs.engine_kind,
        obs.adapter, buffered.origin.service_name, model, source, request_model, response_model, operation,
        obs.provider_name or "", _outcome(obs), side, operation_source, obs.error_type or "",
        obs.server_address or "", obs.server_port or "", start,
        ttft, tpot, e2e, queue, prefill, decode, inference,
        obs.prompt_tokens, obs.completion_tokens,
        None, None, None, b"", b"",  # gateway/client overhead, edge TTFT, edge and joined span: the join's
        segments, dimensions, weight,
        (), (), not_measurable, obs.derived,  # rejected (below), segments missing, not measurable, derived
        obs.cached_tokens, obs.cache_write_tokens, obs.reasoning_tokens, obs.itl_s, tenant)
    rejected: list[str] = []
    if server and trace is not None and (partner is not None or obs.engine_kind in _COMPOSITE_KINDS):
        _read_composite(record, buffered, obs, trace, joined, partner, inner or [])
    _read_cache_and_spec(record, obs, lookup if server else [], rejected)
    if record.e2e_s is None:
        # GenAI spans carry no e2e attribute and TGI records its fields only on success: the span's
        # own duration is the request's, so every outcome lands in the same duration families.
        record.e2e_s = _span_seconds(buffered, settings, rejected)
    if server:
        _join_server_side(record, obs, joined, settings, rejected)
    if not record.model:
        record.model, record.model_source = _fallback_model(obs, buffered.origin.resource_strings, settings, heard,
                                                            heard_source)
    if settings.lora_adapters:
        _name_adapter(record, settings.lora_adapters)
    for name in CARRIED:
        value = getattr(obs, name, None)
        if value is not None:
            setattr(record, name, value)
    record.rejected = tuple(rejected)
    return record


def _read_cache_and_spec(record: RequestRecord, obs: EngineObservation, lookup: list[BufferedSpan],
                         rejected: list[str]) -> None:
    """Cache reads/writes and speculative decoding: the engine span's, else those of the nearest joined
    gateway or client span that reports them (vLLM 0.32 puts its ``usage.prompt_tokens_details`` and
    ``metrics`` in the response body only, so the caller's span is where they reach otel-llm). Only
    the server side looks beside: a client span's ancestors may sum several calls.

    A count the request's own prompt cannot hold is rejected (counted), never observed."""
    cached, written, spec = record.cached_tokens, obs.cache_write_tokens, obs.spec_decode
    if obs.spec_decode_rejected:
        rejected.append(obs.spec_decode_rejected)
    for span in lookup:
        if cached is not None and written is not None and spec is not None:
            break
        seen = span.observation
        if seen is None:
            continue
        cached = cached if cached is not None else seen.cached_tokens
        written = written if written is not None else seen.cache_write_tokens
        spec = spec if spec is not None else seen.spec_decode
    prompt = record.prompt_tokens
    if cached is not None and (cached < 0 or (prompt is not None and cached > prompt)):
        rejected.append("cached_tokens_exceed_prompt")
        cached = None
    if written is not None and (written < 0 or (prompt is not None and written > prompt)):
        rejected.append("cache_write_tokens_exceed_prompt")
        written = None
    record.cached_tokens, record.cache_write_tokens = cached, written
    if spec is not None:
        record.spec_accepted_tokens, record.spec_draft_tokens, record.spec_steps = spec


def _name_adapter(record: RequestRecord, adapters: dict[str, str]) -> None:
    """The configured adapter a request names: as the requested model (a gateway's, a client's, vllm#47633's
    span), or as the served model (vLLM answers a LoRA request with the adapter's name as ``model``,
    entrypoints/openai/models/serving.py:144-146 @ 0.32.0)."""
    for name in (record.request_model, record.response_model, record.model):
        base = adapters.get(name) if name else None
        if base is not None:
            record.lora_adapter, record.lora_base_model = name, base
            return


# The engines whose request _read_composite reads from other spans even without a partner span.
_COMPOSITE_KINDS = frozenset({EngineKind.SGLANG, EngineKind.TRITON, EngineKind.DYNAMO, EngineKind.LLM_D})


def _read_composite(record: RequestRecord, buffered: BufferedSpan, obs: EngineObservation, trace: PendingTrace,
                    joined: Joined, partner: BufferedSpan | None, inner: list[BufferedSpan]) -> None:
    kind = obs.engine_kind
    finish: str | None = None
    if kind == EngineKind.SGLANG:
        if partner is not None:
            composite.sglang_disaggregated(record, buffered, partner, trace)
        else:
            composite.sglang(record, buffered, trace)
    elif kind == EngineKind.TRITON:
        composite.triton(record, buffered, trace)
    elif kind == EngineKind.DYNAMO:
        finish = composite.dynamo(record, buffered, trace, inner)
    elif kind == EngineKind.LLM_D:
        edge = joined.servers[-1] if joined.servers else None
        finish = composite.llmd(record, buffered, trace, edge, inner)
    elif partner is not None:
        composite.trtllm_disaggregated(record, buffered, partner)
    if finish and record.outcome == Outcome.UNKNOWN:
        record.outcome = _FINISH_REASONS.get(finish.lower(), Outcome.UNKNOWN)


def _pair_disaggregated(engines: list[BufferedSpan]) -> dict[bytes, BufferedSpan]:
    """trtllm-serve's disaggregated request: a context and a generation server span under one proxy
    span. The generation server's span (the later one) carries the request; the context's is its partner."""
    by_parent: dict[bytes, list[BufferedSpan]] = {}
    for span in engines:
        obs = span.observation
        if obs is not None and obs.engine_kind == EngineKind.TRTLLM and span.parent_span_id:
            by_parent.setdefault(span.parent_span_id, []).append(span)
    partners: dict[bytes, BufferedSpan] = {}
    for pair in by_parent.values():
        if len(pair) == 2:
            context, generation = sorted(pair, key=lambda span: span.start_unix_ns)
            partners[generation.span_id] = context
    return partners


def _pair_sglang_pd(engines: list[BufferedSpan]) -> dict[bytes, BufferedSpan]:
    """SGLang's prefill/decode disaggregation: each server's tokenizer makes its own root, ``"prefill Req …"``
    and ``"decode Req …"``, both with the router's ``bootstrap_room`` (sglang 0.5.23 observability/trace.py:
    564-569; tests/support/engine_fixtures.py ``sglang_pd_request``). The decode root (the answer) carries the
    request; the prefill root with the same room is its partner. Read from the spans' bytes, and only when a
    trace holds more than one SGLang root."""
    roots = [span for span in engines if span.observation is not None
             and span.observation.engine_kind == EngineKind.SGLANG and not span.observation.part]
    if len(roots) < 2:
        return {}
    by_room: dict[str, dict[str, BufferedSpan]] = {}
    for span in roots:
        parsed = Span.FromString(span.payload)
        role = parsed.name.split(" Req ", 1)[0] if " Req " in parsed.name else ""
        if role not in ("prefill", "decode"):
            continue
        room = next((a.value.string_value or str(a.value.int_value) for a in parsed.attributes
                     if a.key == "bootstrap_room"), "")
        if room:
            by_room.setdefault(room, {}).setdefault(role, span)
    return {pair["decode"].span_id: pair["prefill"] for pair in by_room.values() if len(pair) == 2}


_HOLDING_KINDS = frozenset({EngineKind.DYNAMO, EngineKind.LLM_D})
# The kinds whose span is a caller's (an app's GenAI span) or a frontend's holding the engines' requests
# (Dynamo, llm-d): what the spans joined with it name comes before their resource (_resolve_model).
_CALLER_FIRST_KINDS = frozenset({EngineKind.GENAI, *_HOLDING_KINDS})


def _join_server_side(record: RequestRecord, obs: EngineObservation, joined: Joined, settings: RecordSettings,
                      rejected: list[str]) -> None:
    if record.outcome == Outcome.UNKNOWN and not obs.finish_reason:
        # vLLM V1 reports no finish reason; the client or gateway that got the response does.
        reason = None
        for span in joined.lookup:  # loops, not generators, on this per-request path
            observed = span.observation
            if observed is not None and observed.finish_reason:
                reason = observed.finish_reason
                break
        if reason:
            record.outcome = _FINISH_REASONS.get(reason.lower(), Outcome.UNKNOWN)
    failed_gateway = None
    for gateway in joined.servers:
        if gateway.status_code == _ERROR:
            failed_gateway = gateway
            break
    if failed_gateway is not None and record.outcome != Outcome.ERROR:
        # The client got an error from the edge: that is the request's outcome, whatever the engine saw.
        record.outcome = Outcome.ERROR
        record.error_type = _text(failed_gateway, "error.type") or _OTHER_ERROR
    measured_by_engine = obs.engine_kind != EngineKind.GENAI and record.e2e_s is not None
    if joined.servers:
        edge = joined.servers[-1]
        record.edge_span_id = edge.span_id
        edge_duration = _span_seconds(edge, settings, rejected)
        if measured_by_engine and edge_duration is not None:
            assert record.e2e_s is not None
            record.gateway_overhead_s = _overhead(edge_duration - record.e2e_s, "negative_gateway_overhead", rejected)
        record.edge_ttft_s = _edge_ttft(edge, settings, rejected)
    if joined.client is not None:
        record.joined_span_id = joined.client.span_id
        client_duration = _span_seconds(joined.client, settings, rejected)
        if measured_by_engine and client_duration is not None:
            assert record.e2e_s is not None
            record.client_overhead_s = _overhead(client_duration - record.e2e_s, "negative_client_overhead", rejected)


def _overhead(value: float, reason: str, rejected: list[str]) -> float | None:
    """A caller's duration minus the engine's e2e. Negative means the caller's span does not cover
    the call (Logfire's streaming span ends when create() returns; another host's clock): not
    measurable for this request, counted, never a made-up 0."""
    if value >= 0.0:
        return value
    rejected.append(reason)
    return None


def _unanswered_record(buffered: BufferedSpan, joined: Joined, settings: RecordSettings) -> RequestRecord:
    """A GenAI SERVER span with no engine span joined to it that failed (error) or never reported a
    response (a client abort: vLLM emits no span for those)."""
    record = build_record(buffered, joined, settings)
    record.outcome = Outcome.ERROR if buffered.observation and buffered.observation.is_error else Outcome.ABORT
    if record.outcome == Outcome.ABORT:
        record.error_type = "aborted"
    record.engine_kind = EngineKind.GENAI
    record.edge_span_id = (joined.servers[-1] if joined.servers else buffered).span_id
    return record


def _has_response(obs: EngineObservation) -> bool:
    return bool(obs.response_model or obs.completion_tokens is not None or obs.finish_reason or obs.ttft_s is not None)


def _client_record(buffered: BufferedSpan, trace: PendingTrace, served: RequestRecord | None,
                   settings: RecordSettings) -> RequestRecord:
    joined = join_ancestors(buffered, trace)
    record = build_record(buffered, joined, settings, side=Side.CLIENT)
    if served is not None:
        record.joined_span_id = served.span_id
        if not record.request_model and served.request_model and served.model_source != Source.DEFAULT:
            record.request_model = served.request_model
        if record.model_source in (NO_MODEL_SOURCE, Source.DEFAULT) and served.model_source not in (
                NO_MODEL_SOURCE, Source.DEFAULT):
            record.model, record.model_source = served.model, "engine:" + served.model_source
    return record


def _simple_request(trace: PendingTrace) -> tuple[BufferedSpan, Joined] | None:
    """The engine span and its join for the shapes most traffic has, told from one look at the trace:
    one engine span and no GenAI span, the engine span a root (or the trace's only span); or one
    engine span directly under the trace's only GenAI span, a SERVER span (a gateway) with no parent
    in the trace. Other spans may be there if no adapter claimed them or they are parts of the
    engine's request (composite.py reads those). ``None`` for any other shape: the general joining
    (``_records_of_any_trace``) reads it.

    What the general joining makes of these shapes, without its index and sets: a root engine span
    has no ancestors and no siblings; a lone span's parent has no child but itself, which no join
    takes; under the gateway, the engine's ancestors are that SERVER span alone, which holds every
    GenAI span of the trace, so it is the request's only gateway and only lookup, and no request of
    its own."""
    spans = trace.spans
    engine: BufferedSpan | None = None
    gateway: BufferedSpan | None = None
    for span in spans.values():
        obs = span.observation
        if obs is None or obs.part:
            continue
        if obs.may_be_gateway:
            if gateway is not None:
                return None
            gateway = span
        elif engine is None:
            engine = span
        else:
            return None
    if engine is None:
        return None
    if gateway is None:
        parent = engine.parent_span_id
        if parent and (len(spans) > 1 or parent == engine.span_id):
            return None
        return engine, Joined([], [], None)
    if (gateway.kind != _SERVER or engine.parent_span_id != gateway.span_id
            or gateway.parent_span_id in spans):  # in spans: a cycle, or a span above the gateway
        return None
    lookup = [gateway]
    return engine, Joined(lookup, lookup, None)


def native_record_builder(settings: RecordSettings, extension: Any) -> Any:
    """The compiled core's ``RecordBuilder`` for these settings, or ``None`` where they ask for what
    only Python reads (extra dimensions, a tenant, LoRA adapters) or there is no core. It builds the
    record of the shapes ``_simple_request`` takes from the core's own spans and observations, by
    this module's rules, and declines everything else (``rust/src/records.rs``). Its records are the
    core's ``RequestRecord`` (``rust/src/record.rs``): the dataclass's fields and equality, read by
    index where the core reads them."""
    if extension is None or settings.dimensions or settings.tenant is not None or settings.lora_adapters:
        return None
    return extension.RecordBuilder(
        list(_RECORD_FIELDS), Segment, list(settings.edge_ttft_attributes), FIRST_TOKEN_EVENT,
        settings.max_latency_s, settings.default_operation, sorted(GENAI_OPERATIONS), list(_ROUTE_OPERATIONS.items()),
        list(_FINISH_REASONS.items()), sorted(_COMPOSITE_KINDS),
        [(rule.attribute, rule.values) for rule in settings.resource_model_rules], settings.model_from_service_name,
        settings.default_model, MAX_ADJUSTED_COUNT, (Outcome.ERROR, Outcome.LENGTH, Outcome.UNKNOWN),
        Side.SERVER, Source.DEFAULT, EngineKind.GENAI, _OTHER_ERROR,
        (EngineKind.SGLANG, Part.SGLANG_STAGE, Outcome.ABORT, composite.ABORTED_ERROR_TYPE,
         list(composite._PREPROCESS_STAGES), list(composite._KV_STAGES), composite.QUEUE_AND_PREFILL,
         composite.KV_TRANSFER, composite.MAX_PARTS, sys.version_info >= (3, 12),  # 3.12's sum() compensates
         [sglang_stage_observation(name) for name in sorted(SGLANG_STAGES)]))


def records_of_trace(trace: PendingTrace, settings: RecordSettings,
                     malformed: list[tuple[str, str]] | None = None, native: Any = None) -> list[RequestRecord]:
    """Server records (engine requests, then gateway-only requests), then client records.

    A request whose spans cannot make one (composite.py) gives no record; its reason is appended to
    ``malformed``, for ``otel_llm_spans_malformed_total``. ``native``: ``native_record_builder``'s,
    which reads the common shapes first."""
    if native is not None:
        record = native.build(trace.spans)
        if record is not None:
            return [record]
    simple = _simple_request(trace)
    if simple is None:
        return _records_of_any_trace(trace, settings, malformed)
    engine, joined = simple
    try:
        return [build_record(engine, joined, settings, trace=trace)]
    except MalformedSpan as exc:
        if malformed is not None:
            malformed.append((exc.reason, engine.service_name))
        return []


def _records_of_any_trace(trace: PendingTrace, settings: RecordSettings,
                          malformed: list[tuple[str, str]] | None) -> list[RequestRecord]:
    """``records_of_trace`` for a trace of any shape: the reference the fast path must agree with."""
    engines: list[BufferedSpan] = []
    server_genai: list[BufferedSpan] = []
    clients: list[BufferedSpan] = []
    for buffered in trace.spans.values():
        obs = buffered.observation
        if obs is None:
            continue
        if obs.part:
            continue  # read from its request's root (composite.py)
        if not obs.may_be_gateway:
            engines.append(buffered)
        elif buffered.kind == _SERVER:
            server_genai.append(buffered)
        else:
            clients.append(buffered)
    records: list[RequestRecord] = []
    index = _TraceIndex(trace)
    joined_ids: set[bytes] = set()
    genai_in_trace = len(server_genai) + len(clients)
    absorbed: set[bytes] = set()
    inner: list[BufferedSpan] = []
    partners: dict[bytes, BufferedSpan] = {}
    if len(engines) > 1:
        # A Dynamo or llm-d request holds the engine spans of its workers: one request, not one per worker.
        if any(e.observation is not None and e.observation.engine_kind in _HOLDING_KINDS for e in engines):
            inner = [e for e in engines
                     if e.observation is not None and e.observation.engine_kind not in _HOLDING_KINDS]
            absorbed.update(e.span_id for e in inner)
        partners = _pair_disaggregated(engines)
        partners.update(_pair_sglang_pd(engines))
        absorbed.update(span.span_id for span in partners.values())
    for buffered in engines:
        if buffered.span_id in absorbed:
            continue
        joined = join_engine(buffered, trace, index, genai_in_trace)
        joined_ids.update(span.span_id for span in joined.lookup)
        try:
            records.append(build_record(buffered, joined, settings, trace=trace,
                                        partner=partners.get(buffered.span_id), inner=inner))
        except MalformedSpan as exc:
            if malformed is not None:
                malformed.append((exc.reason, buffered.service_name))
    if server_genai:
        # A GenAI SERVER span with another below it is that one's gateway, not a request of its own.
        for buffered in server_genai:
            if buffered.span_id not in joined_ids:
                joined_ids.update(a.span_id for a in trace.ancestors(buffered) if a.kind == _SERVER)
        for buffered in server_genai:
            if buffered.span_id in joined_ids:
                continue
            obs = buffered.observation
            assert obs is not None
            joined = join_ancestors(buffered, trace)
            answered = _has_response(obs) and not obs.is_error
            records.append((build_record if answered else _unanswered_record)(buffered, joined, settings))
    if clients:
        served_by_client = {r.joined_span_id: r for r in records if r.joined_span_id}
        for buffered in clients:
            if any(is_client_side(a) for a in trace.ancestors(buffered)):
                continue  # a nested client span is part of the outer call, counted once there
            records.append(_client_record(buffered, trace, served_by_client.get(buffered.span_id), settings))
    return records
