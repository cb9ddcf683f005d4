"""The trace pipeline: decoded OTLP requests in, request records out to metrics.

Receivers call ``consume`` from their threads. Per span it does the least Python work that the
metrics need: one attribute map, one adapter, validation; everything else stays protobuf.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_llm.adapters import MalformedSpan, classify
from otel_llm.assembly.records import RequestRecord
from otel_llm.assembly.requests import Dimension, RecordSettings, ResourceModelRule, records_of_trace
from otel_llm.assembly.segments import derive_timings
from otel_llm.assembly.synthesis import kept_trace_request
from otel_llm.assembly.traces import AssemblySettings, BufferedSpan, PendingTrace, TraceAssembler
from otel_llm.config import Config
from otel_llm.metrics.definitions import genai_naming, own_naming, vllm_naming
from otel_llm.metrics.recorder import MetricsRecorder
from otel_llm.metrics.selftelemetry import SelfTelemetry
from otel_llm.sampling.sampler import Decision, TailSampler

# A destination for kept traces (the store, an OTLP exporter); returns False when it had to drop it.
KeptTraceSink = Callable[[ExportTraceServiceRequest, list[RequestRecord], str], bool]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Remembered:
    """What the decision cache keeps of a completed trace: its decision, and which engine spans
    were measured, so a replayed span is not measured twice while a genuinely late one is."""

    decision: Decision
    measured: set[bytes]


@dataclass(slots=True, frozen=True)
class ConsumeResult:
    accepted: int
    rejected: int
    error_message: str = ""


def _service_name(resource: Resource) -> str:
    for kv in resource.attributes:
        if kv.key == "service.name":
            return kv.value.string_value or "unknown_service"
    return "unknown_service"


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
    def __init__(self, config: Config, telemetry: SelfTelemetry) -> None:
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
        self.sinks: dict[str, KeptTraceSink] = {}
        self._malformed = telemetry.spans_malformed
        self._matched = telemetry.spans_engine
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    # --- intake ----------------------------------------------------------------------------

    def consume(self, request: ExportTraceServiceRequest, protocol: str) -> ConsumeResult:
        buffered: list[BufferedSpan] = []
        rejected = 0
        passed_through = 0
        first_error = ""
        max_latency = self.max_latency_s
        for resource_spans in request.resource_spans:
            resource = resource_spans.resource
            service_name = _service_name(resource)
            for scope_spans in resource_spans.scope_spans:
                scope = scope_spans.scope
                for span in scope_spans.spans:
                    if len(span.trace_id) != 16 or len(span.span_id) != 8 or not any(span.trace_id) or not any(span.span_id):
                        rejected += 1
                        first_error = first_error or "invalid trace_id or span_id (need 16 and 8 non-zero bytes)"
                        continue
                    if span.parent_span_id and len(span.parent_span_id) != 8:
                        rejected += 1
                        first_error = first_error or "invalid parent_span_id (need 8 bytes)"
                        continue
                    try:
                        observation, attrs = classify(span)
                        timings = derive_timings(observation, max_latency) if observation is not None else None
                    except MalformedSpan as exc:
                        self._malformed.labels(exc.reason).inc()
                        observation, timings, attrs = None, None, {}
                        passed_through += 1
                    else:
                        if observation is None:
                            passed_through += 1
                        else:
                            self._matched.labels(observation.adapter).inc()
                    buffered.append(BufferedSpan(span, resource, scope, service_name, attrs, observation, timings))
        accepted = len(buffered)
        self.telemetry.spans_received.labels(protocol).inc(accepted)
        if rejected:
            self.telemetry.spans_refused.labels(protocol, "invalid_id").inc(rejected)
        if passed_through:
            self.telemetry.spans_passed_through.inc(passed_through)
        if buffered:
            self.assembler.add_batch(buffered)
        return ConsumeResult(accepted, rejected, f"{rejected} spans rejected: {first_error}" if rejected else "")

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
            request, _ = kept_trace_request(list(trace.spans.values()), records, decision.policy, decision.threshold)
            self._deliver(request, records, decision.policy)

    def _count_decision(self, decision: Decision) -> None:
        outcome = "kept" if decision.keep else ("rate_limited" if decision.rate_limited else "dropped")
        self.telemetry.sampling_decisions.labels(decision.policy or "none", outcome).inc()

    def _deliver(self, request: ExportTraceServiceRequest, records: list[RequestRecord], policy: str) -> None:
        for name, sink in self.sinks.items():
            if not sink(request, records, policy):
                self.telemetry.kept_traces_dropped.labels(name).inc()

    def _on_late_span(self, buffered: BufferedSpan, remembered: object) -> None:
        """A span of an already decided trace: it follows the decision, and is measured once at most."""
        self.telemetry.late_spans.inc()
        if not isinstance(remembered, Remembered):  # the trace is being completed right now
            remembered = None
        kept = remembered is not None and remembered.decision.keep
        records: list[RequestRecord] = []
        if buffered.is_engine:
            single = PendingTrace(buffered.span.trace_id, 0.0, {buffered.span.span_id: buffered})
            records = records_of_trace(single, self.settings)
            replayed = remembered is not None and buffered.span.span_id in remembered.measured
            if not replayed:
                for record in records:
                    self._record(record, kept)
                if remembered is not None:
                    remembered.measured.add(buffered.span.span_id)
        if kept:
            assert remembered is not None
            decision = remembered.decision
            request, _ = kept_trace_request([buffered], records, decision.policy, decision.threshold)
            self._deliver(request, records, decision.policy)

    def _record(self, record: RequestRecord, with_exemplars: bool = False) -> None:
        self.telemetry.requests_assembled.labels(record.engine_kind.value, record.outcome.value).inc()
        self.recorder.record(record, with_exemplars)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, tick_interval_s: float = 0.1) -> None:
        def run() -> None:
            while not self._stop.wait(tick_interval_s):
                try:
                    self.assembler.tick()
                except Exception:  # a bug in one trace must not stop every later decision
                    log.exception("trace completion failed")

        self._ticker = threading.Thread(target=run, name="otel-llm-assembler", daemon=True)
        self._ticker.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
        self.assembler.drain()
