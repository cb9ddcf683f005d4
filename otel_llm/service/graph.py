"""The trace pipeline: admitted requests in; request records, metrics and kept traces out.

Requests arrive from the receiver process (``otel_llm/service/processes.py``) as bytes, or from the adapter
process already digested. One worker thread ``buffer``s them: the adapter stage where it was not
done yet (per span the adapter's reading, the few attributes assembly reads, the span's bytes),
then the trace buffer; a ticker completes traces: records, metrics, the sampling decision, and
delivery of kept traces.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.processor.llm_metrics.digest import decode, digest_in_process, digest_settings
from otel_llm.pdata.records import RequestRecord, Side
from otel_llm.processor.llm_metrics.requests import Dimension, RecordSettings, ResourceModelRule, records_of_trace
from otel_llm.processor.redaction.synthesis import NO_REDACTION, Redaction, RedactionCounts, kept_trace_request
from otel_llm.processor.tail_sampling.assembler import AssemblySettings, BufferedSpan, PendingTrace, TraceAssembler
from otel_llm.config import Config, RedactionProcessor
from otel_llm.processor.memory_limiter.limiter import MemoryLimiter
from otel_llm.processor.llm_metrics.metrics.definitions import genai_client_naming, genai_naming, own_naming, vllm_naming
from otel_llm.processor.llm_metrics.metrics.recorder import MetricsRecorder
from otel_llm.service.telemetry import SelfTelemetry
from otel_llm.receiver.otlp.admission import SHUTTING_DOWN
from otel_llm.receiver.otlp.intake_log import IntakeLogKeeper, Record
from otel_llm.receiver.otlp.process import IntakeState
from otel_llm.processor.tail_sampling.sampler import Decision, TailSampler

# A destination for kept traces (the store, an OTLP exporter): the request, its span count, its
# request records and the policy that kept it; returns False when it had to drop it.
KeptTraceSink = Callable[[ExportTraceServiceRequest, int, list[RequestRecord], str], bool]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Remembered:
    """What the decision cache keeps of a completed trace: its decision, and which engine spans
    were measured, so a replayed span is not measured twice while a genuinely late one is."""

    decision: Decision
    measured: set[bytes]


class Intake:
    """The pipeline's end of the intake: requests the receiver process admitted, as bytes, until the
    worker has processed them. Its bound is enforced where requests are admitted (``IntakeState``):
    a full intake is a retryable refusal there, never unbounded memory or a silent drop here."""

    def __init__(self, state: IntakeState) -> None:
        self.state = state
        self._items: deque[tuple[bytes, int, int, bool]] = deque()
        self._cond = threading.Condition()
        self.held_spans = 0  # arrived here and not yet processed
        self.held_bytes = 0

    @property
    def queued_spans(self) -> int:
        """Admitted and not yet processed, including what is still on its way from the receivers."""
        return self.state.queued_spans

    def put(self, data: bytes, spans: int, size: int, digested: bool) -> None:
        """``data``: a request of ``spans`` spans in ``size`` bytes, or the adapter process's output for it."""
        with self._cond:
            self._items.append((data, spans, size, digested))
            self.held_spans += spans
            self.held_bytes += size
            self._cond.notify()

    def take(self, timeout_s: float) -> tuple[bytes, int, int, bool] | None:
        with self._cond:
            if not self._items:
                self._cond.wait(timeout_s)
            if not self._items:
                return None
            return self._items.popleft()

    def done(self, spans: int, size: int, held: bool = True) -> None:
        """Processed (or dropped, counted): release the room the receivers reserved."""
        self.state.release(spans, size)
        with self._cond:
            if held:
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


def redaction_of(config: RedactionProcessor) -> Redaction:
    extra_globs = [k for k in config.additional_blocked_keys if "*" in k]
    extra_prefixes = [k for k in config.additional_blocked_keys if "*" not in k]
    return Redaction(
        key_prefixes=tuple(config.blocked_key_prefixes + extra_prefixes),
        key_patterns=tuple(config.blocked_key_patterns + extra_globs),
        event_names=frozenset(config.blocked_event_names),
        max_free_text_bytes=config.max_free_text_bytes,
        allowed_keys=frozenset(config.allowed_keys),
    )


def record_settings(config: Config) -> RecordSettings:
    metrics = config.processors.llm_metrics
    return RecordSettings(
        resource_model_rules=tuple(ResourceModelRule(r.attribute, dict(r.values)) for r in metrics.model_name.from_resource),
        default_model=metrics.model_name.default,
        default_operation=metrics.default_operation_name,
        edge_ttft_attributes=tuple(metrics.edge_time_to_first_token.attributes),
        dimensions=tuple(Dimension(d.name, d.attribute, frozenset(d.values), d.other) for d in metrics.dimensions),
        max_latency_s=metrics.max_latency,
    )


def one_per_request(records: list[RequestRecord]) -> list[RequestRecord]:
    """The records a store row is written for: a client record joined to a server record is the
    same request, described once (by the server record, which carries the client overhead)."""
    return [r for r in records if r.side == Side.SERVER or not r.joined_span_id]


class Pipeline:
    def __init__(self, config: Config, telemetry: SelfTelemetry, intake: IntakeState) -> None:
        metrics_config = config.processors.llm_metrics
        sampling = config.processors.tail_sampling
        namings = []
        if metrics_config.namings.vllm:
            namings.append(vllm_naming(metrics_config.max_model_len))
        if metrics_config.namings.gen_ai:
            namings.append(genai_naming())
            namings.append(genai_client_naming())
        namings.append(own_naming())
        self.settings = record_settings(config)
        self.digest_settings = digest_settings(config)
        self.telemetry = telemetry
        self.recorder = MetricsRecorder(namings, tuple(d.name for d in self.settings.dimensions), metrics_config.series_limit)
        self.assembler = TraceAssembler(
            AssemblySettings(
                decision_wait_s=sampling.decision_wait,
                grace_s=sampling.grace,
                max_traces=sampling.num_traces,
                max_spans_per_trace=sampling.max_spans_per_trace,
                decided_cache_size=sampling.decision_cache_size,
            ),
            on_complete=self._on_trace_complete,
            on_late_span=self._on_late_span,
            on_spans_dropped=lambda reason, count: telemetry.spans_dropped.labels(reason).inc(count),
        )
        telemetry.traces_in_memory.set_function(lambda: len(self.assembler))
        self.sampler = TailSampler(sampling)
        redaction = config.processors.redaction
        self.redaction = NO_REDACTION if redaction.allow_content else redaction_of(redaction)
        self._redacted = {reason: telemetry.attributes_redacted.labels(reason)
                          for reason in ("content_key", "free_text", "content_event")}
        self._rejected: dict[str, object] = {}
        self.sinks: dict[str, KeptTraceSink] = {}
        self.flushers: list[Callable[[bool], None]] = []  # batching sinks: flush(only_if_due)
        self._malformed = telemetry.spans_malformed
        self._matched = telemetry.spans_engine
        # Labelled children looked up once: per-record telemetry must cost well under a microsecond.
        self._decision_counters: dict[tuple[str, bool, bool], object] = {}
        self._assembled_counters: dict[tuple[object, object], object] = {}
        self._stop = threading.Event()
        self._tick_lock = threading.Lock()
        self._ticker: threading.Thread | None = None
        self._worker: threading.Thread | None = None
        self.intake = Intake(intake)
        telemetry.intake_queued_spans.set_function(lambda: self.intake.queued_spans)
        self.intake_log: IntakeLogKeeper | None = None  # receivers.otlp.intake_log: set by the service
        self.memory_limiter = MemoryLimiter(config.processors.memory_limiter, shed=self.assembler.shed,
                                            on_change=intake.set_refusing)

    # --- intake ----------------------------------------------------------------------------

    def receive(self, data: bytes, spans: int, size: int, digested: bool) -> None:
        """A request the receivers admitted (and the adapter process digested): queue it for the worker."""
        if self.intake_log is not None:
            self.intake_log.arrived()
        self.intake.put(data, spans, size, digested)
        self.memory_limiter.refuse_if_over(self.intake.state.queued_bytes)

    def receive_failure(self, spans: int, size: int) -> None:
        """A request the adapter stage could not process (logged there): counted, its room released."""
        self.telemetry.spans_dropped.labels("processing_error").inc(spans)
        if self.intake_log is not None:
            self.intake_log.arrived(failed=True)
        self.intake.done(spans, size, held=False)

    def replay(self, records: Iterable[Record]) -> None:
        """Requests from the intake log (``IntakeLogKeeper.recover``), before the receivers start:
        through the bounded intake, so a long log is replayed as fast as the worker takes it."""
        assert self.intake_log is not None
        state = self.intake.state
        for record in records:
            size = len(record.payload)
            while (refused := state.reserve(record.spans, size)):
                if refused == SHUTTING_DOWN:
                    raise OSError("stopped during the intake log's replay")
                time.sleep(0.01)
            self.intake_log.arrived(record.seq)
            self.intake.put(record.payload, record.spans, size, False)

    def _work(self) -> None:
        while True:
            item = self.intake.take(timeout_s=0.5)
            if item is None:
                if self._stop.is_set():
                    return
                continue
            data, spans, size, digested = item
            try:
                self.buffer(data, digested)
            except Exception:  # one bad batch must not stop the pipeline; it is counted
                log.exception("processing an export request failed")
                self.telemetry.spans_dropped.labels("processing_error").inc(spans)
            finally:
                self.intake.done(spans, size)
                if self.intake_log is not None:
                    self.intake_log.processed()

    def buffer(self, data: bytes, digested: bool) -> None:
        """One request into the trace buffer, its adapter counts into self-telemetry."""
        if digested:
            spans, counts = decode(data)
        else:
            request = ExportTraceServiceRequest()
            request.ParseFromString(data)  # decoded once already in the receiver process
            spans, counts = digest_in_process(request, self.digest_settings)
        telemetry = self.telemetry
        if counts.truncated:
            telemetry.spans_truncated.inc(counts.truncated)
        if counts.passed_through:
            telemetry.spans_passed_through.inc(counts.passed_through)
        for adapter, count in counts.matched.items():
            self._matched.labels(adapter).inc(count)
        for reason, count in counts.malformed.items():
            self._malformed.labels(reason).inc(count)
        if spans:
            self.assembler.add_batch(spans)

    # --- completion ------------------------------------------------------------------------

    def _on_trace_complete(self, trace: PendingTrace, reason: str) -> None:
        self.telemetry.traces_completed.labels(reason).inc()
        # Decided before a crash (the intake log's journal): the same decision, nothing measured twice.
        prior = self.intake_log.prior.get(trace.trace_id) if self.intake_log is not None else None
        try:
            malformed: list[str] = []  # requests whose spans could not make one (counted, not measured)
            records = records_of_trace(trace, self.settings, malformed)
            for malformed_reason in malformed if prior is None else ():
                self._malformed.labels(malformed_reason).inc()
            decision = self.sampler.decide(trace, records) if prior is None else \
                Decision(prior.keep, prior.policy, prior.threshold, prior.rate_limited)
        except Exception:  # counted, and the next trace is still assembled
            log.exception("assembling trace %s failed", trace.trace_id.hex())
            self.telemetry.spans_dropped.labels("assembly_error").inc(len(trace.spans))
            return
        measured = {r.span_id for r in records}
        if prior is not None:
            measured |= prior.measured
        self.assembler.remember_decision(trace.trace_id, Remembered(decision, measured))
        if prior is None:
            self._count_decision(decision)
        # Metrics count every request whatever the decision; only exemplars follow it.
        for record in records:
            if prior is None or record.span_id not in prior.measured:
                self._record(record, decision.keep)
        if self.intake_log is not None:
            self.intake_log.decided(trace.trace_id, decision.keep, decision.rate_limited, decision.policy,
                                    decision.threshold, measured)
        if decision.keep:
            redacted = RedactionCounts()
            request, spans = kept_trace_request(list(trace.spans.values()), records, decision.policy,
                                                decision.threshold, self.redaction, redacted)
            self._count_redacted(redacted)
            self._deliver(request, spans, one_per_request(records), decision.policy)

    def _count_decision(self, decision: Decision) -> None:
        key = (decision.policy, decision.keep, decision.rate_limited)
        child = self._decision_counters.get(key)
        if child is None:
            outcome = "kept" if decision.keep else ("rate_limited" if decision.rate_limited else "dropped")
            child = self._decision_counters[key] = self.telemetry.sampling_decisions.labels(
                decision.policy or "none", outcome)
        child.inc()

    def _deliver(self, request: ExportTraceServiceRequest, spans: int, records: list[RequestRecord],
                 policy: str) -> None:
        for name, sink in self.sinks.items():
            if not sink(request, spans, records, policy):
                self.telemetry.kept_traces_dropped.labels(name).inc()

    def _on_late_span(self, buffered: BufferedSpan, remembered: object) -> None:
        """A span of an already decided trace: it follows the decision, and is measured once at most."""
        self.telemetry.late_spans.inc()
        if not isinstance(remembered, Remembered):  # the trace is being completed right now
            remembered = None
        kept = remembered is not None and remembered.decision.keep
        records: list[RequestRecord] = []
        if buffered.is_engine:
            single = PendingTrace(buffered.trace_id, 0.0, {buffered.span_id: buffered})
            malformed: list[str] = []
            records = records_of_trace(single, self.settings, malformed)
            replayed = remembered is not None and buffered.span_id in remembered.measured
            if not replayed:
                for malformed_reason in malformed:
                    self._malformed.labels(malformed_reason).inc()
                for record in records:
                    self._record(record, kept)
                if remembered is not None:
                    remembered.measured.add(buffered.span_id)
                elif self.intake_log is not None:
                    self.intake_log.measured_late(buffered.trace_id, buffered.span_id)
        if self.intake_log is not None and remembered is not None:
            # The newest journal knows the trace was decided (a replay must not decide it again).
            decision = remembered.decision
            self.intake_log.decided(buffered.trace_id, decision.keep, decision.rate_limited, decision.policy,
                                    decision.threshold, remembered.measured)
        if kept:
            assert remembered is not None
            decision = remembered.decision
            redacted = RedactionCounts()
            request, spans = kept_trace_request([buffered], records, decision.policy, decision.threshold,
                                                self.redaction, redacted)
            self._count_redacted(redacted)
            self._deliver(request, spans, one_per_request(records), decision.policy)

    def _count_redacted(self, redacted: RedactionCounts) -> None:
        for reason, count in (("content_key", redacted.content_keys), ("free_text", redacted.free_text),
                              ("content_event", redacted.content_events)):
            if count:
                self._redacted[reason].inc(count)  # type: ignore[attr-defined]

    def _record(self, record: RequestRecord, with_exemplars: bool = False) -> None:
        for reason in record.rejected:
            child = self._rejected.get(reason)
            if child is None:
                child = self._rejected[reason] = self.telemetry.values_rejected.labels(reason)
            child.inc()  # type: ignore[attr-defined]
        key = (record.engine_kind, record.outcome)
        child = self._assembled_counters.get(key)
        if child is None:
            child = self._assembled_counters[key] = self.telemetry.requests_assembled.labels(
                record.engine_kind, record.outcome)
        child.inc()
        self.recorder.record(record, with_exemplars)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, tick_interval_s: float = 0.1) -> None:
        def run() -> None:
            while not self._stop.wait(tick_interval_s):
                with self._tick_lock:
                    if self._stop.is_set():
                        return
                    try:
                        started = time.monotonic()
                        self.assembler.tick()
                        if self.intake_log is not None:
                            self.intake_log.ticked(started)
                        for flush in self.flushers:
                            flush(True)
                    except Exception:  # a bug in one trace must not stop every later decision
                        log.exception("trace completion failed")

        self._ticker = threading.Thread(target=run, name="otel-llm-assembler", daemon=True)
        self._ticker.start()
        self._worker = threading.Thread(target=self._work, name="otel-llm-pipeline", daemon=True)
        self._worker.start()
        self.memory_limiter.start()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Process everything accepted, then decide every pending trace and flush the batches."""
        if not self.intake.close_and_wait(timeout_s):
            log.error("pipeline did not finish its queue within %.0fs; %d spans unprocessed",
                      timeout_s, self.intake.queued_spans)
            self.telemetry.spans_dropped.labels("shutdown_timeout").inc(self.intake.queued_spans)
        self.memory_limiter.stop()
        # Under the tick lock no completion can run concurrently, so nothing reaches a batcher
        # after its final flush, however long a tick takes on a loaded machine.
        with self._tick_lock:
            self._stop.set()
            self.assembler.drain()
            for flush in self.flushers:
                flush(False)
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        if self._worker is not None:
            self._worker.join(timeout=5)
