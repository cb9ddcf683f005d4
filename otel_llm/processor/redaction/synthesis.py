"""A kept trace as it leaves otel-llm: the original spans, each engine span enriched with the
``gen_ai`` bridge attributes and given synthesized segment child spans.

Segment span ids are a hash of (trace id, engine span id, segment name), so replaying the same
input yields the same spans, never duplicates.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from otel_llm.pdata.records import RequestRecord, Segment, Side, Source
from otel_llm.pdata.spans import BufferedSpan

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
    """The gen_ai bridge attributes beside the engine's own legacy ones: only what a span of the
    trace said or the configured model mapping gave, never a configured default."""
    if policy:
        _set(span, POLICY_ATTRIBUTE, policy)
    _set(span, "otel_llm.outcome", record.outcome)
    _set(span, "otel_llm.model_source", record.model_source)  # which rule fired, "none" or "default" included
    if record.side == Side.CLIENT:
        return  # a client span already carries its own gen_ai attributes
    if record.prompt_tokens is not None:
        _set(span, "gen_ai.usage.input_tokens", record.prompt_tokens)
    if record.completion_tokens is not None:
        _set(span, "gen_ai.usage.output_tokens", record.completion_tokens)
    if record.provider_name:
        _set(span, "gen_ai.provider.name", record.provider_name)
    if record.operation_source != Source.DEFAULT:
        _set(span, "gen_ai.operation.name", record.operation_name)
    if record.request_model:
        _set(span, "gen_ai.request.model", record.request_model)
    if record.tpot_s is not None:
        _set(span, "otel_llm.time_per_output_token", record.tpot_s)
    # What the engine did not measure for this request, and what was derived rather than measured.
    if record.segments_missing:
        _set(span, "otel_llm.segments_missing", ",".join(record.segments_missing))
    if record.segments_derived:
        _set(span, "otel_llm.segments_derived", ",".join(record.segments_derived))
    if record.not_measurable:
        _set(span, "otel_llm.not_measurable", ",".join(record.not_measurable))
    if record.gateway_overhead_s is not None:
        _set(span, "otel_llm.gateway_overhead", record.gateway_overhead_s)
    if record.client_overhead_s is not None:
        _set(span, "otel_llm.client_overhead", record.client_overhead_s)


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


GENAI_KEY_PREFIXES = ("gen_ai.", "llm.", "openinference.", "traceloop.")


def _is_free_text(value: AnyValue, limit: int) -> bool:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        text = value.string_value
        # A character is 1-4 bytes in UTF-8: most strings are decided without encoding them.
        return len(text) > limit or (len(text) * 4 > limit and len(text.encode()) > limit)
    if kind in ("array_value", "kvlist_value", "bytes_value"):
        return value.ByteSize() > limit
    return False


@dataclass(slots=True)
class RedactionCounts:
    content_keys: int = 0  # attributes removed by a content key rule
    free_text: int = 0  # long text values removed from GenAI spans
    content_events: int = 0  # attributes of content events removed
    not_allowed: int = 0  # text under a key that is not known metadata (the allowlist)
    url_reduced: int = 0  # URLs kept without their query, fragment and userinfo

    def __iadd__(self, other: RedactionCounts) -> RedactionCounts:
        self.content_keys += other.content_keys
        self.free_text += other.free_text
        self.content_events += other.content_events
        self.not_allowed += other.not_allowed
        self.url_reduced += other.url_reduced
        return self

    def by_reason(self) -> tuple[tuple[str, int], ...]:
        return (("content_key", self.content_keys), ("free_text", self.free_text),
                ("content_event", self.content_events), ("not_allowed", self.not_allowed),
                ("url_reduced", self.url_reduced))


REDACTION_REASONS = ("content_key", "free_text", "content_event", "not_allowed", "url_reduced")
_SCALARS = frozenset({"int_value", "double_value", "bool_value", None})


def reduced_url(url: str) -> str:
    """A URL without what can carry content or secrets: userinfo, query and fragment."""
    cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=len(url))
    url = url[:cut]
    scheme_end = url.find("://")
    if scheme_end >= 0:
        authority_end = url.find("/", scheme_end + 3)
        authority_end = len(url) if authority_end < 0 else authority_end
        at = url.rfind("@", scheme_end + 3, authority_end)
        if at >= 0:
            url = url[:scheme_end + 3] + url[at + 1:]
    return url


@dataclass(frozen=True, slots=True)
class Redaction:
    """Prompt and completion content removed from every span that leaves otel-llm.

    The allowlist first: on span, event and link attributes, a number or a boolean is kept under
    any key; text (a string, an array, a map, bytes) only under a key of ``metadata_keys`` (what
    otel-llm reads, the conventions' non-content keys) or ``allowed_keys`` (exact, or ``*`` globs);
    a URL without its query and userinfo. So privacy does not depend on anyone having seen the
    instrumentation. Then, as extra layers, the block lists: keys of known content attributes
    (prefixes and ``*`` globs), attributes of content events, and any text longer than
    ``max_free_text_bytes`` on a GenAI span unless its key is allowed.
    """

    key_prefixes: tuple[str, ...] = ()
    key_patterns: tuple[str, ...] = ()
    event_names: frozenset[str] = frozenset()
    max_free_text_bytes: int = 0  # 0: no free-text rule
    allowed_keys: frozenset[str] = frozenset()
    allowed_patterns: tuple[str, ...] = ()  # allowed_keys entries with "*"
    metadata_keys: frozenset[str] | None = None  # None: no allowlist (allow_content)
    url_keys: frozenset[str] = frozenset()
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)
    _allowed_pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.key_patterns:
            regex = "|".join(fnmatch.translate(p) for p in self.key_patterns)
            object.__setattr__(self, "_pattern", re.compile(regex))
        if self.allowed_patterns:
            regex = "|".join(fnmatch.translate(p) for p in self.allowed_patterns)
            object.__setattr__(self, "_allowed_pattern", re.compile(regex))

    def _allowed(self, key: str) -> bool:
        return key in self.allowed_keys or (self._allowed_pattern is not None
                                            and self._allowed_pattern.match(key) is not None)

    def _blocked(self, key: str) -> bool:
        if self.key_prefixes and key.startswith(self.key_prefixes):
            return True
        return self._pattern is not None and self._pattern.match(key) is not None

    def _strip(self, attributes: Any, genai: bool, counts: RedactionCounts) -> None:
        limit = self.max_free_text_bytes if genai else 0
        metadata = self.metadata_keys
        remove: set[int] = set()
        for position, kv in enumerate(attributes):
            key = kv.key
            if self._allowed(key):
                continue
            if self._blocked(key):
                counts.content_keys += 1
                remove.add(position)
                continue
            if metadata is not None and kv.value.WhichOneof("value") not in _SCALARS:
                if key not in metadata:
                    counts.not_allowed += 1
                    remove.add(position)
                    continue
                if key in self.url_keys and kv.value.WhichOneof("value") == "string_value":
                    url = reduced_url(kv.value.string_value)
                    if url != kv.value.string_value:
                        kv.value.string_value = url
                        counts.url_reduced += 1
            if limit and _is_free_text(kv.value, limit):
                counts.free_text += 1
                remove.add(position)
        if remove:
            keep = [KeyValue(key=kv.key, value=kv.value) for i, kv in enumerate(attributes) if i not in remove]
            del attributes[:]
            attributes.extend(keep)

    def apply(self, span: Span) -> RedactionCounts:
        counts = RedactionCounts()
        genai = bool(self.max_free_text_bytes) and any(kv.key.startswith(GENAI_KEY_PREFIXES) for kv in span.attributes)
        self._strip(span.attributes, genai, counts)
        for event in span.events:
            if event.name in self.event_names:
                counts.content_events += len(event.attributes)
                del event.attributes[:]
            else:
                self._strip(event.attributes, genai, counts)
        if self.metadata_keys is not None:
            for link in span.links:
                self._strip(link.attributes, genai, counts)
        return counts


NO_REDACTION = Redaction()


def kept_trace_request(
    spans: list[BufferedSpan], records: list[RequestRecord], policy: str, threshold: str,
    redaction: Redaction = NO_REDACTION, redacted: RedactionCounts | None = None,
) -> tuple[ExportTraceServiceRequest, int]:
    """The request to export/store, and how many spans it holds; what redaction removed is added to ``redacted``."""
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
        removed = redaction.apply(span)
        if redacted is not None:
            redacted += removed
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
