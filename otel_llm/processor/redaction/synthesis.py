"""A kept trace as it leaves otel-llm: the original spans, each engine span enriched with the
``gen_ai`` bridge attributes and given synthesized segment child spans.

Segment span ids are a hash of (trace id, engine span id, segment name), so replaying the same
input yields the same spans, never duplicates.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import struct
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from otel_llm.pdata.attributes import any_value_to_python
from otel_llm.pdata.records import RequestRecord, Segment, Side, Source
from otel_llm.pdata.span_rows import (
    INT64_MAX, SpanRow, attribute_values, encode_json, service_name_of, span_row)
from otel_llm.pdata.spans import BufferedSpan
from otel_llm.processor.redaction.config import STATUS_MESSAGE_KEY

SCOPE_NAME = "otel-llm"
SEGMENT_ATTRIBUTE = "otel_llm.segment"
POLICY_ATTRIBUTE = "otel_llm.sampling.policy"


def segment_span_id(trace_id: bytes, engine_span_id: bytes, name: str) -> bytes:
    digest = hashlib.blake2b(trace_id + engine_span_id + name.encode(), digest_size=8).digest()
    return digest if any(digest) else b"\x00" * 7 + b"\x01"  # the all-zero id is invalid


class _Attributes:
    """A span's attributes set by key, as OTLP consumers read a repeated key: the first attribute of
    that key is overwritten, else one is appended. Each position is looked up once, not per key set."""

    __slots__ = ("_attributes", "_positions", "_values")

    def __init__(self, span: Span, values: dict[str, Any] | None = None) -> None:
        """``values``, when given, is ``attribute_values`` of the span's attributes, none of whose
        keys repeats; it is kept equal to what ``attribute_values`` reads after each key set."""
        self._attributes = span.attributes
        self._values = values
        positions: dict[str, int] = {}
        if values is not None:
            positions = {key: position for position, key in enumerate(values)}
        else:
            for position, kv in enumerate(self._attributes):
                positions.setdefault(kv.key, position)
        self._positions = positions

    def __setitem__(self, key: str, value: str | int | float) -> None:
        attributes = self._attributes
        position = self._positions.get(key)
        if position is None:
            self._positions[key] = len(attributes)
            kv = attributes.add(key=key)
        else:
            kv = attributes[position]
        if type(value) is str or isinstance(value, (bool, str)):
            value = str(value)
            kv.value.string_value = value
        elif isinstance(value, int):
            kv.value.int_value = value
        else:
            kv.value.double_value = value
            value = kv.value.double_value
        if self._values is not None:
            self._values[key] = value


def enrich(span: Span, record: RequestRecord, policy: str, values: dict[str, Any] | None = None) -> None:
    """The gen_ai bridge attributes beside the engine's own legacy ones: only what a span of the
    trace said or the configured model mapping gave, never a configured default. ``values``: see
    ``_Attributes``."""
    attributes = _Attributes(span, values)
    if policy:
        attributes[POLICY_ATTRIBUTE] = policy
    attributes["otel_llm.outcome"] = record.outcome
    attributes["otel_llm.model_source"] = record.model_source  # which rule fired, "none" or "default" included
    if record.side == Side.CLIENT:
        return  # a client span already carries its own gen_ai attributes
    if record.prompt_tokens is not None:
        attributes["gen_ai.usage.input_tokens"] = record.prompt_tokens
    if record.completion_tokens is not None:
        attributes["gen_ai.usage.output_tokens"] = record.completion_tokens
    if record.provider_name:
        attributes["gen_ai.provider.name"] = record.provider_name
    if record.operation_source != Source.DEFAULT:
        attributes["gen_ai.operation.name"] = record.operation_name
    if record.request_model:
        attributes["gen_ai.request.model"] = record.request_model
    if record.tpot_s is not None:
        attributes["otel_llm.time_per_output_token"] = record.tpot_s
    # What the engine did not measure for this request, and what was derived rather than measured.
    if record.segments_missing:
        attributes["otel_llm.segments_missing"] = ",".join(record.segments_missing)
    if record.segments_derived:
        attributes["otel_llm.segments_derived"] = ",".join(record.segments_derived)
    if record.not_measurable:
        attributes["otel_llm.not_measurable"] = ",".join(record.not_measurable)
    if record.gateway_overhead_s is not None:
        attributes["otel_llm.gateway_overhead"] = record.gateway_overhead_s
    if record.client_overhead_s is not None:
        attributes["otel_llm.client_overhead"] = record.client_overhead_s


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
ERROR_TYPE_KEY = "error.type"  # what a status message the rules remove is reduced to


def _is_free_text(value: AnyValue, limit: int, kind: str | None) -> bool:
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
_PLAIN = frozenset({"int_value", "double_value", "bool_value", "string_value"})  # stored as they are
# What a key alone decides (cached per key): allowed (kept whatever its value), blocked (removed),
# else whether its text is known metadata, and a URL.
_ALLOWED, _BLOCKED, _NOT_METADATA, _METADATA, _METADATA_URL = range(5)
_CLASS = 0x7  # the bits of the classes above
_GENAI = 0x8  # with this bit: a key that makes its span a GenAI span (GENAI_KEY_PREFIXES)
_KEY_CACHE_LIMIT = 4096  # keys are the sender's: the cache must not grow with whatever they send


# Removals from one repeated field deleted one by one (each shifts what follows it); more are
# compacted in one pass, so removing most of 250 000 attributes is linear, not quadratic.
_DELETED_ONE_BY_ONE = 16


def delete_positions(repeated: Any, positions: list[int]) -> None:
    """Remove the elements at ``positions`` (ascending) from a repeated message field."""
    if len(positions) <= _DELETED_ONE_BY_ONE:
        for position in reversed(positions):
            del repeated[position]
        return
    kept_at = 0
    removed = iter(positions)
    next_removed = next(removed, -1)
    for position in range(len(repeated)):
        if position == next_removed:
            next_removed = next(removed, -1)
            continue
        if kept_at != position:
            repeated[kept_at].CopyFrom(repeated[position])
        kept_at += 1
    del repeated[kept_at:]


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

    The allowlist first: on span, event, link, resource and scope attributes, a number or a boolean
    is kept under any key; text (a string, an array, a map, bytes) only under a key of
    ``metadata_keys`` (what otel-llm reads, the conventions' non-content keys) or ``allowed_keys``
    (exact, or ``*`` globs); a URL without its query and userinfo. So privacy does not depend on anyone having seen the
    instrumentation. Then, as extra layers, the block lists: keys of known content attributes
    (prefixes and ``*`` globs), attributes of content events, and any text longer than
    ``max_free_text_bytes`` on a GenAI span unless its key is allowed. A span's ``Status.message`` is
    judged as a text attribute under ``STATUS_MESSAGE_KEY``; one the rules remove is reduced to the
    span's ``error.type`` text (as kept), else emptied.
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
    _key_classes: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

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

    def _key_class(self, key: str) -> int:
        """The key's class, ``_GENAI`` set for a GenAI key."""
        known = self._key_classes.get(key)
        if known is not None:
            return known
        if self._allowed(key):
            decided = _ALLOWED
        elif self._blocked(key):
            decided = _BLOCKED
        elif self.metadata_keys is None or key in self.metadata_keys:
            decided = _METADATA_URL if key in self.url_keys else _METADATA
        else:
            decided = _NOT_METADATA
        if key.startswith(GENAI_KEY_PREFIXES):
            decided |= _GENAI
        if len(self._key_classes) < _KEY_CACHE_LIMIT:
            self._key_classes[key] = decided
        return decided

    def _removes(self, value: AnyValue, kind: str | None, key_class: int, allowlist: bool, limit: int,
                 counts: RedactionCounts) -> bool:
        """Whether the rules remove an attribute of this key class and value, counted; a metadata
        URL that is kept is reduced in place. The one statement of the rules, for every path."""
        if key_class == _ALLOWED:
            return False
        if key_class == _BLOCKED:
            counts.content_keys += 1
            return True
        if allowlist and kind not in _SCALARS:
            if key_class == _NOT_METADATA:
                counts.not_allowed += 1
                return True
            if key_class == _METADATA_URL and kind == "string_value":
                url = reduced_url(value.string_value)
                if url != value.string_value:
                    value.string_value = url
                    counts.url_reduced += 1
        if limit and _is_free_text(value, limit, kind):
            counts.free_text += 1
            return True
        return False

    def _strip(self, attributes: Any, genai: bool, counts: RedactionCounts) -> None:
        limit = self.max_free_text_bytes if genai else 0
        allowlist = self.metadata_keys is not None
        if not allowlist and not limit and not self.key_prefixes and self._pattern is None:
            return  # nothing to remove (allow_content)
        remove = [position for position, kv in enumerate(attributes)
                  if self._removes(kv.value, kv.value.WhichOneof("value"), self._key_class(kv.key) & _CLASS,
                                   allowlist, limit, counts)]
        delete_positions(attributes, remove)

    def apply_with_values(self, span: Span, counts: RedactionCounts) -> dict[str, Any] | None:
        """``apply_into``, returning ``attribute_values`` of the span's attributes after it: each
        attribute read once for both. None, with nothing applied, when a key repeats."""
        attributes = span.attributes
        read: list[tuple[str, AnyValue, Any, int]] = []
        values: dict[str, Any] = {}
        classes = self._key_classes
        genai_keys = 0
        for kv in attributes:
            key = kv.key
            value = kv.value
            kind = value.WhichOneof("value")
            values[key] = getattr(value, kind) if kind in _PLAIN else any_value_to_python(value)
            key_class = classes.get(key)
            if key_class is None:
                key_class = self._key_class(key)
            genai_keys |= key_class
            read.append((key, value, kind, key_class & _CLASS))
        if len(values) != len(read):
            return None
        limit = self.max_free_text_bytes if genai_keys & _GENAI else 0
        genai = bool(limit)
        allowlist = self.metadata_keys is not None
        remove: list[int] = []
        for position, (key, value, kind, key_class) in enumerate(read):
            if key_class == _ALLOWED:
                continue
            if self._removes(value, kind, key_class, allowlist, limit, counts):
                remove.append(position)
            elif key_class == _METADATA_URL and kind == "string_value":
                values[key] = value.string_value  # as reduced
        delete_positions(attributes, remove)
        for position in remove:
            del values[read[position][0]]
        if span.events or span.links:
            self._strip_events_and_links(span, genai, counts)
        if span.status.message:
            self._redact_status(span, genai, counts)
        return values

    def apply(self, span: Span) -> RedactionCounts:
        counts = RedactionCounts()
        self.apply_into(span, counts)
        return counts

    def apply_into(self, span: Span, counts: RedactionCounts) -> None:
        """``apply``, what it removes added to ``counts``."""
        genai = bool(self.max_free_text_bytes) and any(kv.key.startswith(GENAI_KEY_PREFIXES) for kv in span.attributes)
        self._strip(span.attributes, genai, counts)
        self._strip_events_and_links(span, genai, counts)
        if span.status.message:
            self._redact_status(span, genai, counts)

    def _redact_status(self, span: Span, genai: bool, counts: RedactionCounts) -> None:
        """``Status.message`` through the rules as a text attribute under ``STATUS_MESSAGE_KEY``, after the
        span's attributes went through them; removed, it becomes the span's ``error.type`` string as
        kept (the last one, as ``attribute_values`` reads a repeated key), else empty."""
        value = AnyValue(string_value=span.status.message)
        limit = self.max_free_text_bytes if genai else 0
        if self._removes(value, "string_value", self._key_class(STATUS_MESSAGE_KEY) & _CLASS,
                         self.metadata_keys is not None, limit, counts):
            error_type = ""
            for kv in span.attributes:
                if kv.key == ERROR_TYPE_KEY:
                    error_type = kv.value.string_value if kv.value.WhichOneof("value") == "string_value" else ""
            span.status.message = error_type

    def strip_attributes(self, attributes: Any, counts: RedactionCounts) -> None:
        """A resource's or a scope's attributes: the allowlist and the key rules, without the free-text
        rule (they describe the process, never one call)."""
        self._strip(attributes, False, counts)

    def apply_to_request(self, request: Any) -> RedactionCounts:
        """Every resource, scope and span of an export request (the intake log's), in place."""
        counts = RedactionCounts()
        for resource_spans in request.resource_spans:
            self.strip_attributes(resource_spans.resource.attributes, counts)
            for scope_spans in resource_spans.scope_spans:
                self.strip_attributes(scope_spans.scope.attributes, counts)
                for span in scope_spans.spans:
                    self.apply_into(span, counts)
        return counts

    def _strip_events_and_links(self, span: Span, genai: bool, counts: RedactionCounts) -> None:
        """A content event loses its attributes; other events', and links' under the allow-list, are stripped."""
        for event in span.events:
            if event.name in self.event_names:
                counts.content_events += len(event.attributes)
                del event.attributes[:]
            else:
                self._strip(event.attributes, genai, counts)
        if self.metadata_keys is not None:
            for link in span.links:
                self._strip(link.attributes, genai, counts)


NO_REDACTION = Redaction()


def native_kept_trace_writer(redaction: Redaction, extension: Any) -> Any:
    """The compiled core's ``KeptTraceWriter`` for ``redaction`` (``rust/src/kept.rs``): ``kept_trace``
    written from the spans' bytes, which declines (None) what it leaves to ``kept_trace``; None
    without the core. It asks ``redaction`` for each new key's class, so the rules stay stated here."""
    if extension is None:
        return None
    classes = (_ALLOWED, _BLOCKED, _NOT_METADATA, _METADATA_URL, _CLASS, _GENAI)
    return extension.KeptTraceWriter(redaction._key_class, classes, sorted(redaction.event_names),
                                     redaction.max_free_text_bytes, redaction.metadata_keys is not None,
                                     Side.CLIENT, Source.DEFAULT, STATUS_MESSAGE_KEY, ERROR_TYPE_KEY)


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def _length_delimited(tag: bytes, data: bytes) -> bytes:
    return tag + _varint(len(data)) + data


_TIMES = struct.Struct("<BQBQ")  # start_time_unix_nano (field 7) and end_time_unix_nano (8), fixed64
_UINT64_MAX = (1 << 64) - 1
_SEGMENT_FIELDS: dict[str, tuple[bytes, str]] = {}  # per segment name: (its Span fields, attributes JSON)


def _segment_fields(name: str) -> tuple[bytes, str]:
    """A segment span's fields that depend on its name alone: name, kind, its one attribute; and
    that attribute as the store's JSON."""
    known = _SEGMENT_FIELDS.get(name)
    if known is None:
        key_value = KeyValue(key=SEGMENT_ATTRIBUTE, value=AnyValue(string_value=name)).SerializeToString()
        fields = b"".join((_length_delimited(b"\x2a", name.encode()),
                           b"\x30\x01",  # kind: SPAN_KIND_INTERNAL
                           _length_delimited(b"\x4a", key_value)))
        known = (fields, encode_json({SEGMENT_ATTRIBUTE: name}))
        if len(_SEGMENT_FIELDS) < 64:  # segment names are ours (a few), never the sender's
            _SEGMENT_FIELDS[name] = known
    return known


def kept_trace_request(
    spans: list[BufferedSpan], records: list[RequestRecord], policy: str, threshold: str,
    redaction: Redaction = NO_REDACTION, redacted: RedactionCounts | None = None,
) -> tuple[ExportTraceServiceRequest, int]:
    """The request to export/store, and how many spans it holds; what redaction removed is added to ``redacted``."""
    request, count, _ = kept_trace(spans, records, policy, threshold, redaction, redacted)
    return request, count


def kept_trace(
    spans: list[BufferedSpan], records: list[RequestRecord], policy: str, threshold: str,
    redaction: Redaction = NO_REDACTION, redacted: RedactionCounts | None = None,
) -> tuple[ExportTraceServiceRequest, int, list[SpanRow]]:
    """The request to export/store, how many spans it holds and their store rows (in the request's
    order, as ``span_row`` reads each span of the request); what redaction removed is added to
    ``redacted``."""
    by_span = {r.span_id: r for r in records}
    request = ExportTraceServiceRequest()
    groups: dict[tuple[int, int], tuple[ScopeSpans, list[SpanRow]]] = {}
    resources: dict[int, tuple[ResourceSpans, str, list[list[SpanRow]]]] = {}
    count = 0
    # Per resource: segment spans belong to their engine's process; their bytes are merged in at the end.
    synthesized: dict[int, tuple[ScopeSpans, list[bytes], list[SpanRow]]] = {}
    trace_state = f"ot=th:{threshold}" if threshold not in ("", "0") else ""
    trace_state_field = _length_delimited(b"\x1a", trace_state.encode()) if trace_state else b""
    counts = redacted if redacted is not None else RedactionCounts()
    for buffered in spans:
        resource_key = id(buffered.resource)
        resource = resources.get(resource_key)
        if resource is None:
            resource_spans = request.resource_spans.add()
            resource_spans.resource.CopyFrom(buffered.resource)
            redaction.strip_attributes(resource_spans.resource.attributes, counts)
            resource = resources[resource_key] = (resource_spans, service_name_of(buffered.resource), [])
        resource_spans, service_name, resource_rows = resource
        group_key = (resource_key, id(buffered.scope))
        group = groups.get(group_key)
        if group is None:
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.CopyFrom(buffered.scope)
            redaction.strip_attributes(scope_spans.scope.attributes, counts)
            group = groups[group_key] = (scope_spans, [])
            resource_rows.append(group[1])
        scope_spans, rows = group
        span = scope_spans.spans.add()
        span.MergeFromString(buffered.payload)
        values = redaction.apply_with_values(span, counts)
        if values is None:  # a repeated key
            redaction.apply_into(span, counts)
        with_trace_state(span, threshold)
        count += 1
        span_id = span.span_id
        record = by_span.get(span_id)
        if record is not None:
            enrich(span, record, policy, values)  # the values follow each key set
        if values is None:
            values = attribute_values(span.attributes)
        row = span_row(span, service_name, encode_json(values))
        rows.append(row)
        if record is None or not record.segments:
            continue
        into = synthesized.get(resource_key)
        if into is None:
            scope = resource_spans.scope_spans.add()
            scope.scope.name = SCOPE_NAME
            into = synthesized[resource_key] = (scope, [], [])
            resource_rows.append(into[2])
        scope, fields, segment_rows = into
        # The segment spans as ``ScopeSpans.spans`` fields, the same messages ``add_segment_span`` and
        # ``with_trace_state`` build once parsed (field order aside), without a Span object each.
        trace_id = span.trace_id
        trace_hex, parent_hex = row[0], row[1]
        shared = b"".join((_length_delimited(b"\x0a", trace_id), trace_state_field,
                           _length_delimited(b"\x22", span_id)))
        for segment in record.segments:
            name, start, end = segment.name, segment.start_unix_ns, segment.end_unix_ns
            if not (0 <= start <= _UINT64_MAX and 0 <= end <= _UINT64_MAX):
                raise ValueError(f"segment {name}: times out of the uint64 range: {start}, {end}")
            segment_id = segment_span_id(trace_id, span_id, name)
            by_name, attributes_json = _segment_fields(name)
            body = b"".join((shared, b"\x12\x08", segment_id, by_name, _TIMES.pack(0x39, start, 0x41, end)))
            fields.append(_length_delimited(b"\x12", body))
            segment_rows.append((trace_hex, segment_id.hex(), parent_hex, name, Span.SPAN_KIND_INTERNAL,
                                 service_name, start if start <= INT64_MAX else INT64_MAX,
                                 end if end <= INT64_MAX else INT64_MAX, 0, "", attributes_json))
            count += 1
    for scope, fields, _ in synthesized.values():
        scope.MergeFromString(b"".join(fields))
    return request, count, [row for _, _, resource_rows in resources.values()
                            for rows in resource_rows for row in rows]
