"""The adapter stage: an export request in, what the trace buffer keeps of each span out.

Per span: attribute limits, the engine adapter (``classify``) and its validation
(``derive_timings``), the few attributes assembly reads, and the span's own bytes.

The stage runs on the pipeline process's worker thread (``digest_in_process``). Figures:
``bench/hotpath.py``, ``bench/README.md``. (It once could run in a process of its own,
``service.adapter_process``; with the compiled core the pipe round trip cost more than it saved, and
that process was removed: CHANGELOG.md.)
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.pdata.attributes import buffered_value
from otel_llm.pdata.otlp_view import ExportTraceServiceRequest as ViewRequest, Span as ViewSpan
from otel_llm.processor.llm_metrics.adapters.engines import (
    _INTERNAL_NAMES, GENAI_OPERATIONS, LOGFIRE_AGENT_LLM_PREFIXES, SGLANG_STAGES, classify, may_be_llm,
    sglang_stage_observation)
from otel_llm.pdata.observation import OBSERVATION_FIELDS, EngineKind, EngineObservation, MalformedSpan, Part
from otel_llm.processor.llm_metrics.requests import adjusted_count
from otel_llm.processor.llm_metrics.segments import (
    ABS_TOLERANCE_S, MAX_TOKENS_PER_REQUEST, REL_TOLERANCE, derive_timings)
from otel_llm.pdata.spans import FIRST_TOKEN_EVENT, BufferedSpan, Origin
from otel_llm.processor.llm_metrics.config import LlmMetricsProcessor
from otel_llm.processor.redaction.config import RedactionProcessor
from otel_llm.internal import core as native_core
from google.protobuf.message import DecodeError

log = logging.getLogger(__name__)

_SERVER = Span.SPAN_KIND_SERVER
_INTERNAL = Span.SPAN_KIND_INTERNAL
_observation_tuple = operator.attrgetter(*OBSERVATION_FIELDS)


@dataclass(slots=True, frozen=True)
class AttributeLimits:
    """Bounds on one span's attributes, so a hostile span cannot hold megabytes in the trace buffer."""

    max_attributes: int
    max_value_bytes: int

    def exceeded_by(self, span: Span, serialized_size: int) -> bool:
        # Only spans that can break a limit are inspected attribute by attribute.
        return serialized_size > self.max_value_bytes or len(span.attributes) > self.max_attributes

    def _trim(self, attributes: Any) -> bool:
        changed = False
        if len(attributes) > self.max_attributes:
            del attributes[self.max_attributes:]
            changed = True
        for kv in attributes:
            value = kv.value
            if value.WhichOneof("value") == "string_value" and len(value.string_value) > self.max_value_bytes:
                value.string_value = value.string_value[: self.max_value_bytes]
                changed = True
            elif value.WhichOneof("value") in ("bytes_value", "array_value", "kvlist_value") and \
                    value.ByteSize() > self.max_value_bytes:
                value.string_value = f"<{value.ByteSize()} bytes removed by otel-llm>"
                changed = True
        return changed

    def enforce_resource(self, resource: Resource) -> bool:
        """The same bounds on a resource, which every buffered span of it shares."""
        if len(resource.attributes) <= self.max_attributes and resource.ByteSize() <= self.max_value_bytes:
            return False
        return self._trim(resource.attributes)

    def enforce(self, span: Span) -> bool:
        changed = self._trim(span.attributes)
        # A link's attributes as an event's: a span with one link of 250 000 attributes was held whole.
        children: list[Any] = [*span.events, *span.links]
        for child in children:
            if len(child.attributes) > self.max_attributes:
                del child.attributes[self.max_attributes:]
                changed = True
        return changed


@dataclass(slots=True, frozen=True)
class DigestSettings:
    limits: AttributeLimits
    max_latency_s: float
    kept_attribute_keys: tuple[str, ...]  # the attributes assembly reads at completion, nothing else
    first_token_events: frozenset[str]


def digest_settings(metrics: LlmMetricsProcessor, redaction: RedactionProcessor) -> DigestSettings:
    edge_attributes = tuple(metrics.edge_time_to_first_token.attributes)
    return DigestSettings(
        limits=AttributeLimits(redaction.max_attributes_per_span, redaction.max_attribute_value_bytes),
        max_latency_s=metrics.max_latency,
        kept_attribute_keys=tuple(dict.fromkeys((
            "gen_ai.request.model", "gen_ai.response.model", "http.route", "url.path", "error.type",
            *edge_attributes, *(d.attribute for d in metrics.dimensions), *metrics.tenant.attributes))),
        first_token_events=frozenset(metrics.edge_time_to_first_token.events),
    )


@dataclass(slots=True)
class DigestCounts:
    """Per request, so that a labelled counter is touched once per request, not once per span."""

    matched: dict[str, int]  # adapter -> spans
    malformed: dict[tuple[str, str], int]  # (reason, service name) -> spans
    passed_through: int = 0
    truncated: int = 0


RequestData = bytes | memoryview

# Spans that carry the same attributes for assembly (a model, a route, a tenant) hold one tuple of
# them, not a copy each (~90 B per span held); up to this many distinct tuples are shared.
SHARED_ATTRS_LIMIT = 4096
_shared_attrs: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def shared_attrs(attrs: tuple[Any, ...]) -> tuple[Any, ...]:
    """``attrs``, or the equal tuple an earlier span holds. Only all-string values are shared:
    tuple equality alone would let ``1``, ``1.0`` and ``True`` stand for one another."""
    if not attrs:
        return attrs
    try:
        shared = _shared_attrs.get(attrs)
    except TypeError:  # a list or map value (unhashable): held as it is
        return attrs
    if shared is not None:
        return shared
    if len(_shared_attrs) < SHARED_ATTRS_LIMIT and all(type(value) is str for value in attrs[1::2]):
        _shared_attrs[attrs] = attrs
    return attrs


def _as_data(request: RequestData | ExportTraceServiceRequest) -> RequestData:
    return request if isinstance(request, (bytes, memoryview)) else request.SerializeToString()


def _digest(data: RequestData, settings: DigestSettings, validated: bool = False) -> tuple[Any, ...]:
    """(spans, counts) of the export request ``data`` (ids already checked): ``BufferedSpan``
    objects, each with its ``Origin``.

    The request is read through ``otlp_view`` (attributes as a map, looked up in upb). A span over
    an attribute limit is trimmed on the request parsed as plain OTLP instead, so that the first
    ``max_attributes`` in the order received are the ones kept, and read back into the view.

    With the compiled core (``otel_llm.internal.core``) the request is walked in Rust instead
    (``_digest_native``); this function's body stays the reference it is tested against.
    ``validated``: the receiver process's core validated these very bytes, so the core's walk does
    not validate them again (the parse here checks as it parses either way)."""
    extension = native_core.active()[0]
    if extension is not None:
        return _digest_native(extension, data, settings, validated)
    request = ViewRequest()
    request.ParseFromString(data)
    upstream: ExportTraceServiceRequest | None = None  # parsed only if a span breaks a limit
    limits = settings.limits
    max_latency = settings.max_latency_s
    kept_keys = settings.kept_attribute_keys
    first_token_events = settings.first_token_events
    matched: dict[str, int] = {}
    malformed: dict[tuple[str, str], int] = {}
    passed_through = truncated = 0
    spans: list[Any] = []
    append = spans.append
    for resource_index, resource_spans in enumerate(request.resource_spans):
        resource = resource_spans.resource
        if limits.enforce_resource(resource):
            truncated += sum(len(scope_spans.spans) for scope_spans in resource_spans.scope_spans)
        resource_strings, service_name = _strings_of(resource)
        standalone = Resource()  # a standalone copy: a buffered span never pins its whole export request
        standalone.CopyFrom(resource)
        for scope_index, scope_spans in enumerate(resource_spans.scope_spans):
            scope = InstrumentationScope()
            scope.CopyFrom(scope_spans.scope)
            origin = Origin(standalone, scope, service_name, resource_strings)
            for span_index, span in enumerate(scope_spans.spans):
                payload = span.SerializeToString()  # buffered as is; its size is the cheap limit check
                if limits.exceeded_by(span, len(payload)):
                    if upstream is None:
                        upstream = ExportTraceServiceRequest()
                        upstream.ParseFromString(data)
                    original = upstream.resource_spans[resource_index].scope_spans[scope_index].spans[span_index]
                    if limits.enforce(original):
                        truncated += 1
                        payload = original.SerializeToString()
                        span = ViewSpan.FromString(payload)
                try:
                    observation, attrs = _read_checked(span, max_latency)
                except MalformedSpan as exc:
                    refusal = (exc.reason, service_name)
                    malformed[refusal] = malformed.get(refusal, 0) + 1
                    observation, attrs = None, {}
                    passed_through += 1
                else:
                    if observation is None:
                        passed_through += 1
                    else:
                        matched[observation.adapter] = matched.get(observation.adapter, 0) + 1
                kind = span.kind
                slim: tuple[Any, ...] = ()
                if attrs:
                    slim = tuple(item for key in kept_keys if key in attrs
                                 for item in (key, buffered_value(attrs[key])))
                if kind == _SERVER and span.events:
                    event_ns = next((e.time_unix_nano for e in span.events if e.name in first_token_events), 0)
                    if event_ns:
                        slim += (FIRST_TOKEN_EVENT, event_ns)
                fields = (span.trace_id, span.span_id, span.parent_span_id, kind, span.status.code,
                          span.start_time_unix_nano, span.end_time_unix_nano, span.trace_state, payload, origin,
                          shared_attrs(slim))
                append(BufferedSpan(*fields, observation))
    return spans, (matched, malformed, passed_through, truncated)


def _digest_native(extension: Any, data: RequestData, settings: DigestSettings,
                   validated: bool = False) -> tuple[Any, ...]:
    """``_digest`` with the request walked by the compiled core: one call returns every span's
    buffered fields and its bytes, so a span no adapter can claim (``may_be_llm``) is buffered
    without any protobuf object; for the candidates, ``classify`` reads the request parsed once into
    the view, as the Python path does (a span parsed alone costs ~8x more: an upb arena each).

    A span is buffered as the bytes received (attribute order as sent). The Python path buffers
    the view's re-serialization, whose map puts attributes in upb's hash order and keeps the last
    of a repeated key; a span with a repeated key, or one that may break an attribute limit, takes
    the Python path's steps here too, so the kept attributes are the same set in both.

    Most spans come back from the core's ``Digester.rows`` ready to buffer (made there, counted
    there); the loop below runs only for the positions it lists as the Python steps'."""
    if not isinstance(data, bytes):
        data = bytes(data)  # a memoryview; the core reads bytes
    made: list[Any] = []

    def make_origins(origin_rows: list[tuple[bytes, list[bytes]]]) -> tuple[list[Any], None]:
        made.extend(_origins(origin_rows, settings.limits))
        return made[1], None

    try:
        # ``False``: the core's rows as ``BufferedSpan`` objects (its ``portable`` form served the
        # removed adapter process's pipe).
        _, spans, slow, matched, passed_through = _digester(extension, settings).rows(data, False, make_origins,
                                                                                      validated)
    except ValueError as exc:  # the same bytes the view's parse refuses (tests/test_native_core.py)
        raise DecodeError(str(exc)) from None
    origins, flat_origins, service_names, truncated_resources = made
    truncated = sum(_spans_of_resource(spans, index, origins[index]) for index in truncated_resources)
    if not slow:  # every span ready to buffer (``Digester.rows``): the bench's, and most traffic
        return spans, (matched, {}, passed_through, truncated)
    limits = settings.limits
    max_attributes, max_value_bytes = limits.max_attributes, limits.max_value_bytes
    max_latency = settings.max_latency_s
    kept_keys = settings.kept_attribute_keys
    first_token_events = settings.first_token_events
    malformed: dict[tuple[str, str], int] = {}
    view_spans: list[list[Any]] | None = None  # the request as the view, parsed at the first candidate
    for position in slow:
        row = spans[position]
        (resource_index, scope_index, span_index, trace_id, span_id, parent_span_id, kind, status_code, start, end,
         trace_state, name, payload, attribute_count, duplicate_keys, read_by_core) = row
        span: Any = None
        slim: tuple[Any, ...] = ()
        if duplicate_keys or len(payload) > max_value_bytes or attribute_count > max_attributes:
            # The Python path's own steps: the view's bytes, its limit check, the trim on plain OTLP.
            received = payload
            span = ViewSpan.FromString(received)
            payload = span.SerializeToString()
            if limits.exceeded_by(span, len(payload)):
                original = Span.FromString(received)  # plain OTLP: attributes in the order received
                if limits.enforce(original):
                    truncated += 1
                    payload = original.SerializeToString()
                    span = ViewSpan.FromString(payload)
        service_name = service_names[resource_index]
        if span is None and kind == _INTERNAL and name in SGLANG_STAGES:
            # ``classify`` reads no attribute of an SGLang stage: its name and interval are the part.
            observation: EngineObservation | None = sglang_stage_observation(name)
            attrs = None
            matched[Part.SGLANG_STAGE] = matched.get(Part.SGLANG_STAGE, 0) + 1
        elif span is None and read_by_core is not None:  # read by the core (rust/src/lib.rs ``read_shape``)
            shape, observation_fields, slim, valid = read_by_core
            attrs = None
            if shape == "none":  # a candidate ``classify`` claims for no adapter
                observation = None
                passed_through += 1
            else:
                read = _NATIVE_READINGS[shape](*observation_fields)
                observation = read
                try:
                    if not valid:  # the core's bounds check failed: derive_timings names the refusal
                        derive_timings(read, max_latency)
                    if trace_state:
                        adjusted_count(trace_state)
                except MalformedSpan as exc:
                    refusal = (exc.reason, service_name)
                    malformed[refusal] = malformed.get(refusal, 0) + 1
                    observation, slim = None, ()
                    passed_through += 1
                else:
                    matched[read.adapter] = matched.get(read.adapter, 0) + 1
        elif span is None and not may_be_llm(kind, name):
            observation, attrs = None, None
            passed_through += 1
        else:
            if span is None:
                if view_spans is None:
                    request = ViewRequest()
                    request.ParseFromString(data)
                    view_spans = [[scope_spans.spans for scope_spans in resource_spans.scope_spans]
                                  for resource_spans in request.resource_spans]
                span = view_spans[resource_index][scope_index][span_index]
            try:
                observation, attrs = _read_checked(span, max_latency)
            except MalformedSpan as exc:
                refusal = (exc.reason, service_name)
                malformed[refusal] = malformed.get(refusal, 0) + 1
                observation, attrs = None, None
                passed_through += 1
            else:
                if observation is None:
                    passed_through += 1
                else:
                    matched[observation.adapter] = matched.get(observation.adapter, 0) + 1
        if attrs:
            slim = tuple(item for key in kept_keys if key in attrs for item in (key, buffered_value(attrs[key])))
        if kind == _SERVER and span is not None and span.events:
            event_ns = next((e.time_unix_nano for e in span.events if e.name in first_token_events), 0)
            if event_ns:
                slim += (FIRST_TOKEN_EVENT, event_ns)
        if span is not None:  # a trimmed span's fields are the trimmed view's (ids and times are never trimmed)
            trace_id, span_id, parent_span_id, status_code, trace_state = (
                span.trace_id, span.span_id, span.parent_span_id, span.status.code, span.trace_state)
        origin = origins[resource_index][scope_index]
        fields = (trace_id, span_id, parent_span_id, kind, status_code, start, end, trace_state, payload, origin,
                  shared_attrs(slim))
        spans[position] = _compact_span(extension, fields, observation)
    return spans, (matched, malformed, passed_through, truncated)


def _compact_span(extension: Any, fields: tuple[Any, ...], observation: EngineObservation | None) -> BufferedSpan:
    """The core's compact ``BufferedSpan`` (``rust/src/lib.rs`` ``Row``: the same attributes, ~200 B
    less held), as ``Digester.rows`` makes its ready spans; the dataclass for ids the receivers refuse."""
    try:
        return extension.BufferedSpan(*fields, observation)
    except ValueError:
        return BufferedSpan(*fields, observation)  # type: ignore[call-arg]  # fields: its first 11


def _strings_of(resource: Resource) -> tuple[dict[str, str], str]:
    """A resource's string attributes and its service name (``unknown_service`` without one)."""
    strings = {kv.key: kv.value.string_value for kv in resource.attributes if kv.value.HasField("string_value")}
    return strings, strings.get("service.name") or "unknown_service"


# A resource's bytes, within the attribute limits -> ``_strings_of`` it. Senders repeat a few
# resources in every request (7 distinct among the bench's 224), and reading their attributes
# through upb's wrappers again was 22 of the 36 µs that a bench request's origins took. The dicts
# are shared by every origin of those bytes, read only (``Origin.resource_strings``); cleared
# when full.
RESOURCE_STRINGS_LIMIT = 1024
_resource_strings: dict[bytes, tuple[dict[str, str], str]] = {}


def _origins(origin_rows: list[tuple[bytes, list[bytes]]], limits: AttributeLimits
             ) -> tuple[list[list[Any]], list[Any], list[str], list[int]]:
    """The request's origins from the core's (resource bytes, [scope bytes]) rows: per resource per
    scope, the same flattened in order, each resource's service name, and the resources trimmed to
    the attribute limits."""
    origins: list[list[Any]] = []  # per resource, per scope: an Origin
    flat_origins: list[Any] = []
    service_names: list[str] = []
    truncated_resources: list[int] = []
    for resource_index, (resource_bytes, scope_rows) in enumerate(origin_rows):
        resource = Resource()
        resource.ParseFromString(resource_bytes)
        if limits.enforce_resource(resource):
            truncated_resources.append(resource_index)
            resource_strings, service_name = _strings_of(resource)
        else:  # the same bytes, the same strings: read once per distinct resource, not per request
            known = _resource_strings.get(resource_bytes)
            if known is None:
                known = _strings_of(resource)
                if len(_resource_strings) >= RESOURCE_STRINGS_LIMIT:
                    _resource_strings.clear()
                _resource_strings[resource_bytes] = known
            resource_strings, service_name = known
        service_names.append(service_name)
        per_scope: list[Any] = []
        for scope_bytes in scope_rows:
            scope = InstrumentationScope()
            scope.ParseFromString(scope_bytes)
            per_scope.append(Origin(resource, scope, service_name, resource_strings))
        origins.append(per_scope)
        flat_origins += per_scope
    return origins, flat_origins, service_names, truncated_resources


def _spans_of_resource(spans: list[Any], resource_index: int, resource_origins: list[Any]) -> int:
    """How many of ``Digester.rows``' ``spans`` belong to the ``resource_index``-th resource, whose
    origins are ``resource_origins``: a ready span by its origin, a row the Python steps take (16
    fields) by its resource index."""
    ready = {id(origin) for origin in resource_origins}
    count = 0
    for span in spans:
        if not isinstance(span, tuple):  # a BufferedSpan, the dataclass or the core's
            count += id(span.origin) in ready
        else:
            count += span[0] == resource_index
    return count


_digester_cache: list[tuple[Any, DigestSettings, Any]] = []  # (extension, settings, its Digester): one entry


def _digester(extension: Any, settings: DigestSettings) -> Any:
    """The core's ``Digester`` for ``settings``: what ``rows`` needs of them and of the adapters'
    constants, converted once rather than on every request."""
    if _digester_cache and _digester_cache[0][0] is extension and _digester_cache[0][1] is settings:
        return _digester_cache[0][2]
    stages = [(name, sglang_stage_observation(name), _observation_tuple(sglang_stage_observation(name)))
              for name in sorted(SGLANG_STAGES)]
    slots = frozenset(EngineObservation.__slots__)
    # A field held as a class default is set only where the value differs (``EngineObservation.__init__``).
    observation_fields = [(name, name not in slots, getattr(EngineObservation, name, None))
                          for name in OBSERVATION_FIELDS]
    span_fields = [field.name for field in dataclasses.fields(BufferedSpan)]
    digester = extension.Digester(
        list(settings.kept_attribute_keys),
        (settings.max_latency_s, MAX_TOKENS_PER_REQUEST, ABS_TOLERANCE_S, REL_TOLERANCE),
        settings.limits.max_attributes, settings.limits.max_value_bytes, EngineObservation, stages,
        Part.SGLANG_STAGE, sorted(_INTERNAL_NAMES), sorted(GENAI_OPERATIONS), list(LOGFIRE_AGENT_LLM_PREFIXES),
        object.__new__, observation_fields, BufferedSpan, span_fields, _shared_attrs, SHARED_ATTRS_LIMIT)
    _digester_cache[:] = [(extension, settings, digester)]
    return digester


def _vllm_observation(ttft: float | None, e2e: float | None, queue: float | None, prefill: float | None,
                      decode: float | None, inference: float | None, prompt: int | None, completion: int | None,
                      max_tokens: int | None, request_model: str | None, response_model: str | None,
                      operation: str | None, server_address: str | None, server_port: str | None,
                      cached: int | None, finish_reason: str | None) -> EngineObservation:
    """``adapters.engines._vllm``'s observation from the values the core read (``rust/src/lib.rs``
    ``read_vllm``: a span with ``time_in_model_inference``, hence ``vllm_v1``; no events, no error:
    those spans are the Python adapter's)."""
    return EngineObservation(
        engine_kind=EngineKind.VLLM, adapter="vllm_v1", ttft_s=ttft, e2e_s=e2e, queue_s=queue, prefill_s=prefill,
        decode_s=decode, inference_s=inference, prompt_tokens=prompt, completion_tokens=completion,
        max_tokens=max_tokens, request_model=request_model, response_model=response_model,
        finish_reason=finish_reason, operation_name=operation, provider_name="vllm", server_address=server_address,
        server_port=server_port, is_error=False, error_type=None, cached_tokens=cached, itl_s=())


def _sglang_observation(ttft: float | None, e2e: float | None, queue: float | None, decode: float | None,
                        prompt: int | None, completion: int | None, cached: int | None,
                        dispatch_to_first: float | None, max_tokens: int | None, request_model: str | None,
                        response_model: str | None, finish_reason: str | None, is_error: bool,
                        error_type: str | None) -> EngineObservation:
    """``adapters.engines._sglang``'s observation from the values the core read (``read_sglang``)."""
    return EngineObservation(
        engine_kind=EngineKind.SGLANG, adapter="sglang", ttft_s=ttft, e2e_s=e2e, queue_s=queue, decode_s=decode,
        prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
        marks=("dispatch_to_first_token_s", dispatch_to_first) if dispatch_to_first is not None else (),
        max_tokens=max_tokens, request_model=request_model, response_model=response_model,
        finish_reason=finish_reason, provider_name="sglang", is_error=is_error, error_type=error_type)


def _tgi_observation(total: float | None, validation: float | None, queue: float | None, inference: float | None,
                     operation: str, is_error: bool, error_type: str | None) -> EngineObservation:
    """``adapters.engines._tgi``'s observation from the values the core read (``read_tgi``)."""
    return EngineObservation(
        engine_kind=EngineKind.TGI, adapter="tgi", e2e_s=total, preprocess_s=validation, queue_s=queue,
        inference_s=inference, operation_name=operation, provider_name="tgi", is_error=is_error,
        error_type=error_type)


def _genai_observation(ttft: float | None, prompt: int | None, completion: int | None, max_tokens: int | None,
                       request_model: str | None, response_model: str | None, finish_reason: str | None,
                       operation: str | None, provider: str | None, server_address: str | None,
                       server_port: str | None, is_error: bool, error_type: str | None, cached: int | None,
                       cache_written: int | None, reasoning: int | None) -> EngineObservation:
    """``adapters.engines._genai``'s observation from the values the core read (``read_genai``: no
    speculative-decoding keys, no events)."""
    return EngineObservation(
        engine_kind=EngineKind.GENAI, adapter="genai", ttft_s=ttft, prompt_tokens=prompt,
        completion_tokens=completion, max_tokens=max_tokens, request_model=request_model,
        response_model=response_model, finish_reason=finish_reason, operation_name=operation,
        provider_name=provider, server_address=server_address, server_port=server_port, is_error=is_error,
        error_type=error_type, may_be_gateway=True, cached_tokens=cached, cache_write_tokens=cache_written,
        spec_decode=None, reasoning_tokens=reasoning)


# The core's shape name -> the observation its fields make (rust/src/lib.rs ``read_shape``).
_NATIVE_READINGS: dict[str, Callable[..., EngineObservation]] = {
    "vllm_v1": _vllm_observation, "sglang": _sglang_observation, "tgi": _tgi_observation,
    "genai": _genai_observation}


def _counts(counts: tuple[Any, ...]) -> DigestCounts:
    matched, malformed, passed_through, truncated = counts
    return DigestCounts(matched, malformed, passed_through, truncated)


def _read_checked(span: Any, max_latency: float) -> tuple[Any, Any]:
    """``classify`` and the checks a request span must pass (its latencies, its sampling weight): both
    the view path and the core's hand-back take this; raises ``MalformedSpan``."""
    observation, attrs = classify(span)
    if observation is not None and not observation.part:
        derive_timings(observation, max_latency)
        if span.trace_state:
            adjusted_count(span.trace_state)  # a weight nobody sane chose is malformed
    return observation, attrs


def digest_in_process(request: RequestData | ExportTraceServiceRequest, settings: DigestSettings,
                      validated: bool = False) -> tuple[list[BufferedSpan], DigestCounts]:
    """The adapter stage on ``request`` (ids already checked): what the trace buffer keeps of each
    span, and the counts. ``validated``: bytes the receiver process's compiled core validated
    (``process.VALIDATED``), so the core's walk does not validate them again."""
    spans, counts = _digest(_as_data(request), settings, validated=validated)
    return spans, _counts(counts)
