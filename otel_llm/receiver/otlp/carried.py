"""The intake log's carried traces (``receivers.otlp.intake_log``): the spans of traces still pending
once the requests that brought them leave the log.

A request leaves the log ``decision_wait`` after it was processed, when every trace it touched is
decided, except a trace held for a call in flight (``tail_sampling.max_open_call_wait``, up to 10
minutes) and a trace buffered again at start (a predecessor's handover, or this file's own). Keeping
every request from the oldest such trace on (what the log did) let one held span pin megabytes of
later traffic, up to ``max_size_mib`` and refusals (issue 50). Instead, before a checkpoint passes a
request, the spans of every trace still pending past ``decision_wait`` are appended here, and a trace
that leaves the buffer (decided and journaled, or handed over) gets a tombstone: the log's segments
then track ``decision_wait``, this file the held traces, and a start buffers this file's live traces
again before it replays the segments. The file is rewritten without its dead records once they
outweigh the live ones.

Records are ``FRAME`` (payload length, CRC-32 of the payload) then the payload: a tag, the trace id
(16 bytes), and for ``SPANS`` an ``ExportTraceServiceRequest`` of spans of that trace as received,
``processors.redaction``'s rules applied (no content on disk, as in the segments); ``LEFT`` has no
more. The handover file (``service/handover.py``) uses the same framing.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span

from otel_llm.internal.files import replacing

log = logging.getLogger(__name__)

FRAME = struct.Struct("<II")  # payload length, crc32 of the payload
SPANS, LEFT = b"S", b"T"
_HEAD = 1 + 16  # tag, trace id


class Redacting(Protocol):
    def apply(self, span: Span) -> Any: ...


def frame(payload: bytes) -> bytes:
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def frames(data: bytes) -> tuple[list[bytes], int, int]:
    """The payloads of ``data``'s valid records in order, how many damaged records ended the reading
    (0 or 1: lengths are not trustworthy past one), and where the last valid record ends."""
    payloads: list[bytes] = []
    offset = 0
    while offset + FRAME.size <= len(data):
        length, crc = FRAME.unpack_from(data, offset)
        start = offset + FRAME.size
        payload = data[start:start + length]
        if len(payload) != length or zlib.crc32(payload) != crc:
            return payloads, 1, offset
        payloads.append(payload)
        offset = start + length
    return payloads, int(offset != len(data)), offset


def encode_spans(spans: Iterable[Any], redaction: Redacting | None) -> bytes:
    """Buffered spans (``BufferedSpan``, or the compiled core's) as one ``ExportTraceServiceRequest``,
    their resources and scopes as they came, ``redaction``'s rules applied."""
    request = ExportTraceServiceRequest()
    by_origin: dict[int, tuple[ScopeSpans, list[Span]]] = {}
    for buffered in spans:
        origin = buffered.origin
        key = id(origin)  # one Origin per resource and scope of a received request
        entry = by_origin.get(key)
        if entry is None:
            resource_spans = request.resource_spans.add()
            resource_spans.resource.CopyFrom(origin.resource)
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.CopyFrom(origin.scope)
            entry = by_origin[key] = (scope_spans, [])
        span = Span.FromString(buffered.payload)
        if redaction is not None:
            redaction.apply(span)
        entry[1].append(span)
    for scope_spans, kept in by_origin.values():
        scope_spans.spans.extend(kept)
    return request.SerializeToString()


@dataclass(slots=True)
class CarriedTrace:
    span_ids: set[bytes] = field(default_factory=set)
    size: int = 0  # bytes of its records in the file


@dataclass(slots=True)
class CarriedSpans:
    """New spans of one pending trace, encoded, for ``CarriedFile.append``."""

    trace_id: bytes
    request: bytes
    span_ids: set[bytes]


# Rewritten once dead records outweigh the live ones by this much.
COMPACT_SLACK = 1 << 20


class CarriedFile:
    """The carried traces' file and what it holds: ``traces`` (trace id -> the spans carried), for the
    pipeline process's keeper, one writer at a time."""

    def __init__(self, path: Path, sync: bool) -> None:
        self.path = path
        self._sync = sync
        self.traces: dict[bytes, CarriedTrace] = {}
        self.size = 0  # bytes of the file
        self.compactions = 0

    @property
    def live_bytes(self) -> int:
        return sum(trace.size for trace in self.traces.values())

    def load(self) -> tuple[list[bytes], int]:
        """Read the file at start: the requests of its live traces (to buffer again), and the damaged
        records that ended the reading (the torn tail of an append a crash cut is cut off)."""
        try:  # never through a link planted under its name (ELOOP: the start says so)
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return [], 0
        try:
            with os.fdopen(os.dup(fd), "rb") as file:
                data = file.read()
            payloads, damaged, valid_end = frames(data)
            if valid_end != len(data):
                log.warning("intake log: %s ends in %d bytes of no valid record; cut", self.path.name,
                            len(data) - valid_end)
                os.ftruncate(fd, valid_end)
        finally:
            os.close(fd)
        requests: dict[bytes, list[bytes]] = {}
        self.traces = {}
        for payload in payloads:
            tag, trace_id, body = payload[:1], payload[1:_HEAD], payload[_HEAD:]
            if tag == LEFT:
                requests.pop(trace_id, None)
                self.traces.pop(trace_id, None)
            elif tag == SPANS:
                requests.setdefault(trace_id, []).append(body)
                self.traces.setdefault(trace_id, CarriedTrace()).size += FRAME.size + len(payload)
        self.size = valid_end
        for trace_id, bodies in requests.items():  # the span ids: a later append carries only new spans
            known = self.traces[trace_id].span_ids
            for body in bodies:
                try:
                    parsed = ExportTraceServiceRequest.FromString(body)
                except DecodeError:  # a valid CRC over bytes that are no request: buffering it again counts it
                    continue
                known.update(span.span_id for resource_spans in parsed.resource_spans
                             for scope_spans in resource_spans.scope_spans for span in scope_spans.spans)
        return [body for bodies in requests.values() for body in bodies], damaged

    def append(self, carried: list[CarriedSpans], left: list[bytes]) -> None:
        """Append new spans and tombstones in one write (fdatasync'd unless ``sync`` is off), then
        compact if dead records outweigh the live ones. Raises ``OSError``; the file is then cut
        back to where it was and ``traces`` is unchanged."""
        records = [frame(SPANS + entry.trace_id + entry.request) for entry in carried]
        records += [frame(LEFT + trace_id) for trace_id in left]
        data = b"".join(records)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                     0o600)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if self._sync:
                    os.fdatasync(fd)
            except OSError:
                try:  # no partial record may stay in front of the next append
                    os.ftruncate(fd, self.size)
                except OSError:
                    pass
                raise
        finally:
            os.close(fd)
        self.size += len(data)
        for entry, record in zip(carried, records):
            trace = self.traces.setdefault(entry.trace_id, CarriedTrace())
            trace.span_ids |= entry.span_ids
            trace.size += len(record)
        for trace_id in left:
            self.traces.pop(trace_id, None)
        if self.size > 2 * self.live_bytes + COMPACT_SLACK:
            try:
                self.compact()
            except OSError as exc:  # what was appended is on disk: only the dead records stay a while
                log.warning("intake log: cannot compact %s (%d bytes, %d live): %s; next time", self.path.name,
                            self.size, self.live_bytes, exc)

    def compact(self) -> None:
        """Rewrite the file with its live traces' records only (atomically: a crash leaves the old
        one or the new one whole)."""
        payloads, _, _ = frames(self.path.read_bytes())
        live = [frame(payload) for payload in payloads if payload[:1] == SPANS and payload[1:_HEAD] in self.traces]
        with replacing(self.path, self._sync) as file:
            for record in live:
                file.write(record)
        self.size = sum(len(record) for record in live)
        self.compactions += 1

    def remove(self) -> None:
        """Every carried trace has left the buffer and the checkpoint covers everything (a final stop)."""
        self.path.unlink(missing_ok=True)
        self.traces = {}
        self.size = 0
