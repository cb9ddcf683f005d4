"""Attribute values nested too deep for the protobuf decoder: cut at a depth bound, not refused.

upb refuses a message nested deeper than 100 levels (``Exceeded upb_DecodeOptions_MaxDepth``), and
each level of an attribute map (``AnyValue`` → ``KeyValueList`` → ``KeyValue`` → ``AnyValue``) costs
three: a 90-level nested map got its whole request a 400 and every other span in it was lost. When
the decoder says so, the request's wire bytes are rewritten: an attribute value nested deeper than
``MAX_VALUE_DEPTH`` levels becomes the string ``CUT_TEXT``; everything else is copied byte for byte.
The receivers count each cut value (``otel_llm_receiver_cut_values_total``) and admit the rest."""

from __future__ import annotations

from otel_llm.internal.wire import MalformedWire, decode_varint, encode_varint

MAX_VALUE_DEPTH = 16  # AnyValue levels kept (3 decoder levels each; the span itself is 6 deep)
CUT_TEXT = b"[otel-llm: value nested deeper than 16 levels, cut]"

# For each message on the path to an attribute value: field number -> the message type it holds.
_REQUEST, _RESOURCE_SPANS, _RESOURCE, _SCOPE_SPANS, _SCOPE, _SPAN, _EVENT, _LINK, _KEY_VALUE, _ANY_VALUE, \
    _ARRAY, _KV_LIST = range(12)
_CHILDREN: dict[int, dict[int, int]] = {
    _REQUEST: {1: _RESOURCE_SPANS},
    _RESOURCE_SPANS: {1: _RESOURCE, 2: _SCOPE_SPANS},
    _RESOURCE: {1: _KEY_VALUE},
    _SCOPE_SPANS: {1: _SCOPE, 2: _SPAN},
    _SCOPE: {3: _KEY_VALUE},
    _SPAN: {9: _KEY_VALUE, 11: _EVENT, 13: _LINK},
    _EVENT: {3: _KEY_VALUE},
    _LINK: {4: _KEY_VALUE},
    _KEY_VALUE: {2: _ANY_VALUE},
    _ANY_VALUE: {5: _ARRAY, 6: _KV_LIST},
    _ARRAY: {1: _ANY_VALUE},
    _KV_LIST: {1: _KEY_VALUE},
}


def _cut_value() -> bytes:
    return b"\x0a" + encode_varint(len(CUT_TEXT)) + CUT_TEXT  # AnyValue.string_value (field 1)


def _rewrite(data: bytes, kind: int, value_depth: int, cuts: list[int]) -> bytes:
    children = _CHILDREN[kind]
    out: list[bytes] = []
    offset = 0
    while offset < len(data):
        start = offset
        key, offset = decode_varint(data, offset)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, offset = decode_varint(data, offset)
        elif wire == 1:
            offset += 8
        elif wire == 5:
            offset += 4
        elif wire == 2:
            length, body = decode_varint(data, offset)
            offset = body + length
            if offset > len(data):
                raise MalformedWire("truncated field")
            child = children.get(field)
            if child is not None:
                depth = value_depth + (child == _ANY_VALUE)
                if child == _ANY_VALUE and depth > MAX_VALUE_DEPTH:
                    cuts[0] += 1
                    inner = _cut_value()
                else:
                    inner = _rewrite(data[body:offset], child, depth, cuts)
                out.append(encode_varint(key) + encode_varint(len(inner)) + inner)
                continue
        else:
            raise MalformedWire(f"wire type {wire}")
        if offset > len(data):
            raise MalformedWire("truncated field")
        out.append(data[start:offset])
    return b"".join(out)


def cut_deep_values(payload: bytes) -> tuple[bytes, int] | None:
    """``payload`` (an ExportTraceServiceRequest) with every attribute value nested deeper than
    ``MAX_VALUE_DEPTH`` replaced by ``CUT_TEXT``, and how many were cut; None if it is not
    well-formed protobuf (then it is malformed for another reason)."""
    cuts = [0]
    try:
        return _rewrite(payload, _REQUEST, 0, cuts), cuts[0]
    except MalformedWire:
        return None


def too_deep(error: Exception) -> bool:
    return "MaxDepth" in str(error) or "recursion" in str(error).lower()
