"""Protobuf wire-format primitives shared by the receiver (rewriting nested values) and the exporters
(length-delimited exposition): one decoder and one encoder of base-128 varints."""

from __future__ import annotations


class MalformedWire(ValueError):
    """Bytes that are not protobuf wire format (a varint runs past the end or beyond 64 bits)."""


def decode_varint(data: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if offset >= len(data) or shift > 63:
            raise MalformedWire("truncated varint")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7


def encode_varint(value: int) -> bytes:
    """A protobuf base-128 varint (also the length prefix of the delimited exposition format)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
