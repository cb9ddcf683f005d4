"""The trace pipeline: decoded OTLP requests in; request records, metrics and kept traces out.

Receivers call ``admit`` from their threads (id checks, then the bounded intake); one worker thread
runs ``consume``, which does the least Python work the metrics need per span (an adapter reading
only the keys it uses, validation) and buffers each span as bytes plus a few fields; a ticker
completes traces: records, metrics, the sampling decision, and delivery of kept traces.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.adapters import MalformedSpan, classify
from otel_llm.adapters.attributes import any_value_to_python
from otel_llm.assembly.records import RequestRecord
from otel_llm.assembly.requests import Dimension, RecordSettings, ResourceModelRule, records_of_trace
from otel_llm.assembly.segments import derive_timings
from otel_llm.assembly.synthesis import NO_REDACTION, Redaction, kept_trace_request
from otel_llm.assembly.traces import FIRST_TOKEN_EVENT, AssemblySettings, BufferedSpan, Origin, PendingTrace, \
    TraceAssembler
from otel_llm.config import Config
from otel_llm.memorylimiter import MemoryLimiter
from otel_llm.metrics.definitions import genai_naming, own_naming, vllm_naming
from otel_llm.metrics.recorder import MetricsRecorder
from otel_llm.metrics.selftelemetry import SelfTelemetry
from otel_llm.receivers.process import IntakeState
from otel_llm.sampling.sampler import Decision, TailSampler

# A destination for kept traces (the store, an OTLP exporter): the request, its span count, its
# request records and the policy that kept it; returns False when it had to drop it.
KeptTraceSink = Callable[[ExportTraceServiceRequest, int, list[RequestRecord], str], bool]

log = logging.getLogger(__name__)

_SERVER = Span.SPAN_KIND_SERVER


@dataclass(slots=True)
class Remembered:
    """What the decision cache keeps of a completed trace: its decision, and which engine spans
    were measured, so a replayed span is not measured twice while a genuinely late one is."""

    decision: Decision
    measured: set[bytes]


@dataclass(slots=True, frozen=True)
class AttributeLimits:
    """Bounds on one span's attributes, so a hostile span cannot hold megabytes in the trace buffer."""

    max_attributes: int
    max_value_bytes: int

    def exceeded_by(self, span: Span, serialized_size: int) -> bool:
        # Only spans that can break a limit are inspected attribute by attribute.
        return serialized_size > self.max_value_bytes or len(span.attributes) > self.max_attributes

    def enforce(self, span: Span) -> bool:
        changed = False
        if len(span.attributes) > self.max_attributes:
            del span.attributes[self.max_attributes:]
            changed = True
        for kv in span.attributes:
            value = kv.value
            if value.WhichOneof("value") == "string_value" and len(value.string_value) > self.max_value_bytes:
                value.string_value = value.string_value[: self.max_value_bytes]
                changed = True
            elif value.WhichOneof("value") in ("bytes_value", "array_value", "kvlist_value") and \
                    value.ByteSize() > self.max_value_bytes:
                value.string_value = f"<{value.ByteSize()} bytes removed by otel-llm>"
                changed = True
        for event in span.events:
            if len(event.attributes) > self.max_attributes:
                del event.attributes[self.max_attributes:]
                changed = True
        return changed


class Intake:
    """The pipeline's end of the intake: requests the receiver process admitted, as bytes, until the
    worker has processed them. Its bound is enforced where requests are admitted (``IntakeState``):
    a full intake is a retryable refusal there, never unbounded memory or a silent drop here."""

    def __init__(self, state: IntakeState) -> None:
        self.state = state
        self._items: deque[tuple[bytes, int]] = deque()
        self._cond = threading.Condition()
        self.held_spans = 0  # arrived here and not yet processed
        self.held_bytes = 0

    @property
    def queued_spans(self) -> int:
        """Admitted and not yet processed, including what is still on its way from the receivers."""
        return self.state.queued_spans

    @property
    def closed(self) -> bool:
        return self.state.closed

    def put(self, payload: bytes, spans: int) -> None:
        with self._cond:
            self._items.append((payload, spans))
            self.held_spans += spans
            self.held_bytes += len(payload)
            self._cond.notify()

    def take(self, timeout_s: float) -> tuple[bytes, int] | None:
        with self._cond:
            if not self._items:
                self._cond.wait(timeout_s)
            if not self._items:
                return None
            return self._items.popleft()

    def done(self, payload: bytes, spans: int) -> None:
        self.state.release(spans, len(payload))
        with self._cond:
            self.held_spans -= spans
            self.held_bytes -= len(payload)
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


def record_settings(config: Config) -> RecordSettings:
    metrics = config.processors.llm_metrics
    return RecordSettings(
        resource_model_rules=tuple(ResourceModelRule(r.attribute, dict(r.values)) for r in metrics.model_name.from_resource),
        default_model=metrics.model_name.default,
        default_operation=metrics.default_operation_name,
        edge_ttft_attributes=tuple(metrics.edge_time_to_first_token.attributes),
        edge_ttft_events=tuple(metrics.edge_time_to_first_token.events),
        dimensions=tuple(Dimension(d.name, d.attribute, frozenset(d.values), d.other) for d in metrics.dimensions),
    )


class Pipeline:
    def __init__(self, config: Config, telemetry: SelfTelemetry, intake: IntakeState) -> None:
        metrics_config = config.processors.llm_metrics
        sampling = config.processors.tail_sampling
        namings = []
        if metrics_config.namings.vllm:
            namings.append(vllm_naming(metrics_config.max_model_len))
        if metrics_config.namings.gen_ai:
            namings.append(genai_naming())
        namings.append(own_naming())
        self.settings = record_settings(config)
        self.max_latency_s = metrics_config.max_latency
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
        )
        telemetry.traces_in_memory.set_function(lambda: len(self.assembler))
        self.sampler = TailSampler(sampling)
        redaction = config.processors.redaction
        self.redaction = NO_REDACTION if redaction.allow_content else Redaction(
            tuple(redaction.blocked_key_prefixes), frozenset(redaction.blocked_event_names))
        self.attribute_limits = AttributeLimits(redaction.max_attributes_per_span, redaction.max_attribute_value_bytes)
        # The attributes assembly reads at completion; buffered spans keep these and nothing else.
        self.kept_attribute_keys = tuple(dict.fromkeys((
            "gen_ai.request.model", "gen_ai.response.model", "http.route", "error.type",
            *self.settings.edge_ttft_attributes, *(d.attribute for d in self.settings.dimensions))))
        self.first_token_events = frozenset(self.settings.edge_ttft_events)
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
        self.memory_limiter = MemoryLimiter(config.processors.memory_limiter, shed=self.assembler.shed,
                                            on_change=intake.set_refusing)

    # --- intake ----------------------------------------------------------------------------

    def receive(self, payload: bytes, spans: int, protocol: str) -> None:
        """A request the receiver process admitted (ids checked, room reserved): queue it for the worker."""
        self.intake.put(payload, spans)
        self.memory_limiter.refuse_if_over(self.intake.state.queued_bytes)

    def _work(self) -> None:
        while True:
            item = self.intake.take(timeout_s=0.5)
            if item is None:
                if self._stop.is_set():
                    return
                continue
            payload, spans = item
            try:
                request = ExportTraceServiceRequest()
                request.ParseFromString(payload)  # decoded once already in the receiver process
                self.consume(request)
            except Exception:  # one bad batch must not stop the pipeline; it is counted
                log.exception("processing an export request failed")
                self.telemetry.spans_dropped.labels("processing_error").inc(spans)
            finally:
                self.intake.done(payload, spans)

    def consume(self, request: ExportTraceServiceRequest) -> None:
        """Adapters, validation, buffering: the pipeline worker's per-request work (ids already checked)."""
        buffered: list[BufferedSpan] = []
        passed_through = 0
        matched: dict[str, int] = {}  # counted per batch: a labelled counter per span costs ~2 µs
        malformed: dict[str, int] = {}
        max_latency = self.max_latency_s
        limits = self.attribute_limits
        truncated = 0
        kept_keys = self.kept_attribute_keys
        first_token_events = self.first_token_events
        for resource_spans in request.resource_spans:
            # Standalone copies, shared by this resource's spans, so buffered spans never pin the request.
            resource = Resource()
            resource.CopyFrom(resource_spans.resource)
            resource_strings = {kv.key: kv.value.string_value for kv in resource.attributes
                                if kv.value.HasField("string_value")}
            service_name = resource_strings.get("service.name") or "unknown_service"
            for scope_spans in resource_spans.scope_spans:
                scope = InstrumentationScope()
                scope.CopyFrom(scope_spans.scope)
                origin = Origin(resource, scope, service_name, resource_strings)
                for span in scope_spans.spans:
                    payload = span.SerializeToString()  # buffered as is; its size is the cheap limit check
                    if limits.exceeded_by(span, len(payload)) and limits.enforce(span):
                        truncated += 1
                        payload = span.SerializeToString()
                    try:
                        observation, attrs = classify(span)
                        if observation is not None:
                            derive_timings(observation, max_latency)
                    except MalformedSpan as exc:
                        malformed[exc.reason] = malformed.get(exc.reason, 0) + 1
                        observation, attrs = None, {}
                        passed_through += 1
                    else:
                        if observation is None:
                            passed_through += 1
                        else:
                            matched[observation.adapter] = matched.get(observation.adapter, 0) + 1
                    kind = span.kind
                    slim: tuple[Any, ...] = ()
                    if attrs:
                        slim = tuple(item for key in kept_keys if key in attrs
                                     for item in (key, any_value_to_python(attrs[key])))
                    if kind == _SERVER and span.events:
                        event_ns = next((e.time_unix_nano for e in span.events if e.name in first_token_events), 0)
                        if event_ns:
                            slim += (FIRST_TOKEN_EVENT, event_ns)
                    buffered.append(BufferedSpan(
                        span.trace_id, span.span_id, span.parent_span_id, kind, span.status.code,
                        span.start_time_unix_nano, span.end_time_unix_nano, span.trace_state, payload,
                        origin, slim, observation))
        if truncated:
            self.telemetry.spans_truncated.inc(truncated)
        if passed_through:
            self.telemetry.spans_passed_through.inc(passed_through)
        for adapter, count in matched.items():
            self._matched.labels(adapter).inc(count)
        for reason, count in malformed.items():
            self._malformed.labels(reason).inc(count)
        if buffered:
            self.assembler.add_batch(buffered)

    # --- completion ------------------------------------------------------------------------

    def _on_trace_complete(self, trace: PendingTrace, reason: str) -> None:
        self.telemetry.traces_completed.labels(reason).inc()
        try:
            records = records_of_trace(trace, self.settings)
            decision = self.sampler.decide(trace, records)
        except Exception:  # counted, and the next trace is still assembled
            log.exception("assembling trace %s failed", trace.trace_id.hex())
            self.telemetry.spans_dropped.labels("assembly_error").inc(len(trace.spans))
            return
        self.assembler.remember_decision(trace.trace_id, Remembered(decision, {r.span_id for r in records}))
        self._count_decision(decision)
        # Metrics count every request whatever the decision; only exemplars follow it.
        for record in records:
            self._record(record, decision.keep)
        if decision.keep:
            request, spans = kept_trace_request(list(trace.spans.values()), records, decision.policy,
                                                decision.threshold, self.redaction)
            self._deliver(request, spans, records, decision.policy)

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
            records = records_of_trace(single, self.settings)
            replayed = remembered is not None and buffered.span_id in remembered.measured
            if not replayed:
                for record in records:
                    self._record(record, kept)
                if remembered is not None:
                    remembered.measured.add(buffered.span_id)
        if kept:
            assert remembered is not None
            decision = remembered.decision
            request, spans = kept_trace_request([buffered], records, decision.policy, decision.threshold,
                                                self.redaction)
            self._deliver(request, spans, records, decision.policy)

    def _record(self, record: RequestRecord, with_exemplars: bool = False) -> None:
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
                        self.assembler.tick()
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
