"""The receiver process: OTLP receivers that decode, check ids, reserve room and forward bytes.

Everything the pipeline does per span (adapters, buffering, completion, metrics, sampling) holds
the GIL of the process it runs in, and the cyclic GC pauses it. With the receivers in the same
process, an Export call needed the GIL several times and waited behind both: at 20 000 spans/s the
bench measured Export p99 ≈ 55 ms. In a process of their own they answer in milliseconds whatever
the pipeline is doing (the request is decoded again downstream, ≈ 0.5 µs per span).

Shared with the other processes (``otel_llm/service/processes.py`` starts them all):

- ``IntakeState``: a few shared integers. The receiver process *reserves* room for a request's
  spans and bytes before it answers (``receivers.otlp.max_queued_spans``), the pipeline process
  releases it once the spans are buffered, so "accepted" still means "will be processed"; a
  memory-limit flag and a closed flag, set by the pipeline process, turn into retryable refusals.
- ``ReceiverCounters``: the receivers' counters, in shared memory.
- a pipe to the pipeline process: admitted requests (their bytes) and lifecycle events (ready, listen error, done). A sender thread
  writes it, so a handler never blocks on it.
- a control pipe from the pipeline process: "stop" with a grace period; its end-of-file (the
  pipeline process died, even by SIGKILL) stops the receivers at once.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.receiver.otlp.config import OtlpReceiver
from otel_llm.receiver.otlp.othersignals import SIGNALS
from otel_llm.receiver.otlp.intake_log import IntakeLogShared, IntakeLogSettings, IntakeLogWriter
from otel_llm.internal.runtime import name_process
from otel_llm.receiver.otlp.admission import (
    MEMORY_LIMIT,
    PROTOCOLS,
    QUEUE_FULL,
    REQUEST_REFUSALS,
    RETRY_AFTER_S,
    SHUTTING_DOWN,
    SPAN_REFUSALS,
    Admission,
    IdCheck,
    check_ids,
)

log = logging.getLogger(__name__)

# Message tags on the pipe out of the receiver process to the pipeline process (first byte of each message).
BATCH = b"B"  # B, accepted spans (uint32), request bytes
# V, accepted spans (uint32), request bytes: a BATCH whose bytes are exactly those the compiled core's
# ``span_ids`` validated (not parsed, changed or re-serialized here), so the pipeline need not validate them again.
VALIDATED = b"V"
EVENT = b"E"  # E, JSON {"event": "ready" | "error" | "done", ...}
_PROTOCOL_INDEX = {name: i for i, name in enumerate(PROTOCOLS)}
BATCH_HEADER = struct.Struct("<cI")

_PIPE_BYTES = 1 << 20  # one ~400 KB request fits, so a write rarely waits for the reader


def is_done_event(message: bytes) -> bool:
    return message[:1] == EVENT and json.loads(message[1:]).get("event") == "done"


# Refusals for a full intake at most this far apart are one run (a client told to retry in 1 s, after
# ``admission_wait``, comes back within it); a longer quiet ends it.
FULL_RUN_GAP_S = 2.0


class IntakeState:
    """Counters shared by the receiver process and the pipeline process (shared memory + a lock)."""

    _QUEUED, _MAX, _REFUSING, _CLOSED, _QUEUED_BYTES, _MAX_BYTES = range(6)
    # The current run of refusals for a full intake: when it began and its latest (CLOCK_MONOTONIC ns).
    _FULL_SINCE, _FULL_LAST = range(6, 8)

    def __init__(self, context: Any, max_spans: int, max_bytes: int) -> None:
        """``max_bytes``: requests admitted and not yet processed are data the memory limiter's
        periodic check cannot see coming; their bytes stay within part of its spike allowance."""
        self._lock = context.Lock()
        self._values = context.RawArray("q", 8)
        self._values[self._MAX] = max_spans
        self._values[self._MAX_BYTES] = max_bytes

    # Receiver side.
    def reserve(self, spans: int, size: int, client: bool = True) -> str:
        """Room for ``spans`` more in ``size`` bytes, or the reason there is none (a retryable refusal).
        ``client``: a client's request (the intake log's replay is none), whose refusal for a full
        intake is part of ``refusing_full_for``."""
        values = self._values
        with self._lock:
            refusal = self.room(spans, size)
            if not refusal:
                values[self._QUEUED] += spans
                values[self._QUEUED_BYTES] += size
            elif client and not values[self._REFUSING] and not values[self._CLOSED]:  # full: the bounds
                now = time.monotonic_ns()
                if now - values[self._FULL_LAST] > FULL_RUN_GAP_S * 1e9:
                    values[self._FULL_SINCE] = now
                values[self._FULL_LAST] = now
            return refusal

    def refusing_full_for(self) -> float:
        """Seconds the intake has refused clients for being full (``queue_full``, or its bytes bound),
        without a quiet of ``FULL_RUN_GAP_S``; 0 when it is not refusing."""
        values = self._values
        now = time.monotonic_ns()
        last = values[self._FULL_LAST]
        if not last or now - last > FULL_RUN_GAP_S * 1e9:
            return 0.0
        return (now - values[self._FULL_SINCE]) / 1e9

    def room(self, spans: int, size: int) -> str:
        """What ``reserve`` would answer now, without reserving (a read: no lock; ``reserve`` calls it under its lock)."""
        values = self._values
        if values[self._CLOSED]:
            return SHUTTING_DOWN
        if values[self._REFUSING]:
            return MEMORY_LIMIT
        queued = values[self._QUEUED]
        # An empty intake takes any request, so a request bigger than a bound is not refused forever.
        if queued:
            if queued + spans > values[self._MAX]:
                return QUEUE_FULL
            if values[self._QUEUED_BYTES] + size > values[self._MAX_BYTES]:
                return MEMORY_LIMIT
        return ""

    # Pipeline side.
    def release(self, spans: int, size: int) -> None:
        with self._lock:
            self._values[self._QUEUED] -= spans
            self._values[self._QUEUED_BYTES] -= size

    def reset_queued(self, spans: int, size: int) -> int:
        """Set the queued counts to what the pipeline holds; returns how many spans that forgets."""
        with self._lock:
            lost = self._values[self._QUEUED] - spans
            self._values[self._QUEUED] = spans
            self._values[self._QUEUED_BYTES] = size
            return lost

    @property
    def queued_spans(self) -> int:
        return self._values[self._QUEUED]

    @property
    def queued_bytes(self) -> int:
        return self._values[self._QUEUED_BYTES]

    def set_refusing(self, refusing: bool) -> None:
        self._values[self._REFUSING] = int(refusing)

    def close(self) -> None:
        with self._lock:
            self._values[self._CLOSED] = 1


class ReceiverCounters:
    """The receivers' counters in shared memory: written by the receiver process as it answers, so a
    client that got a refusal finds it counted on the next scrape; read by the pipeline process's
    ``/metrics``. Labels come from closed vocabularies (``admission``); an unknown reason is "other"."""

    def __init__(self, context: Any) -> None:
        self._accepted = context.RawArray("q", len(PROTOCOLS))
        self._spans = context.RawArray("q", len(PROTOCOLS) * len(SPAN_REFUSALS))
        self._requests = context.RawArray("q", len(PROTOCOLS) * len(REQUEST_REFUSALS))
        self._ignored = context.RawArray("q", len(PROTOCOLS) * len(SIGNALS))  # othersignals.py
        self._cut = context.RawArray("q", len(PROTOCOLS))  # nesting.py
        self._lock: threading.Lock | None = None  # the writer's; created in the receiver process

    def __getstate__(self) -> dict[str, Any]:
        return {"_accepted": self._accepted, "_spans": self._spans, "_requests": self._requests,
                "_ignored": self._ignored, "_cut": self._cut, "_lock": None}

    def cut(self, protocol: str, count: int) -> None:
        self._add(self._cut, _PROTOCOL_INDEX[protocol], count)

    def cut_snapshot(self) -> dict[str, int]:
        return {protocol: self._cut[i] for i, protocol in enumerate(PROTOCOLS)}

    def ignored(self, protocol: str, signal: str, items: int) -> None:
        """OTLP metrics or logs taken and dropped (``othersignals.py``)."""
        self._add(self._ignored, _PROTOCOL_INDEX[protocol] * len(SIGNALS) + SIGNALS.index(signal), items)

    def ignored_snapshot(self) -> dict[tuple[str, str], int]:
        return {(protocol, signal): self._ignored[i * len(SIGNALS) + j]
                for i, protocol in enumerate(PROTOCOLS) for j, signal in enumerate(SIGNALS)}

    def _add(self, values: Any, index: int, delta: int) -> None:
        if self._lock is None:
            self._lock = threading.Lock()
        with self._lock:  # "+=" on shared memory is a read and a write: handler threads would race
            values[index] += delta

    def accepted(self, protocol: str, spans: int) -> None:
        self._add(self._accepted, _PROTOCOL_INDEX[protocol], spans)

    def spans_refused(self, protocol: str, reason: str, spans: int) -> None:
        self._add(self._spans, _PROTOCOL_INDEX[protocol] * len(SPAN_REFUSALS) + SPAN_REFUSALS.index(reason), spans)

    def request_refused(self, protocol: str, reason: str) -> None:
        if reason not in REQUEST_REFUSALS:
            reason = "other"
        self._add(self._requests, _PROTOCOL_INDEX[protocol] * len(REQUEST_REFUSALS) + REQUEST_REFUSALS.index(reason), 1)

    def snapshot(self) -> tuple[dict[str, int], dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """(accepted spans by protocol, refused spans by (protocol, reason), refused requests by (protocol, reason))."""
        accepted = {protocol: self._accepted[i] for i, protocol in enumerate(PROTOCOLS)}
        spans = {(protocol, reason): self._spans[i * len(SPAN_REFUSALS) + j]
                 for i, protocol in enumerate(PROTOCOLS) for j, reason in enumerate(SPAN_REFUSALS)}
        requests = {(protocol, reason): self._requests[i * len(REQUEST_REFUSALS) + j]
                    for i, protocol in enumerate(PROTOCOLS) for j, reason in enumerate(REQUEST_REFUSALS)}
        return accepted, spans, requests


# --- the receiver process ---------------------------------------------------------------------

class Forwarder:
    """The receivers' ``Admitter`` in the receiver process: reserve room, count, then queue the
    request's bytes for the sender thread."""

    def __init__(self, state: IntakeState, counters: ReceiverCounters, connection: Connection,
                 intake_log: IntakeLogWriter | None = None) -> None:
        self._state = state
        self._intake_log = intake_log  # receivers.otlp.intake_log: each request logged before its answer
        self._counters = counters
        self._connection = connection
        self._outbox: deque[bytes] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._accepting = True  # cleared, under ``_cond``, by ``finish``
        self._thread = threading.Thread(target=self._send_loop, name="otel-llm-forwarder", daemon=True)
        self.failed = threading.Event()

    def start(self) -> None:
        self._thread.start()

    @property
    def may_block(self) -> bool:
        """Whether ``admit`` can wait on the disk (the intake log): the asyncio gRPC receiver then
        calls it from a thread, not on its event loop."""
        return self._intake_log is not None

    def admit(self, request: ExportTraceServiceRequest | None, payload: bytes | None, protocol: str,
              ids: IdCheck | None = None) -> Admission:
        if request is None:
            assert ids is not None and payload is not None, "an unparsed request comes with its bytes and ids"
        else:
            ids = check_ids(request)
        validated = request is None  # the bytes ``span_ids`` validated, as long as they stay as received
        accepted = ids.spans - ids.rejected
        counters = self._counters
        if self.failed.is_set() and accepted:
            # Nothing can reach the pipeline any more and the service is stopping: a retry will
            # find its restarted instance, while an answer of "accepted" would lose the data.
            counters.spans_refused(protocol, SHUTTING_DOWN, accepted)
            return Admission(0, ids.rejected, ids.message, refused=SHUTTING_DOWN,
                             retry_after_s=RETRY_AFTER_S[SHUTTING_DOWN])
        if ids.rejected:
            counters.spans_refused(protocol, "invalid_id", ids.rejected)
            payload, validated = None, False  # the request changed
        if accepted and self._intake_log is not None:
            if request is None:
                assert payload is not None
                request = ExportTraceServiceRequest.FromString(payload)
            if self._intake_log.redact(request):
                payload, validated = None, False  # content removed before it is written: no prompt on the log's disk
        if accepted:
            if payload is None:
                assert request is not None
                payload, validated = request.SerializeToString(), False
            refused = self._state.reserve(accepted, len(payload))
            if refused:
                counters.spans_refused(protocol, refused, accepted)
                return Admission(0, ids.rejected, ids.message, refused=refused, retry_after_s=RETRY_AFTER_S[refused])
            message = BATCH_HEADER.pack(VALIDATED if validated else BATCH, accepted) + payload
            unlogged, seq = "", 0
            with self._cond:
                queued = self._accepting
                if queued and self._intake_log is not None:  # in pipe order: the pipeline counts records
                    unlogged, seq = self._intake_log.append(accepted, payload)
                if queued and not unlogged:
                    self._outbox.append(message)
                    self._cond.notify()
            if unlogged:  # the log is full or cannot be written: retryable, counted
                self._state.release(accepted, len(payload))
                counters.spans_refused(protocol, unlogged, accepted)
                return Admission(0, ids.rejected, ids.message, refused=unlogged, retry_after_s=RETRY_AFTER_S[unlogged])
            if not queued:
                # "done" is already queued and the pipeline process stops reading at it. A request
                # can get here after the servers stopped: the HTTP server does not wait for its
                # handler threads, and a keep-alive connection's thread serves its next request.
                self._state.release(accepted, len(payload))
                counters.spans_refused(protocol, SHUTTING_DOWN, accepted)
                return Admission(0, ids.rejected, ids.message, refused=SHUTTING_DOWN,
                                 retry_after_s=RETRY_AFTER_S[SHUTTING_DOWN])
            if self._intake_log is not None:
                self._intake_log.wait_durable(seq)  # fsync: always; the other policies never wait
            counters.accepted(protocol, accepted)
        return Admission(accepted, ids.rejected, ids.message)

    def refuse_request(self, protocol: str, reason: str) -> None:
        self._counters.request_refused(protocol, reason)

    def room(self, spans: int, size: int) -> str:
        return self._state.room(spans, size)

    def ignore(self, protocol: str, signal: str, items: int) -> None:
        self._counters.ignored(protocol, signal, items)

    def cut_values(self, protocol: str, count: int) -> None:
        self._counters.cut(protocol, count)

    def event(self, **fields: object) -> None:
        with self._cond:
            self._outbox.append(EVENT + json.dumps(fields).encode())
            self._cond.notify()

    def finish(self) -> None:
        """Queue "done" behind everything admitted so far; every later request is refused."""
        with self._cond:
            self._accepting = False
            self._outbox.append(EVENT + json.dumps({"event": "done"}).encode())
            self._cond.notify()

    def close(self, timeout_s: float) -> None:
        """Send everything queued, then stop the sender thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _send_loop(self) -> None:
        send = self._connection.send_bytes
        while True:
            with self._cond:
                while not self._outbox and not self._closing:
                    self._cond.wait()
                messages = list(self._outbox)
                self._outbox.clear()
                closing = self._closing
            try:
                for message in messages:
                    send(message)
            except OSError:  # the pipeline process is gone; the control pipe's EOF stops us too
                self.failed.set()
                return
            if closing and not messages:
                return


@dataclass(frozen=True)
class ReceiverArgs:
    otlp: OtlpReceiver
    grpc: bool
    http: bool
    log_level: int
    intake_log: IntakeLogSettings | None = None  # receivers.otlp.intake_log, as the pipeline process replayed it
    intake_log_shared: IntakeLogShared | None = None


def run_receiver_process(args: ReceiverArgs, state: IntakeState, counters: ReceiverCounters, data: Connection,
                         control: Connection) -> None:
    """Entry point of the receiver process."""
    from otel_llm.receiver.otlp.grpc import OtlpGrpcReceiver
    from otel_llm.receiver.otlp.http import OtlpHttpReceiver

    # Ctrl-C reaches the whole process group; the pipeline process decides when receivers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    name_process("otel-llm-recv")
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    intake_log = None
    try:
        if args.intake_log is not None and args.intake_log_shared is not None:
            intake_log = IntakeLogWriter(args.intake_log, args.intake_log_shared)
    except OSError as exc:
        data.send_bytes(EVENT + json.dumps({"event": "error", "message": f"receivers.otlp.intake_log: {exc}"}).encode())
        os._exit(1)
    forwarder = Forwarder(state, counters, data, intake_log)
    forwarder.start()
    # args.grpc / args.http: the service saw that protocol configured (service/processes.py).
    protocols = args.otlp.protocols
    grpc_receiver = None
    if args.grpc:
        assert protocols.grpc is not None
        grpc_receiver = OtlpGrpcReceiver(protocols.grpc, forwarder, args.otlp.admission_wait)
    http_receiver = None
    try:
        if grpc_receiver is not None:
            grpc_receiver.start()
        if args.http:
            assert protocols.http is not None
            http_receiver = OtlpHttpReceiver(protocols.http, forwarder, args.otlp.admission_wait)
            http_receiver.start()
    except (OSError, ValueError) as exc:
        forwarder.event(event="error", message=str(exc))
        forwarder.close(5)
        os._exit(1)
    forwarder.event(event="ready", grpc_port=grpc_receiver.port if grpc_receiver else 0,
                    http_port=http_receiver.port if http_receiver else 0)
    grace_s = 0.0
    try:
        while True:
            message = control.recv()
            if isinstance(message, tuple) and message[0] == "stop":
                grace_s = float(message[1])
                break
    except (EOFError, OSError):
        log.error("the pipeline process is gone; stopping the receivers")
    # Both refuse new calls at once; calls in progress share one grace period.
    deadline = time.monotonic() + grace_s
    if http_receiver is not None:
        http_receiver.refuse_new()
    if grpc_receiver is not None:
        grpc_receiver.stop(grace_s)
    if http_receiver is not None:
        http_receiver.stop(max(0.0, deadline - time.monotonic()))
    forwarder.finish()
    forwarder.close(10)
    if intake_log is not None:
        intake_log.close()
    data.close()
    # grpcio's threads can keep an orderly interpreter exit waiting; everything is sent.
    os._exit(0)


def grow_pipe(connection: Connection) -> None:
    try:
        import fcntl

        fcntl.fcntl(connection.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass  # the default size works, with more wake-ups


def spawn_context() -> Any:
    """A fresh interpreter for the receivers: forking a process that runs gRPC threads is unsafe."""
    return multiprocessing.get_context("spawn")
