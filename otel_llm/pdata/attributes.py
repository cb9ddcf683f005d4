"""Reading OTLP ``KeyValue`` attributes without converting whole spans into Python objects.

Touching protobuf fields from Python is the expensive part of the hot path, so adapters build
one ``{key: AnyValue}`` map per span and convert only the values they use.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

AttrMap = Mapping[str, AnyValue]


def attribute_map(attributes: Iterable[KeyValue]) -> dict[str, AnyValue]:
    return {kv.key: kv.value for kv in attributes}


_intern = sys.intern


def get_str(attrs: AttrMap, key: str) -> str | None:
    """The value as text; a string is interned, because what adapters read as text (models,
    operations, providers, finish reasons) repeats across spans, and each buffered span would
    otherwise hold its own copy (~65 B each, ~150 B per buffered span on the bench's workload).
    CPython frees an interned string with its last reference, so hostile unique values cost
    nothing once their spans are gone."""
    value = attrs.get(key)
    if value is None:
        return None
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return _intern(value.string_value)
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        return repr(value.double_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "array_value" and value.array_value.values:
        return get_str({"_": value.array_value.values[0]}, "_")
    return None


def get_float(attrs: AttrMap, key: str) -> float | None:
    """A number as float; numeric strings are accepted because some SDKs stringify everything.

    Raises ``ValueError`` for a value that is present but is not a number, so the caller can
    count the span as malformed instead of treating a broken value as absent.
    """
    value = attrs.get(key)
    if value is None:
        return None
    kind = value.WhichOneof("value")
    if kind == "double_value":
        return value.double_value
    if kind == "int_value":
        return float(value.int_value)
    if kind == "string_value":
        return float(value.string_value)
    raise ValueError(f"{key} is a {kind}, not a number")


def get_int(attrs: AttrMap, key: str) -> int | None:
    value = attrs.get(key)
    if value is None:
        return None
    kind = value.WhichOneof("value")
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        number = value.double_value
        if not math.isfinite(number) or number != int(number):
            raise ValueError(f"{key} is not a whole number: {number!r}")
        return int(number)
    if kind == "string_value":
        return int(value.string_value)
    raise ValueError(f"{key} is a {kind}, not an integer")


def get_str_list(attrs: AttrMap, key: str) -> list[str]:
    """A string array, or a JSON array in a string (SGLang writes finish_reasons that way)."""
    value = attrs.get(key)
    if value is None:
        return []
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [v.string_value for v in value.array_value.values if v.WhichOneof("value") == "string_value"]
    if kind == "string_value":
        text = value.string_value.strip()
        if text.startswith("["):
            import json

            try:
                parsed: Any = json.loads(text)
            except ValueError:
                return []
            return [str(item) for item in parsed if isinstance(item, (str, int, float))]
        return [text] if text else []
    return []


def buffered_value(value: AnyValue) -> Any:
    """``any_value_to_python`` for a value a buffered span keeps: strings interned, as in ``get_str``."""
    if value.WhichOneof("value") == "string_value":
        return _intern(value.string_value)
    return any_value_to_python(value)


def any_value_to_python(value: AnyValue) -> Any:
    """A JSON-ready Python value (bytes as hex), for storing kept spans."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value_to_python(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value_to_python(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)
