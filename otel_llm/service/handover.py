"""Pending traces handed from a gracefully stopping process to the next start on the same store.

Behind the Collector's ``load_balancing`` exporter a trace's spans keep reaching the same replica
across its restart: the exports refused while it stops are retried to the process that replaces it.
A trace still pending at the stop is waiting for spans that then reach the *new* process: a gateway's
span whose engine span has not come (decided at stop, the gateway span is a request of its own and the
engine span, later, another: one request counted twice), or an engine span whose client's or proxy's
span is still in an exporter's batch (decided at stop, that span is measured alone, not joined). So a
graceful stop writes its pending traces here (``service.hand_over_pending_traces``) instead of deciding
them, and the next start buffers them again before its receivers listen, where their other spans join
them: nothing of them was measured yet (a trace is measured when it is decided).

The file holds what the intake log would hold: the spans as received, with ``processors.redaction``'s
rules applied before they are written (no content on disk). Records are ``RECORD`` (length, CRC-32)
then one ``ExportTraceServiceRequest`` per trace; a damaged record ends the reading, counted in the log.
The file is read by one start only and then deleted (whatever that start's own setting). A replica
removed for good leaves it on its volume: its traces are measured when a process next starts on that
volume, not before (the stop logs how many it handed over and where). Taken over, the traces are
pending in the new process like any other: a crash of it before they are decided loses them, as it
loses any pending trace (the intake log does not cover them).
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span

from otel_llm.pdata.spans import PendingTrace
from otel_llm.processor.redaction.synthesis import Redaction

log = logging.getLogger(__name__)

HANDOVER_FILE = "handover"
RECORD = struct.Struct("<II")  # payload length, crc32 of the payload
# The most a stop writes: past it, the remaining traces are decided at stop as without a handover
# (max_traces bounds what is pending; this bounds the disk and the next start's work).
MAX_HANDOVER_BYTES = 256 << 20


def every_pending_trace(trace: PendingTrace) -> bool:
    """Which pending traces a graceful stop hands over: all of them (none is measured yet, and any of
    them may still get a span, which the load balancer sends to the next process)."""
    return True


def encode_trace(trace: PendingTrace, redaction: Redaction | None) -> tuple[bytes, int]:
    """One trace as an ``ExportTraceServiceRequest`` (its resources and scopes as they came), and its span count."""
    request = ExportTraceServiceRequest()
    spans_by_origin: dict[int, list[Span]] = {}
    scope_spans_by_origin: dict[int, ScopeSpans] = {}
    for buffered in trace.spans.values():
        origin = buffered.origin
        key = id(origin)  # one Origin per resource and scope of a received request
        spans = spans_by_origin.get(key)
        if spans is None:
            resource_spans = request.resource_spans.add()
            resource_spans.resource.CopyFrom(origin.resource)
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.CopyFrom(origin.scope)
            scope_spans_by_origin[key] = scope_spans
            spans = spans_by_origin[key] = []
        span = Span.FromString(buffered.payload)
        if redaction is not None:
            redaction.apply(span)
        spans.append(span)
    for key, spans in spans_by_origin.items():
        scope_spans_by_origin[key].spans.extend(spans)
    return request.SerializeToString(), len(trace.spans)


@dataclass
class HandoverResult:
    traces: int = 0
    spans: int = 0
    not_written: list[PendingTrace] | None = None  # past MAX_HANDOVER_BYTES, or the file could not be written


def write_handover(path: Path, traces: list[PendingTrace], redaction: Redaction | None) -> HandoverResult:
    """Write ``traces`` for the next start (atomically: a stop cut short leaves no half file)."""
    result = HandoverResult(not_written=[])
    assert result.not_written is not None
    tmp = path.with_suffix(".tmp")
    written = 0
    try:
        with open(tmp, "wb") as f:
            for index, trace in enumerate(traces):
                payload, spans = encode_trace(trace, redaction)
                if written + RECORD.size + len(payload) > MAX_HANDOVER_BYTES:
                    result.not_written.extend(traces[index:])
                    break
                f.write(RECORD.pack(len(payload), zlib.crc32(payload)) + payload)
                written += RECORD.size + len(payload)
                result.traces += 1
                result.spans += spans
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as exc:
        log.error("cannot hand pending traces over to the next start (%s): they are decided now", exc)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return HandoverResult(not_written=list(traces))
    return result


@dataclass
class HandoverRead:
    requests: list[bytes]
    damaged: int = 0


def read_handover(path: Path) -> HandoverRead | None:
    """The previous stop's handover (deleted once read: one start takes it); None without one."""
    try:
        size = path.stat().st_size
        if size > MAX_HANDOVER_BYTES + (1 << 20):
            log.error("the previous run's handover %s is %d bytes, more than a stop writes: not read, moved "
                      "to %s", path, size, path.with_suffix(".refused"))
            os.replace(path, path.with_suffix(".refused"))
            return HandoverRead([], damaged=1)
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.error("cannot read the previous run's handover %s: %s", path, exc)
        return None
    result = HandoverRead([])
    for payload in _records(data, result):
        result.requests.append(payload)
    try:
        path.unlink()
    except OSError as exc:
        log.error("cannot delete the handover %s once read (%s): the next start would take it again", path, exc)
    return result


def _records(data: bytes, result: HandoverRead) -> Iterator[bytes]:
    offset = 0
    while offset + RECORD.size <= len(data):
        length, crc = RECORD.unpack_from(data, offset)
        start = offset + RECORD.size
        payload = data[start:start + length]
        if len(payload) != length or zlib.crc32(payload) != crc:
            result.damaged += 1  # lengths are not trustworthy past a damaged record: the rest is lost
            return
        yield payload
        offset = start + length
    if offset != len(data):
        result.damaged += 1
