"""The traces pipeline as a graph: admitted requests in; request records, metrics and kept traces out.

Requests arrive from the receiver process (``service/processes.py``) as bytes. One worker thread
``buffer``s them: the adapter stage, then the tail sampler's trace buffer. A ticker completes the
traces that are due, and they go one way along the chain the pipeline's processors make, in their
listed order::

    buffer (tail_sampling) -> llm_metrics -> decision (tail_sampling) -> redaction -> kept-trace consumers

Each arrow is one ``consume_batch(list[CompletedTrace])`` call per tick; nothing calls back up the chain.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.component import KeptTraceConsumer
from otel_llm.internal import core as native_core
from otel_llm.internal.runtime import name_thread
from otel_llm.pdata.spans import PendingTrace
from otel_llm.pdata.traces import CompletedTrace, Decision, Remembered, TraceConsumer
from otel_llm.processor.llm_metrics.config import LlmMetricsProcessor
from otel_llm.processor.llm_metrics.digest import digest_in_process, digest_settings
from otel_llm.processor.llm_metrics.metrics.recorder import MetricsRecorder
from otel_llm.processor.llm_metrics.stage import LlmMetricsStage
from otel_llm.processor.memory_limiter.config import MemoryLimiterProcessor
from otel_llm.processor.memory_limiter.limiter import MemoryLimiter
from otel_llm.processor.redaction.config import RedactionProcessor
from otel_llm.processor.redaction.stage import RedactionStage, intake_redaction_of
from otel_llm.processor.tail_sampling.assembler import AssemblySettings, TraceAssembler, make_assembler
from otel_llm.processor.tail_sampling.config import TailSamplingProcessor, open_calls_per_sender
from otel_llm.processor.tail_sampling.sampler import TailSampler
from otel_llm.processor.tail_sampling.stage import DecisionStage
from otel_llm.receiver.otlp.admission import SHUTTING_DOWN, check_ids
from otel_llm.receiver.otlp.intake_log import IntakeLogKeeper, Record
from otel_llm.receiver.otlp.process import IntakeState
from otel_llm.service.lane import completion_lane
from otel_llm.service.telemetry import SelfTelemetry, incrementer

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class IntakeItem:
    data: bytes  # a request of ``spans`` spans in ``size`` bytes
    spans: int
    size: int
    validated: bool = False  # the receiver process's core validated these bytes (``process.VALIDATED``)


class Intake:
    """The pipeline's end of the intake: requests the receiver process admitted, as bytes, until the
    worker has processed them. Its bound is enforced where requests are admitted (``IntakeState``):
    a full intake is a retryable refusal there, never unbounded memory or a silent drop here."""

    def __init__(self, state: IntakeState) -> None:
        self.state = state
        self._items: deque[IntakeItem] = deque()
        self._cond = threading.Condition()
        self.held_spans = 0  # arrived here and not yet processed
        self.held_bytes = 0

    @property
    def queued_spans(self) -> int:
        """Admitted and not yet processed, including what is still on its way from the receivers."""
        return self.state.queued_spans

    def put(self, data: bytes, spans: int, size: int, validated: bool = False) -> None:
        """``data``: a request of ``spans`` spans in ``size`` bytes."""
        with self._cond:
            self._items.append(IntakeItem(data, spans, size, validated))
            self.held_spans += spans
            self.held_bytes += size
            self._cond.notify()

    def take(self, timeout_s: float) -> IntakeItem | None:
        with self._cond:
            if not self._items:
                self._cond.wait(timeout_s)
            if not self._items:
                return None
            return self._items.popleft()

    def done(self, spans: int, size: int) -> None:
        """Processed (or dropped, counted): release the room the receivers reserved."""
        self.state.release(spans, size)
        with self._cond:
            self.held_spans -= spans
            self.held_bytes -= size
            self._cond.notify_all()

    def forget_in_flight(self) -> int:
        """The receivers are gone: what they admitted and never sent will not come. Returns that count."""
        with self._cond:
            return self.state.reset_queued(self.held_spans, self.held_bytes)

    def close_and_wait(self, timeout_s: float) -> bool:
        """Refuse new data; wait until everything admitted has been processed."""
        self.state.close()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            # Spans still on their way from the receivers do not notify: poll for them.
            while self.state.queued_spans > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, 0.05))
            return True


class _Entry:
    """Where completed traces enter the chain: counted, given their journaled decision if a run
    before a crash made one, and kept apart, so one trace that fails is counted and the next goes on."""

    def __init__(self, telemetry: SelfTelemetry) -> None:
        self.telemetry = telemetry
        self.next: TraceConsumer | None = None
        self.intake_log: IntakeLogKeeper | None = None
        self._late = incrementer(telemetry.late_spans)
        self._completed: dict[str, Callable[[float], None]] = {}  # reason -> its child's increment, looked up once

    def consume_batch(self, batch: list[CompletedTrace]) -> None:
        assert self.next is not None
        intake_log = self.intake_log
        by_reason: dict[str, int] = {}  # counted once per reason per batch
        late = 0
        for completed in batch:
            if completed.late:
                late += 1
                continue
            reason = completed.reason
            by_reason[reason] = by_reason.get(reason, 0) + 1
            journal = intake_log.prior.get(completed.trace.trace_id) if intake_log is not None else None
            if journal is not None:
                completed.prior = Remembered(Decision(journal.keep, journal.policy, journal.threshold,
                                                      journal.rate_limited), set(journal.measured))
        if late:
            self._late(late)
        for reason, traces in by_reason.items():
            self.count_completed(reason, traces)
        self.hand_on(batch, self.next)

    def count_completed(self, reason: str, traces: int) -> None:
        count = self._completed.get(reason)
        if count is None:
            count = self._completed[reason] = incrementer(self.telemetry.traces_completed.labels(reason))
        count(traces)

    def hand_on(self, batch: list[CompletedTrace], consumer: TraceConsumer, failure: Exception | None = None) -> None:
        """``batch`` to ``consumer``; then each trace that failed, or every trace where the chain itself
        did (``failure``, or what ``consumer`` raised), logged and its spans counted dropped."""
        try:
            consumer.consume_batch(batch)
        except Exception as exc:  # a fault of the chain itself, not of one trace: the batch's traces are lost
            failure = exc
        if failure is not None:
            for completed in batch:
                if completed.error is None:
                    completed.error = failure
        for completed in batch:
            if completed.error is not None:  # counted, and the next traces are still assembled
                log.error("completing trace %s failed", completed.trace_id.hex(), exc_info=completed.error)
                self.telemetry.spans_dropped.labels("assembly_error").inc(len(completed.trace.spans))


UNREADY_AFTER_REFUSING_S = 5.0


# How far the ticker may fall behind the due traces before the worker completes them itself:
# a few of its 0.1 s ticks, so paced traffic never takes this path.
WORKER_COMPLETES_AFTER_S = 0.5


class Pipeline:
    """Built from the traces pipeline's processors (``processors``: name -> config, in listed order)
    and its kept-trace consumers (the exporters that take kept traces)."""

    def __init__(self, processors: dict[str, object], consumers: Sequence[KeptTraceConsumer],
                 telemetry: SelfTelemetry, intake: IntakeState) -> None:
        self.telemetry = telemetry
        self.processors = list(processors)
        sampling = processors.get("tail_sampling")
        # Without tail_sampling in the pipeline the buffer still groups spans by trace (records need
        # whole traces), on tail_sampling's documented defaults; every trace then goes on.
        buffer_config = sampling if isinstance(sampling, TailSamplingProcessor) else TailSamplingProcessor()
        redaction = processors.get("redaction")
        assert isinstance(redaction, RedactionProcessor), "validation requires redaction in every traces pipeline"
        metrics = processors.get("llm_metrics")
        self.consumers = list(consumers)
        self._entry = _Entry(telemetry)
        self.assembler: TraceAssembler = make_assembler(
            AssemblySettings(
                decision_wait_s=buffer_config.decision_wait,
                grace_s=buffer_config.grace,
                max_open_call_wait_s=buffer_config.max_open_call_wait,
                max_open_calls_per_sender=open_calls_per_sender(buffer_config),
                max_traces=buffer_config.num_traces,
                max_spans_per_trace=buffer_config.max_spans_per_trace,
                decided_cache_size=buffer_config.decision_cache_size,
            ),
            self._entry,
            native_core.active()[0],
            spans_dropped=telemetry.spans_dropped.labels("max_spans_per_trace"),
            spans_duplicate=telemetry.spans_duplicate,
        )
        telemetry.traces_in_memory.set_function(self.assembler.__len__)
        telemetry.traces_held_open_calls.set_function(lambda: self.assembler.held_traces)
        self.redaction = RedactionStage(redaction, telemetry, self.consumers)
        self.decision = DecisionStage(TailSampler(sampling) if isinstance(sampling, TailSamplingProcessor) else None,
                                      self.assembler, telemetry, self.redaction)
        self.metrics: LlmMetricsStage | None = None
        if isinstance(metrics, LlmMetricsProcessor):
            self.metrics = LlmMetricsStage(metrics, telemetry, self.decision)
        self._entry.next = self.metrics if self.metrics is not None else self.decision
        self.assembler.lane = completion_lane(native_core.active()[0], self.assembler, self._entry, self.metrics,
                                              self.decision, self.redaction)
        self.digest_settings = digest_settings(metrics if isinstance(metrics, LlmMetricsProcessor)
                                               else LlmMetricsProcessor(), redaction)
        # receivers.otlp.intake_log: content removed before a request is written (None: allow_content);
        # what the pipeline reads of a replayed request (span and resource attributes) stays.
        resource_keys = [rule.attribute for rule in metrics.model_name.from_resource] \
            if isinstance(metrics, LlmMetricsProcessor) else []
        self.intake_redaction = intake_redaction_of(redaction, (*self.digest_settings.kept_attribute_keys,
                                                                *resource_keys))
        self._malformed = telemetry.spans_malformed
        self._matched = telemetry.spans_engine
        self._stop = threading.Event()
        self._tick_lock = threading.Lock()
        self._ticker: threading.Thread | None = None
        self._worker: threading.Thread | None = None
        self.intake = Intake(intake)
        telemetry.intake_queued_spans.set_function(lambda: self.intake.queued_spans)
        self.intake_log: IntakeLogKeeper | None = None  # receivers.otlp.intake_log: see ``use_intake_log``
        limiter = processors.get("memory_limiter")
        self._refusing_since: float | None = None  # the memory limiter's refusal, for /readyz

        def limiter_changed(refusing: bool) -> None:
            self._refusing_since = time.monotonic() if refusing else None
            intake.set_refusing(refusing)

        self.memory_limiter = MemoryLimiter(limiter, shed=self.assembler.shed, on_change=limiter_changed) \
            if isinstance(limiter, MemoryLimiterProcessor) else None

    def problem(self) -> str | None:
        """For /readyz: the memory limiter has refused every export, or the intake has kept refusing
        clients for being full, for ``UNREADY_AFTER_REFUSING_S`` (a load balancer should send
        elsewhere; a short spike is ridden out without flapping)."""
        since = self._refusing_since
        if since is not None and (refusing := time.monotonic() - since) >= UNREADY_AFTER_REFUSING_S:
            return f"processors.memory_limiter has refused data for {refusing:.0f}s (memory above its soft limit)"
        if (full := self.intake.state.refusing_full_for()) >= UNREADY_AFTER_REFUSING_S:
            return (f"receivers.otlp has refused requests for {full:.0f}s because its intake is full (queue_full: "
                    "the pipeline does not keep up with what is sent)")
        return None

    @property
    def recorder(self) -> MetricsRecorder | None:
        return self.metrics.recorder if self.metrics is not None else None

    def use_intake_log(self, intake_log: IntakeLogKeeper) -> None:
        self.intake_log = intake_log
        self.assembler.lane = None  # the chain journals each decision and applies the journal's
        self._entry.intake_log = intake_log
        self.decision.intake_log = intake_log
        if self.metrics is not None:
            self.metrics.intake_log = intake_log

    # --- intake ----------------------------------------------------------------------------

    def receive(self, data: bytes, spans: int, size: int, validated: bool = False) -> None:
        """A request the receivers admitted: queue it for the worker."""
        if self.intake_log is not None:
            self.intake_log.arrived()
        self.intake.put(data, spans, size, validated)
        if self.memory_limiter is not None:
            self.memory_limiter.refuse_if_over(self.intake.state.queued_bytes)

    def replay(self, records: Iterable[Record]) -> None:
        """Requests from the intake log (``IntakeLogKeeper.recover``), before the receivers start:
        through the bounded intake, so a long log is replayed as fast as the worker takes it."""
        assert self.intake_log is not None
        state = self.intake.state
        for record in records:
            size = len(record.payload)
            while (refused := state.reserve(record.spans, size, client=False)):
                if refused == SHUTTING_DOWN:
                    raise OSError("stopped during the intake log's replay")
                time.sleep(0.01)
            self.intake_log.arrived(record.seq)
            self.intake.put(record.payload, record.spans, size)

    def _work(self) -> None:
        name_thread("otel-llm-worker")
        while True:
            item = self.intake.take(timeout_s=0.5)
            if item is None:
                if self._stop.is_set():
                    return
                continue
            try:
                self.buffer(item.data, item.validated)
            except Exception:  # one bad batch must not stop the pipeline; it is counted
                log.exception("processing an export request failed")
                self.telemetry.spans_dropped.labels("processing_error").inc(item.spans)
            finally:
                self.intake.done(item.spans, item.size)
                if self.intake_log is not None:
                    self.intake_log.processed()
            if self.assembler.completion_lag() > WORKER_COMPLETES_AFTER_S:
                self._complete_due()

    def _complete_due(self) -> None:
        """The ticker is behind (saturated, the two threads share one GIL): the worker completes the
        due traces itself before it buffers more. Otherwise buffering outruns completion until
        ``max_traces`` completes the oldest traces early, ready or not (measured: a quarter of all
        completions at saturation), on a larger heap."""
        with self._tick_lock:
            if self._stop.is_set():
                return
            try:
                self.assembler.tick()
            except Exception:  # as in the ticker: a bug in one trace must not stop the intake
                log.exception("trace completion failed")

    def buffer(self, data: bytes, validated: bool = False) -> int:
        """One request into the trace buffer, its adapter counts into self-telemetry; ``validated``:
        bytes the receiver process's core validated (``IntakeItem``). Returns the spans buffered."""
        spans, counts = digest_in_process(data, self.digest_settings, validated)
        telemetry = self.telemetry
        if counts.truncated:
            telemetry.spans_truncated.inc(counts.truncated)
        if counts.passed_through:
            telemetry.spans_passed_through.inc(counts.passed_through)
        for adapter, count in counts.matched.items():
            self._matched.labels(adapter).inc(count)
        for (reason, service), count in counts.malformed.items():
            self._malformed.labels(reason).inc(count)
            telemetry.count_unmeasured(service, reason, count)
        if spans:
            self.assembler.add_batch(spans)
        return len(spans)

    # --- lifecycle -------------------------------------------------------------------------

    def _flush(self, only_if_due: bool) -> None:
        for consumer in self.consumers:
            consumer.flush(only_if_due)

    def start(self, tick_interval_s: float = 0.1) -> None:
        def run() -> None:
            name_thread("otel-llm-ticker")
            while not self._stop.wait(tick_interval_s):
                with self._tick_lock:
                    if self._stop.is_set():
                        return
                    try:
                        started = time.monotonic()
                        self.assembler.tick()
                        if self.intake_log is not None:
                            self.intake_log.ticked(started, self.assembler.overdue)
                        self._flush(True)
                    except Exception:  # a bug in one trace must not stop every later decision
                        log.exception("trace completion failed")

        self._ticker = threading.Thread(target=run, name="otel-llm-assembler", daemon=True)
        self._ticker.start()
        self._worker = threading.Thread(target=self._work, name="otel-llm-pipeline", daemon=True)
        self._worker.start()
        if self.memory_limiter is not None:
            self.memory_limiter.start()

    def shutdown(self, timeout_s: float = 30.0, hand_over: Callable[[PendingTrace], bool] | None = None,
                 write_handover: Callable[[list[PendingTrace]], list[PendingTrace]] | None = None) -> None:
        """Process everything accepted, then decide every pending trace and flush the batches; the
        traces ``hand_over`` picks go to ``write_handover`` undecided instead (for the next start),
        and those it returns (not written) are decided with the rest."""
        if not self.intake.close_and_wait(timeout_s):
            log.error("pipeline did not finish its queue within %.0fs; %d spans unprocessed",
                      timeout_s, self.intake.queued_spans)
            self.telemetry.spans_dropped.labels("shutdown_timeout").inc(self.intake.queued_spans)
        if self.memory_limiter is not None:
            self.memory_limiter.stop()
        # Under the tick lock no completion can run concurrently, so nothing reaches a batcher
        # after its final flush, however long a tick takes on a loaded machine.
        with self._tick_lock:
            self._stop.set()
            if hand_over is not None and write_handover is not None:
                handed = self.assembler.take_pending(hand_over)
                if handed:
                    self.assembler.complete_now(write_handover(handed))
            self.assembler.drain()
            self._flush(False)
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        if self._worker is not None:
            self._worker.join(timeout=5)

    def take_over(self, requests: Iterable[bytes]) -> TakenOver:
        """Traces written by an earlier run (a predecessor's handover, the intake log's carried
        traces), before the receivers listen: buffered again as they were first received, through
        the receivers' checks. A record that does not decode is counted damaged and skipped (the
        rest are taken); a span with an unusable id is dropped and counted, as a receiver does."""
        taken = TakenOver()
        for data in requests:
            try:
                request = ExportTraceServiceRequest.FromString(data)
            except DecodeError:
                taken.damaged += 1
                continue
            ids = check_ids(request)
            if ids.rejected:
                taken.rejected_spans += ids.rejected
                data = request.SerializeToString()
            try:
                taken.spans += self.buffer(data)
            except Exception:  # as in the worker: counted, and the next record is still taken
                log.exception("buffering a taken-over record failed")
                taken.damaged += 1
                continue
            taken.traces.update(span.trace_id for resource_spans in request.resource_spans
                                for scope_spans in resource_spans.scope_spans for span in scope_spans.spans)
        return taken


@dataclass(slots=True)
class TakenOver:
    """What ``Pipeline.take_over`` buffered again, and what it could not."""

    spans: int = 0
    traces: set[bytes] = field(default_factory=set)
    damaged: int = 0  # records that do not decode (a CRC matches bytes that are no request)
    rejected_spans: int = 0  # spans with an unusable trace, span or parent id (``admission.check_ids``)
