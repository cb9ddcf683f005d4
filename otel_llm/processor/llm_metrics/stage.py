"""The ``llm_metrics`` stage of the completion chain: a trace's request records, recorded into both
namings' families once the trace's decision is known (exemplars link kept traces only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.internal import core as native_core
from otel_llm.pdata.observation import EngineKind
from otel_llm.pdata.records import RequestRecord, Side
from otel_llm.pdata.spans import BufferedSpan
from otel_llm.pdata.traces import CompletedTrace, TraceConsumer
from otel_llm.processor.llm_metrics.config import LlmMetricsProcessor, SloObjectivesConfig
from otel_llm.processor.llm_metrics.metrics.accounting import Accounting, AccountingSettings, Objectives, Price
from otel_llm.processor.llm_metrics.metrics.definitions import (
    adapter_naming,
    genai_client_naming,
    genai_naming,
    own_cache_naming,
    own_naming,
    vllm_cache_naming,
    vllm_naming,
)
from otel_llm.processor.llm_metrics.metrics.recorder import MetricsRecorder
from otel_llm.processor.llm_metrics.requests import (
    Dimension,
    RecordSettings,
    ResourceModelRule,
    TenantRule,
    native_record_builder,
    records_of_trace,
)
from otel_llm.receiver.otlp.intake_log import IntakeLogKeeper
from otel_llm.service.telemetry import SelfTelemetry, incrementer


def record_settings(metrics: LlmMetricsProcessor) -> RecordSettings:
    return RecordSettings(
        resource_model_rules=tuple(ResourceModelRule(r.attribute, dict(r.values)) for r in metrics.model_name.from_resource),
        default_model=metrics.model_name.default,
        model_from_service_name=metrics.model_name.from_service_name,
        default_operation=metrics.default_operation_name,
        edge_ttft_attributes=tuple(metrics.edge_time_to_first_token.attributes),
        dimensions=tuple(Dimension(d.name, d.attribute, frozenset(d.values), d.other) for d in metrics.dimensions),
        tenant=(TenantRule(tuple(metrics.tenant.attributes), frozenset(metrics.tenant.values), metrics.tenant.other)
                if metrics.tenant.attributes else None),
        max_latency_s=metrics.max_latency,
        lora_adapters=dict(metrics.lora_adapters),
    )


def recorder_of(metrics: LlmMetricsProcessor) -> MetricsRecorder:
    namings = []
    if metrics.namings.vllm:
        namings.append(vllm_naming(metrics.max_model_len, metrics.max_model_len_by_model))
        namings.append(vllm_cache_naming(metrics.max_model_len, metrics.max_model_len_by_model))
    if metrics.namings.gen_ai:
        namings.append(genai_naming(metrics.namings.gen_ai_version))
        namings.append(genai_client_naming(metrics.namings.gen_ai_version))
    namings.append(own_naming())
    namings.append(own_cache_naming())
    if metrics.lora_adapters:
        namings.append(adapter_naming())
    recorder = MetricsRecorder(namings, tuple(d.name for d in metrics.dimensions), metrics.series_limit,
                               series_limit_bytes=metrics.series_limit_mib * 1024 * 1024,
                               max_label_value_bytes=metrics.max_label_value_bytes)
    settings = accounting_settings(metrics)
    if settings.tokens or settings.default_objectives is not None or settings.objectives_by_model:
        recorder.accounting = Accounting(settings, metrics.series_limit, recorder.budget,
                                         metrics.max_label_value_bytes)
    return recorder


def _objectives(config: SloObjectivesConfig) -> Objectives:
    return Objectives(config.ttft, config.tpot, config.e2e, config.target)


def accounting_settings(metrics: LlmMetricsProcessor) -> AccountingSettings:
    slo = metrics.slo
    default = _objectives(slo.default)
    return AccountingSettings(
        tokens=bool(metrics.tenant.attributes or metrics.cost.prices),
        currency=metrics.cost.currency if metrics.cost.prices else "",
        prices={model: Price(p.input, p.output, p.cached_input) for model, p in metrics.cost.prices.items()},
        default_objectives=default if default.any else None,
        objectives_by_model={model: _objectives(slo.objectives_for(model)) for model in slo.models},
    )


def _is_client_call(span: BufferedSpan) -> bool:
    observation = span.observation
    return (observation is not None and observation.engine_kind == EngineKind.GENAI
            and span.kind != Span.SPAN_KIND_SERVER)


# A trace whose record the core's build_many did not try (a late span, the Python path).
_NOT_BUILT: Any = object()


class LlmMetricsStage:
    def __init__(self, config: LlmMetricsProcessor, telemetry: SelfTelemetry, next: TraceConsumer,  # noqa: A002
                 intake_log: IntakeLogKeeper | None = None) -> None:
        self.settings = record_settings(config)
        self.native_records = native_record_builder(self.settings, native_core.active()[0])
        self.recorder = recorder_of(config)
        self._next = next
        self._telemetry = telemetry
        self.intake_log = intake_log
        # Labelled children looked up once: per-record telemetry must cost well under a microsecond.
        self._rejected: dict[str, Callable[[float], None]] = {}
        self._assembled: dict[tuple[str, str], Callable[[float], None]] = {}

    def consume_batch(self, batch: list[CompletedTrace]) -> None:
        # Per trace: the records to measure and the (reason, service) of requests whose spans could
        # not make one (counted with the measurement, for otel_llm_spans_malformed_total).
        measured: list[tuple[CompletedTrace, list[RequestRecord], list[tuple[str, str]]]] = []
        native = self.native_records
        # With the core, the records of the batch's traces (late spans aside) are built in one call:
        # a call per trace cost more in its frames than the core took to read most traces.
        built: list[Any] = native.build_many([c.trace.spans for c in batch if c.error is None and not c.late]) \
            if native is not None else []
        position = 0
        for completed in batch:
            if completed.error is not None:
                continue
            prebuilt: Any = _NOT_BUILT
            if native is not None and not completed.late:
                prebuilt = built[position]
                position += 1
            try:
                measured.append(self._records(completed, prebuilt))
            except Exception as exc:  # noqa: BLE001 - this trace's, set on it for the chain's entry
                completed.error = exc
        try:
            self._next.consume_batch(batch)
        finally:  # a stage or an exporter that fails downstream loses its kept trace, not the metrics
            recording: list[tuple[RequestRecord, bool]] = []
            for completed, to_record, malformed in measured:
                for reason, service in malformed:
                    self._telemetry.spans_malformed.labels(reason).inc()
                    self._telemetry.count_unmeasured(service, reason)
                # Metrics count every request whatever the decision; only exemplars follow it.
                kept = completed.decision is not None and completed.decision.keep
                for record in to_record:
                    recording.append((record, kept))
            self.count_measured(recording)
            if recording:
                self.recorder.record_many(recording)

    def _records(self, completed: CompletedTrace, prebuilt: Any = _NOT_BUILT) -> tuple[
            CompletedTrace, list[RequestRecord], list[tuple[str, str]]]:
        """Sets ``completed.records``; returns what of them to measure, and the malformed requests
        to count (none where nothing is measured). ``prebuilt``: what the core's ``build_many``
        made of the trace (its record, ``None`` where it declined, or what it raised), or
        ``_NOT_BUILT``."""
        prior = completed.prior
        malformed: list[tuple[str, str]] = []
        if completed.late:
            (span,) = completed.trace.spans.values()
            # A late engine span is measured alone; so is a late GenAI client span (a call that
            # outlived its trace's wait), on the client side only: its engine was measured before.
            client = not span.is_engine and _is_client_call(span)
            records = (records_of_trace(completed.trace, self.settings, malformed, self.native_records)
                       if span.is_engine or client else [])
            if client:
                records = [r for r in records if r.side == Side.CLIENT]
            measure = (span.is_engine or bool(records)) and not (prior is not None and span.span_id in prior.measured)
            if measure:
                # Before the decision is journaled, so a replay after a crash does not measure it again.
                if prior is not None:
                    prior.add_measured(span.span_id)
                elif self.intake_log is not None:
                    self.intake_log.measured_late(span.trace_id, span.span_id)
            completed.records = records
            return completed, records if measure else [], malformed if measure else []
        if prebuilt is _NOT_BUILT:
            records = records_of_trace(completed.trace, self.settings, malformed, self.native_records)
        elif prebuilt is None:  # declined by the core: Python's reading
            records = records_of_trace(completed.trace, self.settings, malformed)
        elif isinstance(prebuilt, BaseException):
            raise prebuilt
        else:
            records = [prebuilt]
        completed.records = records
        if prior is None:
            return completed, records, malformed
        return completed, [r for r in records if r.span_id not in prior.measured], []

    def count_lane(self, assembled: list[tuple[tuple[str, str], int]], refused: list[RequestRecord]) -> None:
        """``count_measured`` of records the completion lane recorded (``service/lane.py``): their
        count by (engine kind, outcome) and those with values refused or intervals not measurable."""
        for record in refused:
            self._count_refused(record)
        for key, requests in assembled:
            self._count_assembled(key, requests)

    def count_measured(self, recording: list[tuple[RequestRecord, bool]]) -> None:
        """The self-telemetry of records about to be measured: values refused, intervals not
        measurable, and requests assembled, counted once per (engine kind, outcome)."""
        assembled: dict[tuple[str, str], int] = {}
        for record, _ in recording:
            if record.rejected or record.not_measurable:
                self._count_refused(record)
            key = (record.engine_kind, record.outcome)
            assembled[key] = assembled.get(key, 0) + 1
        for key, count in assembled.items():
            self._count_assembled(key, count)

    def _count_refused(self, record: RequestRecord) -> None:
        """A measured record's values refused and intervals not measurable (self-telemetry)."""
        if record.rejected:
            for reason in record.rejected:
                rejected = self._rejected.get(reason)
                if rejected is None:
                    rejected = self._rejected[reason] = incrementer(self._telemetry.values_rejected.labels(reason))
                rejected(1)
        if record.not_measurable:
            for interval in record.not_measurable:
                self._telemetry.count_unmeasured(record.service_name, "not_measurable_" + interval)

    def _count_assembled(self, key: tuple[str, str], requests: int) -> None:
        """``requests`` measured records of (engine kind, outcome), on otel_llm_requests_assembled_total."""
        assembled = self._assembled.get(key)
        if assembled is None:
            assembled = self._assembled[key] = incrementer(self._telemetry.requests_assembled.labels(*key))
        assembled(requests)
