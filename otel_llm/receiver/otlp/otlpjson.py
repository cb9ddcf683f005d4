"""OTLP/JSON -> protobuf. OTLP JSON differs from protobuf's canonical JSON mapping in one way
that matters: trace and span ids are hex strings, not base64."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

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


def parse_otlp_json(body: bytes) -> ExportTraceServiceRequest:
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
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(document, request, ignore_unknown_fields=True, max_recursion_depth=64)
    except (json_format.ParseError, binascii.Error, TypeError, ValueError, AttributeError, KeyError,
            RecursionError) as exc:
        raise OtlpJsonError(f"not an ExportTraceServiceRequest: {exc}") from None
    return request
