"""What a receiver does with a decoded request before it answers: check span ids, then hand the
request to whatever admits it (the receiver process's forwarder) and report the outcome."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.internal import core as native_core

# Retryable refusals: nothing of the request was taken.
QUEUE_FULL = "queue_full"
MEMORY_LIMIT = "memory_limit"
SHUTTING_DOWN = "shutting_down"
RETRY_AFTER_S = {QUEUE_FULL: 1, MEMORY_LIMIT: 1, SHUTTING_DOWN: 5}

# Every reason a receiver counts, as a closed vocabulary: the counters live in shared memory.
PROTOCOLS = ("grpc", "http")
# Slow or stalled clients: ``header_timeout`` (HTTP headers not complete in read_header_timeout),
# ``read_timeout`` (a request not complete in read_timeout: an HTTP body, a gRPC call's message);
# ``too_many_connections`` (HTTP, past max_connections); ``fd_limit`` (an accept that failed for
# want of file descriptors or memory, one per failed attempt); ``incomplete_body`` (HTTP, a body
# shorter than its Content-Length or a chunked body cut off).
REQUEST_REFUSALS: tuple[str, ...] = (
    "unauthenticated", "malformed", "too_large", "not_found", "unsupported_media_type",
    "no_content_length", "unsupported_encoding", "too_many_requests",
    QUEUE_FULL, MEMORY_LIMIT, SHUTTING_DOWN, "header_timeout", "read_timeout",
    "too_many_connections", "fd_limit", "incomplete_body", "other")
SPAN_REFUSALS: tuple[str, ...] = ("invalid_id", QUEUE_FULL, MEMORY_LIMIT, SHUTTING_DOWN)
# The crash-safe intake (receivers/intake_log.py, opt-in): its log is full (until the pipeline has
# handled what it holds), or cannot be written. Retryable: nothing of the request was taken.
INTAKE_LOG_FULL, INTAKE_LOG_ERROR = "intake_log_full", "intake_log_error"
RETRY_AFTER_S.update({INTAKE_LOG_FULL: 1, INTAKE_LOG_ERROR: 5})
REQUEST_REFUSALS += (INTAKE_LOG_FULL, INTAKE_LOG_ERROR)
SPAN_REFUSALS += (INTAKE_LOG_FULL, INTAKE_LOG_ERROR)
# HTTP bodies held at once (read, or decompressed) past http.max_bytes_in_flight: retryable.
BYTES_IN_FLIGHT = "bytes_in_flight"
REQUEST_REFUSALS += (BYTES_IN_FLIGHT,)


# Refusals a receiver waits out for up to ``receivers.otlp.admission_wait`` before answering: the
# intake drains within a fraction of a second once the pipeline catches up, and a client that does not
# retry (the JS gRPC exporter) loses what is refused.
WAITABLE = (QUEUE_FULL, MEMORY_LIMIT)


def request_spans(request: ExportTraceServiceRequest | None, ids: IdCheck | None = None) -> int:
    """The spans of a request: parsed, or (``request`` None) counted by ``usable_ids``."""
    if request is None:
        assert ids is not None, "an unparsed request comes with its ids"
        return ids.spans
    return sum(len(scope_spans.spans) for resource_spans in request.resource_spans
               for scope_spans in resource_spans.scope_spans)


@dataclass(slots=True, frozen=True)
class Admission:
    """A receiver's answer: how many spans were taken, rejected (partial success), or why all were refused."""

    accepted: int
    rejected: int = 0
    error_message: str = ""
    refused: str = ""  # "" | QUEUE_FULL | MEMORY_LIMIT | SHUTTING_DOWN: retryable, nothing taken
    retry_after_s: int = 0


class Admitter(Protocol):
    # An admitter may also say ``may_block = True`` (its ``admit`` can wait on the disk): the asyncio
    # gRPC receiver then calls ``admit`` from threads instead of on its event loop.

    def admit(self, request: ExportTraceServiceRequest | None, payload: bytes | None, protocol: str,
              ids: IdCheck | None = None) -> Admission:
        """Take ``request`` (``payload`` is its wire form when the receiver has it) or refuse it.
        ``request`` None: not parsed, ``payload`` given and ``ids`` its ``usable_ids`` (none rejected)."""

    def refuse_request(self, protocol: str, reason: str) -> None:
        """Count a request refused before it could be decoded (auth, size, media type, malformed)."""

    def room(self, spans: int, size: int) -> str:
        """"" when the intake has room for a request of ``spans`` in ``size`` bytes now, else the
        refusal ``admit`` would give (nothing reserved: the receivers wait on it, ``admission_wait``)."""

    def cut_values(self, protocol: str, count: int) -> None:
        """Count attribute values cut for nesting too deep (``nesting.py``); the request goes on."""

    def ignore(self, protocol: str, signal: str, items: int) -> None:
        """Count the items of an OTLP metrics or logs request taken and dropped (``othersignals.py``)."""


_ZERO_TRACE_ID = bytes(16)
_ZERO_SPAN_ID = bytes(8)


def valid_ids(span: Span) -> bool:
    trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
    return (len(trace_id) == 16 and trace_id != _ZERO_TRACE_ID and len(span_id) == 8 and span_id != _ZERO_SPAN_ID
            and (not parent or len(parent) == 8))


@dataclass(slots=True, frozen=True)
class IdCheck:
    spans: int
    rejected: int

    @property
    def message(self) -> str:
        if not self.rejected:
            return ""
        return (f"{self.rejected} spans rejected: invalid trace_id, span_id or parent_span_id "
                "(need 16/8/8 non-zero bytes)")


def check_ids(request: ExportTraceServiceRequest) -> IdCheck:
    """Count the spans and those with unusable ids; drop the latter from ``request`` in place."""
    spans = rejected = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:  # inlined valid_ids: this runs in the receivers, per span
                spans += 1
                trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
                if (len(trace_id) != 16 or trace_id == _ZERO_TRACE_ID or len(span_id) != 8
                        or span_id == _ZERO_SPAN_ID or (parent and len(parent) != 8)):
                    rejected += 1
    if rejected:
        _drop_invalid(request)
    return IdCheck(spans, rejected)


def _drop_invalid(request: ExportTraceServiceRequest) -> None:
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            spans = scope_spans.spans
            if all(valid_ids(span) for span in spans):
                continue
            keep = [span for span in spans if valid_ids(span)]
            kept_copies = [Span() for _ in keep]
            for copy, span in zip(kept_copies, keep):
                copy.CopyFrom(span)
            del spans[:]
            spans.extend(kept_copies)


def usable_ids(payload: bytes) -> IdCheck | None:
    """The id check on the request's bytes, by the compiled core, for a request every span of which
    has usable ids: the receiver then need not parse it (upb's parse and ``check_ids`` cost ~1.1 us
    per span here, the core's walk ~0.3). ``None`` (parse it) without the core, for a request the core
    finds malformed (upb's error is then the answer; both refuse the same bytes,
    tests/test_native_core.py) and for one with unusable ids (they are dropped from the parsed request)."""
    core = native_core.active()[0]
    if core is None:
        return None
    try:
        spans, rejected = core.span_ids(payload)
    except ValueError:
        return None
    return IdCheck(spans, 0) if not rejected else None
