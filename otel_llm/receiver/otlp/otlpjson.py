"""OTLP/JSON -> protobuf. OTLP JSON differs from protobuf's canonical JSON mapping in one way
that matters: trace and span ids are hex strings, not base64."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.receiver.otlp.nesting import CUT_TEXT, MAX_VALUE_DEPTH

_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


class OtlpJsonError(ValueError):
    pass

def _hex_ids_to_base64(obj: dict[str, Any]) -> None:
    for key in _ID_FIELDS:
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
            except ValueError:
                raise OtlpJsonError(f"{key} is not hex: {value[:40]!r}") from None


def _objects(value: Any, name: str) -> list[dict[str, Any]]:
    """``value`` as a list of JSON objects (absent or null: none), or ``OtlpJsonError``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise OtlpJsonError(f"{name} must be a list, got {type(value).__name__}")
    for item in value:
        if not isinstance(item, dict):
            raise OtlpJsonError(f"{name}[] must be objects, got {type(item).__name__}")
    return value


def _cut_deep_values(attributes: Any) -> int:
    """OTLP/JSON's side of ``nesting.cut_deep_values``: an attribute value nested deeper than
    ``MAX_VALUE_DEPTH`` AnyValue levels becomes ``CUT_TEXT`` (the parser's recursion bound would
    otherwise refuse the whole request); returns how many were cut. Walked with a stack of
    (container, key or index, depth) of each AnyValue, so the document's depth costs no recursion."""
    cut = 0
    stack: list[tuple[Any, Any, int]] = []

    def key_values(items: Any, depth: int) -> None:
        if isinstance(items, list):
            stack.extend((item, "value", depth) for item in items if isinstance(item, dict))

    key_values(attributes, 1)
    while stack:
        container, key, depth = stack.pop()
        value = container.get(key) if isinstance(container, dict) else container[key]
        if not isinstance(value, dict):
            continue
        if depth > MAX_VALUE_DEPTH:
            container[key] = {"stringValue": CUT_TEXT.decode()}
            cut += 1
            continue
        kvlist = value.get("kvlistValue", value.get("kvlist_value"))
        if isinstance(kvlist, dict):
            key_values(kvlist.get("values"), depth + 1)
        array = value.get("arrayValue", value.get("array_value"))
        if isinstance(array, dict) and isinstance(array.get("values"), list):
            elements = array["values"]
            stack.extend((elements, index, depth + 1) for index in range(len(elements)))
    return cut


def _cut_in_request(resource_spans: list[dict[str, Any]]) -> int:
    cut = 0
    for rs in resource_spans:
        resource = rs.get("resource")
        if isinstance(resource, dict):
            cut += _cut_deep_values(resource.get("attributes"))
        for ss in _objects(rs.get("scopeSpans", rs.get("scope_spans")), "scopeSpans"):
            scope = ss.get("scope")
            if isinstance(scope, dict):
                cut += _cut_deep_values(scope.get("attributes"))
            for span in _objects(ss.get("spans"), "spans"):
                cut += _cut_deep_values(span.get("attributes"))
                for event in _objects(span.get("events"), "events"):
                    cut += _cut_deep_values(event.get("attributes"))
                for link in _objects(span.get("links"), "links"):
                    cut += _cut_deep_values(link.get("attributes"))
    return cut


def parse_otlp_json(body: bytes) -> ExportTraceServiceRequest:
    return parse_otlp_json_cutting(body)[0]


def parse_otlp_json_cutting(body: bytes) -> tuple[ExportTraceServiceRequest, int]:
    """The request, and how many attribute values nested too deep were cut (counted by the receiver)."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise OtlpJsonError(f"invalid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise OtlpJsonError("expected a JSON object with resourceSpans")
    resource_spans = document.get("resourceSpans", document.get("resource_spans", []))
    # Walked only to turn hex ids into base64: every level is checked for its type on the way, so
    # a wrong shape (``"scopeSpans": 5``) is a malformed request, never an exception in the handler.
    for rs in _objects(resource_spans, "resourceSpans"):
        for ss in _objects(rs.get("scopeSpans", rs.get("scope_spans")), "scopeSpans"):
            for span in _objects(ss.get("spans"), "spans"):
                _hex_ids_to_base64(span)
                for link in _objects(span.get("links"), "links"):
                    _hex_ids_to_base64(link)
    cut = 0
    for attempt in range(2):
        request = ExportTraceServiceRequest()
        try:
            json_format.ParseDict(document, request, ignore_unknown_fields=True, max_recursion_depth=64)
            break
        except json_format.ParseError as exc:
            # Only values the parser cannot take are cut, as on the protobuf path (upb's depth), so a
            # span keeps the same attributes whichever encoding brought it.
            if attempt or "too deep" not in str(exc):
                raise OtlpJsonError(f"not an ExportTraceServiceRequest: {exc}") from None
            cut = _cut_in_request(_objects(resource_spans, "resourceSpans"))
            if not cut:
                raise OtlpJsonError(f"not an ExportTraceServiceRequest: {exc}") from None
        except (binascii.Error, TypeError, ValueError, AttributeError, KeyError, RecursionError) as exc:
            raise OtlpJsonError(f"not an ExportTraceServiceRequest: {exc}") from None
    return request, cut
