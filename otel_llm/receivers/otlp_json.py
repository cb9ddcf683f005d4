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


def parse_otlp_json(body: bytes) -> ExportTraceServiceRequest:
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise OtlpJsonError(f"invalid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise OtlpJsonError("expected a JSON object with resourceSpans")
    resource_spans = document.get("resourceSpans", document.get("resource_spans", []))
    if not isinstance(resource_spans, list):
        raise OtlpJsonError("resourceSpans must be a list")
    for rs in resource_spans:
        if not isinstance(rs, dict):
            raise OtlpJsonError("resourceSpans[] must be objects")
        for ss in rs.get("scopeSpans", rs.get("scope_spans", [])) or []:
            if not isinstance(ss, dict):
                raise OtlpJsonError("scopeSpans[] must be objects")
            for span in ss.get("spans", []) or []:
                if not isinstance(span, dict):
                    raise OtlpJsonError("spans[] must be objects")
                _hex_ids_to_base64(span)
                for link in span.get("links", []) or []:
                    if isinstance(link, dict):
                        _hex_ids_to_base64(link)
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(document, request, ignore_unknown_fields=True, max_recursion_depth=64)
    except (json_format.ParseError, binascii.Error, TypeError, ValueError, RecursionError) as exc:
        raise OtlpJsonError(f"not an ExportTraceServiceRequest: {exc}") from None
    return request
