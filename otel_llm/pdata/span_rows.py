"""A kept span as the trace store's ``spans`` table holds it (``exporters.store``): one tuple per span,
its attributes as JSON. Built where the span is at hand (redaction, which synthesizes segment spans
from their record and has just parsed every other span), so the store's writer does not walk and
convert a whole OTLP request a second time."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from otel_llm.pdata.attributes import any_value_to_python

# trace_id, span_id, parent_span_id (hex), name, kind, service_name, start, end (signed 64-bit),
# status code, status message, attributes (JSON): the columns of the ``spans`` table, in order.
SpanRow = tuple[str, str, str, str, int, str, int, int, int, str, str]

INT64_MAX = (1 << 63) - 1
_SCALAR_KINDS = frozenset({"int_value", "double_value", "bool_value", "string_value"})

# What ``json.dumps(value, default=str)`` writes, without building an encoder per call.
encode_json = json.JSONEncoder(default=str).encode


def int64(value: int) -> int:
    """OTLP timestamps are uint64; SQLite integers are signed 64-bit. Past 2262 is not a real time."""
    return value if value <= INT64_MAX else INT64_MAX


def attribute_values(attributes: Iterable[Any]) -> dict[str, Any]:
    """``{key: JSON-ready value}`` of OTLP ``KeyValue``s (bytes as hex; a repeated key: its last
    value, at its first position)."""
    values: dict[str, Any] = {}
    for kv in attributes:
        value: AnyValue = kv.value
        kind = value.WhichOneof("value")
        values[kv.key] = getattr(value, kind) if kind in _SCALAR_KINDS else any_value_to_python(value)
    return values


def span_row(span: Any, service_name: str, attributes_json: str | None = None) -> SpanRow:
    """The row of an OTLP ``Span`` message; ``attributes_json``, when the caller has it, is
    ``encode_json(attribute_values(span.attributes))``."""
    if attributes_json is None:
        attributes_json = encode_json(attribute_values(span.attributes))
    status = span.status
    return (span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(), span.name, span.kind, service_name,
            int64(span.start_time_unix_nano), int64(span.end_time_unix_nano), status.code, status.message,
            attributes_json)


def service_name_of(resource: Any) -> str:
    """``service.name`` of an OTLP ``Resource`` as the store files it: its first such attribute's
    string value ("" when absent or not a string)."""
    return next((kv.value.string_value for kv in resource.attributes if kv.key == "service.name"), "")
