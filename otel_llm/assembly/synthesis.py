"""A kept trace as it leaves otel-llm: the original spans, each engine span enriched with the
``gen_ai`` bridge attributes and given synthesized segment child spans.

Segment span ids are a hash of (trace id, engine span id, segment name), so replaying the same
input yields the same spans, never duplicates.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from otel_llm.assembly.records import RequestRecord, Segment
from otel_llm.assembly.traces import BufferedSpan

SCOPE_NAME = "otel-llm"
SEGMENT_ATTRIBUTE = "otel_llm.segment"
POLICY_ATTRIBUTE = "otel_llm.sampling.policy"


def segment_span_id(trace_id: bytes, engine_span_id: bytes, name: str) -> bytes:
    digest = hashlib.blake2b(trace_id + engine_span_id + name.encode(), digest_size=8).digest()
    return digest if any(digest) else b"\x00" * 7 + b"\x01"  # the all-zero id is invalid


def _set(span: Span, key: str, value: str | int | float) -> None:
    for kv in span.attributes:
        if kv.key == key:
            break
    else:
        kv = span.attributes.add()
        kv.key = key
    if isinstance(value, bool) or isinstance(value, str):
        kv.value.string_value = str(value)
    elif isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.double_value = value


def enrich(span: Span, record: RequestRecord, policy: str) -> None:
    """The gen_ai bridge attributes beside the engine's own legacy ones."""
    if record.prompt_tokens is not None:
        _set(span, "gen_ai.usage.input_tokens", record.prompt_tokens)
    if record.completion_tokens is not None:
        _set(span, "gen_ai.usage.output_tokens", record.completion_tokens)
    _set(span, "gen_ai.provider.name", record.provider_name)
    _set(span, "gen_ai.operation.name", record.operation_name)
    _set(span, "gen_ai.request.model", record.request_model)
    _set(span, "otel_llm.model_source", record.model_source)
    _set(span, "otel_llm.outcome", record.outcome)
    if record.tpot_s is not None:
        _set(span, "otel_llm.time_per_output_token", record.tpot_s)
    if record.gateway_overhead_s is not None:
        _set(span, "otel_llm.gateway_overhead", record.gateway_overhead_s)
    if policy:
        _set(span, POLICY_ATTRIBUTE, policy)


def add_segment_span(into: ScopeSpans, trace_id: bytes, engine_span_id: bytes, segment: Segment) -> Span:
    span = into.spans.add(
        trace_id=trace_id,
        span_id=segment_span_id(trace_id, engine_span_id, segment.name),
        parent_span_id=engine_span_id,
        name=segment.name,
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=segment.start_unix_ns,
        end_time_unix_nano=segment.end_unix_ns,
    )
    span.attributes.append(KeyValue(key=SEGMENT_ATTRIBUTE))
    span.attributes[0].value.string_value = segment.name
    return span


def with_trace_state(span: Span, threshold: str) -> None:
    """Record the probability the trace was kept with, as an OTel ``ot=th:`` threshold."""
    if threshold in ("", "0"):
        return
    members = [m for m in span.trace_state.split(",") if m and not m.startswith("ot=")]
    span.trace_state = ",".join([f"ot=th:{threshold}", *members])


def _strip_keys(attributes: Any, prefixes: tuple[str, ...]) -> int:
    """Remove attributes whose key starts with one of ``prefixes``; returns how many."""
    if not prefixes or not any(kv.key.startswith(prefixes) for kv in attributes):
        return 0
    keep = [KeyValue(key=kv.key, value=kv.value) for kv in attributes if not kv.key.startswith(prefixes)]
    removed = len(attributes) - len(keep)
    del attributes[:]
    attributes.extend(keep)
    return removed


@dataclass(frozen=True, slots=True)
class Redaction:
    """Content attributes and events removed from every span that leaves otel-llm."""

    key_prefixes: tuple[str, ...] = ()
    event_names: frozenset[str] = frozenset()

    def apply(self, span: Span) -> int:
        removed = _strip_keys(span.attributes, self.key_prefixes)
        for event in span.events:
            if event.name in self.event_names:
                removed += len(event.attributes)
                del event.attributes[:]
            else:
                removed += _strip_keys(event.attributes, self.key_prefixes)
        return removed


NO_REDACTION = Redaction()


def kept_trace_request(
    spans: list[BufferedSpan], records: list[RequestRecord], policy: str, threshold: str,
    redaction: Redaction = NO_REDACTION,
) -> tuple[ExportTraceServiceRequest, int]:
    """The request to export/store, and how many spans it holds."""
    by_span = {r.span_id: r for r in records}
    request = ExportTraceServiceRequest()
    groups: dict[tuple[int, int], ScopeSpans] = {}
    resources: dict[int, ResourceSpans] = {}
    count = 0
    synthesized: dict[int, ScopeSpans] = {}  # per resource: segment spans belong to their engine's process
    for buffered in spans:
        resource_key = id(buffered.resource)
        resource_spans = resources.get(resource_key)
        if resource_spans is None:
            resource_spans = resources[resource_key] = request.resource_spans.add()
            resource_spans.resource.CopyFrom(buffered.resource)
        group_key = (resource_key, id(buffered.scope))
        scope_spans = groups.get(group_key)
        if scope_spans is None:
            scope_spans = groups[group_key] = resource_spans.scope_spans.add()
            scope_spans.scope.CopyFrom(buffered.scope)
        span = scope_spans.spans.add()
        span.MergeFromString(buffered.payload)
        redaction.apply(span)
        with_trace_state(span, threshold)
        count += 1
        record = by_span.get(span.span_id)
        if record is None:
            continue
        enrich(span, record, policy)
        if record.segments:
            into = synthesized.get(resource_key)
            if into is None:
                into = synthesized[resource_key] = resource_spans.scope_spans.add()
                into.scope.name = SCOPE_NAME
            for segment in record.segments:
                with_trace_state(add_segment_span(into, span.trace_id, span.span_id, segment), threshold)
                count += 1
    return request, count
