"""The queued trace exporter behind ``exporters.otlp`` and ``exporters.otlphttp``: kept traces out to
Tempo, Jaeger or another collector over OTLP/gRPC or OTLP/HTTP (``transport.py``), with the Collector
exporterhelper's retry, bounded sending queue and optional on-disk queue (``persistent_queue.py``),
counted in the families of ``telemetry.py``.

How it behaves (what an SRE who knows the Collector should expect, and where it differs):

Queue
    ``submit`` never blocks on the network: it serializes the request once, counts its spans once,
    and hands it to a bounded queue served by ``sending_queue.num_consumers`` sender threads.
    The queue bound ``sending_queue.queue_size`` counts every request accepted and not yet
    finished: waiting *and* in flight (retrying) *and* replayed from disk. So with the backend
    down exactly ``queue_size`` requests are held; the next ``submit`` returns False and its spans
    are counted in ``dropped_spans_total{reason="queue_full"}`` (the Collector's
    ``enqueue_failed_spans``). ``queue_size`` (gauge) is that count, ``queue_capacity`` the bound.

``sending_queue.enabled: false``
    The Collector then exports synchronously in the caller's goroutine, pushing back on the
    pipeline. Our pipeline must never block, so the nearest equivalent is a queue with no waiting
    room: capacity = ``num_consumers``, i.e. a request is accepted only when a sender is free to
    take it now; otherwise ``submit`` returns False (``queue_full``). ``storage`` is ignored (with a
    warning), as the Collector ignores its storage when the queue is off.

Retry (``retry_on_failure``)
    Which failures are retryable the transport decides (``transport.py``: the OTLP spec's and the
    Collector's rules). A permanent failure drops the request
    (``dropped_spans_total{reason="permanent_error"}``), never retried. Waits: the first is
    ``initial_interval``, each next one ``multiplier`` times longer up to ``max_interval``, each
    with ±20% jitter; a server hint (HTTP ``Retry-After``, gRPC ``RetryInfo.retry_delay``)
    lengthens the wait to at least the hint, at most ``MAX_RETRY_HINT_S`` (5 min: a hint of 31
    years, with ``max_elapsed_time: 0``, parked the sender). When the next wait would
    end past ``max_elapsed_time`` since the first attempt (0 = never give up), the request is
    dropped with reason ``retries_exhausted``; with ``enabled: false`` a retryable failure drops it
    at once, reason ``retry_disabled``. Every failed attempt is counted in
    ``failed_requests_total{reason}`` (``grpc_unavailable``, ``http_503``, ``connection_error``,
    ``timeout``, ...) and every re-attempt in ``retries_total``. A warning is logged on the first
    failure of a streak and an info line on recovery; the rest go to debug.

Shutdown
    ``shutdown(timeout_s)`` stops accepting (later submits are dropped, reason ``shutdown``),
    keeps sending — with the normal backoff — until the queue is empty or the timeout, then
    cancels in-flight attempts. What remains stays on disk when ``storage`` is set, otherwise
    it is counted as dropped, reason ``shutdown``. Attempts made during shutdown use a timeout no
    longer than what is left of it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from otel_llm.exporter.exporterhelper.persistent_queue import PersistentQueue, QueueItem
from otel_llm.exporter.exporterhelper.telemetry import DROP_REASONS, metrics_for
from otel_llm.exporter.exporterhelper.transport import GrpcTransport, HttpTransport, SendResult, Session, Transport
from otel_llm.exporter.otlp.config import OtlpTraceExporter

log = logging.getLogger(__name__)

_JITTER = 0.2
MAX_RETRY_HINT_S = 300.0  # a server's retry hint is honoured up to this


def count_spans(request: ExportTraceServiceRequest) -> int:
    return sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)


class TraceExporter:
    def __init__(self, name: str, protocol: str, settings: OtlpTraceExporter,
                 registry: CollectorRegistry) -> None:
        if protocol not in ("grpc", "http"):
            raise ValueError(f"protocol must be grpc or http, got {protocol!r}")
        if bool(settings.tls.cert_file) != bool(settings.tls.key_file):
            # grpc blocks forever creating a channel with a key and no certificate chain.
            raise ValueError("tls.cert_file and tls.key_file: set both (a client certificate) or neither")
        self.name = name
        self.protocol = protocol
        self._settings = settings
        queue = settings.sending_queue
        self._num_consumers = queue.num_consumers
        self.capacity = queue.queue_size if queue.enabled else queue.num_consumers
        # The on-disk queue is opened (and locked) by start(): building an exporter touches no file.
        self._disk: PersistentQueue | None = None
        self._storage = Path(queue.storage) if queue.storage and queue.enabled else None
        if queue.storage and not queue.enabled:
            log.warning("exporter %s: sending_queue.storage is ignored because sending_queue.enabled is false", name)
        self._transport: GrpcTransport | HttpTransport = (
            GrpcTransport(settings) if protocol == "grpc" else HttpTransport(settings))
        self._first_seq = 1
        self._next_seq = 1

        self._cond = threading.Condition()
        self._pending: deque[QueueItem] = deque()
        self._inflight: set[QueueItem] = set()
        self._outstanding = 0  # reserved + pending + in flight
        self._closed = False
        self._started = False
        self._shutdown_started = False
        self._deadline: float | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

        self._log_lock = threading.Lock()
        self._storage_problem: str | None = None  # why the on-disk queue cannot be written, for /readyz
        self._storage_probed_at = 0.0
        self._probe_lock = threading.Lock()
        self._failure_streak = 0
        self._full_streak = 0
        self._partial_logged = False

        m = metrics_for(registry)
        self._enqueued_spans = m.enqueued_spans.labels(name)
        self._sent_spans = m.sent_spans.labels(name)
        self._sent_requests = m.sent_requests.labels(name)
        self._failed = m.failed_requests
        self._dropped_spans = m.dropped_spans
        self._dropped_requests = m.dropped_requests
        self._retries = m.retries.labels(name)
        self._rejected = m.rejected_spans.labels(name)
        for reason in DROP_REASONS:
            m.dropped_spans.labels(name, reason)
            m.dropped_requests.labels(name, reason)
        m.queue_size.labels(name).set_function(lambda: self._outstanding)
        m.queue_capacity.labels(name).set(self.capacity)

    # --- public API ----------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return self._outstanding

    @property
    def endpoint(self) -> str:
        return self._transport.description

    def start(self) -> None:
        """Replay what an earlier run left in ``storage`` (oldest first), then start the senders."""
        with self._cond:
            if self._started:
                raise RuntimeError(f"exporter {self.name} already started")
            if self._shutdown_started:
                raise RuntimeError(f"exporter {self.name} is shut down")
        if self._storage is not None:
            self._disk = PersistentQueue(self._storage)  # OSError (the lock is held elsewhere, not writable): not started
            self._first_seq = self._next_seq = self._disk.next_seq
            self._probe_storage()  # a full disk does not stop the start: /readyz says so until there is room
        with self._cond:
            self._started = True
        if self._disk is not None:
            items, corrupt = self._disk.load(self._first_seq)
            for path, spans, problem in corrupt:
                log.warning("exporter %s: skipping corrupt queue file %s (%s); kept as %s.corrupt",
                            self.name, path, problem, path.name)
                self._drop(spans, "corrupt_persisted")
                self._disk.quarantine(path)
            if items:
                with self._cond:
                    self._pending.extendleft(reversed(items))
                    self._outstanding += len(items)
                    self._cond.notify_all()
                log.info("exporter %s: replaying %d requests (%d spans) from %s", self.name, len(items),
                         sum(i.spans for i in items), self._disk.directory)
        for index in range(self._num_consumers):
            thread = threading.Thread(target=self._consume, name=f"otlp-export-{self.name}-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("exporter %s: sending to %s (queue %d, %d senders%s)", self.name, self.endpoint, self.capacity,
                 self._num_consumers, f", storage {self._disk.directory}" if self._disk else "")

    def submit(self, request: ExportTraceServiceRequest) -> bool:
        """Queue ``request`` for export; False (and counted as dropped) if the queue is full or closed."""
        data = request.SerializeToString()
        spans = count_spans(request)
        with self._cond:
            if self._closed:
                refused = "shutdown"
            elif self._outstanding >= self.capacity:
                refused = "queue_full"
            else:
                refused = ""
                self._outstanding += 1
                seq = self._next_seq
                self._next_seq += 1
        if refused:
            self._drop(spans, refused)
            if refused == "queue_full":
                self._note_queue_full()
            return False
        item = QueueItem(seq, data, spans)
        if self._disk is not None:
            try:
                item.path = self._disk.write(seq, data, spans)
            except OSError as exc:
                with self._cond:
                    self._outstanding -= 1
                    self._cond.notify_all()
                self._drop(spans, "storage_error")
                self._storage_failed(exc)
                return False
            self._storage_written()
        with self._cond:
            stopped = self._stop.is_set()
            if not stopped:
                self._pending.append(item)
                self._cond.notify()
        if stopped:  # shutdown finished while we were writing
            self._finish(item, "shutdown")
            return item.path is not None
        self._enqueued_spans.inc(spans)
        self._note_accepted()
        return True

    # --- the on-disk queue's room, for /readyz ---------------------------------------------------

    STORAGE_PROBE_EVERY_S = 5.0  # while it cannot be written, /readyz looks again at most this often

    def problem(self) -> str | None:
        """Why kept traces cannot be queued on disk right now (``sending_queue.storage`` cannot be
        written: a full disk), or None. While it cannot, a probe finds out when it can again."""
        due = time.monotonic() - self._storage_probed_at >= self.STORAGE_PROBE_EVERY_S
        if self._storage_problem is not None and due:
            self._probe_storage()
        return self._storage_problem

    def _probe_storage(self) -> None:
        assert self._disk is not None
        with self._probe_lock:
            self._storage_probed_at = time.monotonic()
            try:
                self._disk.probe()
            except OSError as exc:
                self._storage_failed(exc)
                return
        self._storage_written()

    def _storage_failed(self, exc: OSError) -> None:
        assert self._disk is not None
        if self._storage_problem is None:  # once per outage, not once per request
            log.error("exporter %s: cannot write to the on-disk queue %s: %s; kept traces are dropped (counted "
                      "storage_error) until it can", self.name, self._disk.directory, exc.strerror or exc)
        self._storage_problem = (f"exporters.{self.name}: sending_queue.storage {self._disk.directory} cannot be "
                                 f"written ({exc.strerror or exc}): kept traces are dropped until it can")

    def _storage_written(self) -> None:
        if self._storage_problem is not None:
            self._storage_problem = None
            log.warning("exporter %s: the on-disk queue is written again", self.name)

    def shutdown(self, timeout_s: float) -> None:
        """Stop accepting; send what is queued until done or ``timeout_s``; keep the rest on disk or drop it."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            if self._shutdown_started:
                return
            self._shutdown_started = True
            self._closed = True
            self._deadline = deadline
            if self._started:
                while self._outstanding > 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            self._stop.set()
            self._cond.notify_all()
            leftovers = list(self._pending)
            self._pending.clear()
        self._transport.abort()
        for item in leftovers:
            self._finish(item, "shutdown")
        for thread in self._threads:
            thread.join(timeout=2.0)
        with self._cond:
            stuck = list(self._inflight)
        for item in stuck:
            self._finish(item, "shutdown")
        self._transport.close()
        left = len(leftovers) + len(stuck)
        if self._disk is not None:
            self._disk.close()
            if left:
                log.info("exporter %s: %d requests left in %s for the next start", self.name, left,
                         self._disk.directory)
        elif left:
            log.warning("exporter %s: shutdown dropped %d unsent requests", self.name, left)

    # --- senders ---------------------------------------------------------------------------------

    def _consume(self) -> None:
        # Narrowed to one transport class, so that its session type is known (a union has none).
        transport = self._transport
        if isinstance(transport, GrpcTransport):
            self._serve(transport)
        else:
            self._serve(transport)

    def _serve(self, transport: Transport[Session]) -> None:
        session = transport.new_session()
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._stop.is_set():
                        self._cond.wait()
                    if self._stop.is_set():
                        return
                    item = self._pending.popleft()
                    self._inflight.add(item)
                try:
                    self._deliver(item, transport, session)
                except Exception:  # noqa: BLE001 - a sender thread must never die
                    log.exception("exporter %s: unexpected error sending a request; dropped", self.name)
                    self._finish(item, "permanent_error")
        finally:
            transport.close_session(session)

    def _attempt_timeout(self) -> float | None:
        timeout = self._settings.timeout or None
        deadline = self._deadline
        if deadline is not None:
            remaining = max(0.05, deadline - time.monotonic())
            timeout = remaining if timeout is None else min(timeout, remaining)
        return timeout

    def _deliver(self, item: QueueItem, transport: Transport[Session], session: Session) -> None:
        retry = self._settings.retry_on_failure
        body = transport.prepare(item.data)
        started = time.monotonic()
        interval = retry.initial_interval
        while True:
            result = transport.send(body, self._attempt_timeout(), session)
            if result.ok:
                self._note_success()
                self._finish(item, "sent", result.rejected, result.rejected_message)
                return
            self._failed.labels(self.name, result.reason).inc()
            if self._stop.is_set():
                self._finish(item, "shutdown")
                return
            if not result.retryable:
                self._note_failure(result, "dropping the request (not retryable)")
                self._finish(item, "permanent_error")
                return
            if not retry.enabled:
                self._note_failure(result, "dropping the request (retry_on_failure is disabled)")
                self._finish(item, "retry_disabled")
                return
            delay = interval * random.uniform(1 - _JITTER, 1 + _JITTER)
            interval = min(interval * retry.multiplier, retry.max_interval)
            if result.throttle_s is not None:
                # A hint is honoured up to MAX_RETRY_HINT_S: "Retry-After: 10000000000" with
                # max_elapsed_time 0 parked a sender for 31 years (and 1e10 s overflowed the wait).
                delay = max(delay, min(result.throttle_s, MAX_RETRY_HINT_S))
            if retry.max_elapsed_time > 0 and time.monotonic() - started + delay > retry.max_elapsed_time:
                self._note_failure(result, f"dropping the request (retrying for over {retry.max_elapsed_time:g}s)")
                self._finish(item, "retries_exhausted")
                return
            self._note_failure(result, f"retrying in {delay:.2f}s")
            if self._stop.wait(delay):
                self._finish(item, "shutdown")
                return
            self._retries.inc()

    # --- accounting --------------------------------------------------------------------------

    def _drop(self, spans: int, reason: str) -> None:
        self._dropped_requests.labels(self.name, reason).inc()
        if spans:
            self._dropped_spans.labels(self.name, reason).inc(spans)

    def _finish(self, item: QueueItem, outcome: str, rejected: int = 0, rejected_message: str = "") -> None:
        """Account for ``item`` once: sent, dropped for ``outcome``, or (shutdown with storage) left on disk."""
        with self._cond:
            first = not item.done
            if first:
                item.done = True
                self._inflight.discard(item)
                self._outstanding -= 1
                self._cond.notify_all()
        if outcome == "sent":
            if item.path is not None:
                PersistentQueue.remove(item.path)
            if not first:
                return
            rejected = min(rejected, item.spans)
            self._sent_requests.inc()
            self._sent_spans.inc(item.spans - rejected)
            if rejected:
                self._rejected.inc(rejected)
                self._note_partial(rejected, rejected_message)
            return
        if not first:
            return
        if outcome == "shutdown" and item.path is not None:
            return  # stays in storage for the next start
        self._drop(item.spans, outcome)
        if item.path is not None:
            PersistentQueue.remove(item.path)

    # --- logging without spam ------------------------------------------------------------------

    def _note_failure(self, result: SendResult, action: str) -> None:
        with self._log_lock:
            self._failure_streak += 1
            first = self._failure_streak == 1
        level = logging.WARNING if first else logging.DEBUG
        log.log(level, "exporter %s: export to %s failed (%s: %s); %s%s", self.name, self.endpoint, result.reason,
                result.detail, action, "" if not first else "; further failures are logged at debug until it recovers")

    def _note_success(self) -> None:
        with self._log_lock:
            streak, self._failure_streak = self._failure_streak, 0
        if streak:
            log.info("exporter %s: exports to %s succeed again after %d failed attempts", self.name, self.endpoint,
                     streak)

    def _note_queue_full(self) -> None:
        with self._log_lock:
            self._full_streak += 1
            first = self._full_streak == 1
        if first:
            log.warning("exporter %s: sending queue full (%d requests); dropping new requests until it drains",
                        self.name, self.capacity)

    def _note_accepted(self) -> None:
        if not self._full_streak:
            return
        with self._log_lock:
            streak, self._full_streak = self._full_streak, 0
        if streak:
            log.info("exporter %s: sending queue accepts again after refusing %d requests", self.name, streak)

    def _note_partial(self, rejected: int, message: str) -> None:
        with self._log_lock:
            first, self._partial_logged = not self._partial_logged, True
        log.log(logging.WARNING if first else logging.DEBUG,
                "exporter %s: the backend rejected %d spans: %s%s", self.name, rejected, message,
                " (further partial successes are logged at debug)" if first else "")
