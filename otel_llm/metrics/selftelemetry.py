"""The product's own counters (prefix ``otel_llm_``): every refusal, malformed span and drop is visible."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class SelfTelemetry:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.spans_received = Counter(
            "otel_llm_receiver_accepted_spans", "Spans accepted by a receiver.", ["protocol"], registry=registry)
        self.spans_refused = Counter(
            "otel_llm_receiver_refused_spans",
            "Spans refused by a receiver, by reason (whole requests count all their spans when known).",
            ["protocol", "reason"], registry=registry)
        self.requests_refused = Counter(
            "otel_llm_receiver_refused_requests", "Export requests refused as a whole, by reason.",
            ["protocol", "reason"], registry=registry)
        self.spans_malformed = Counter(
            "otel_llm_spans_malformed", "Engine spans whose values were unusable; passed through, not measured.",
            ["reason"], registry=registry)
        self.spans_passed_through = Counter(
            "otel_llm_spans_passed_through", "Spans that matched no engine adapter (kept with their trace).",
            registry=registry)
        self.spans_engine = Counter(
            "otel_llm_spans_matched", "Spans matched by an engine adapter.", ["adapter"], registry=registry)
        self.late_spans = Counter(
            "otel_llm_late_spans", "Spans that arrived after their trace was completed.", registry=registry)
        self.spans_dropped = Counter(
            "otel_llm_spans_dropped", "Spans dropped after acceptance, by reason.", ["reason"], registry=registry)
        self.requests_assembled = Counter(
            "otel_llm_requests_assembled", "Request records assembled, by engine and outcome.",
            ["engine_kind", "outcome"], registry=registry)
        self.traces_completed = Counter(
            "otel_llm_traces_completed", "Traces completed, by what completed them.", ["reason"], registry=registry)
        self.traces_in_memory = Gauge(
            "otel_llm_traces_in_memory", "Traces buffered awaiting assembly and decision.", registry=registry)
        self.sampling_decisions = Counter(
            "otel_llm_sampling_decisions", "Tail-sampling decisions, by the first matching policy and outcome.",
            ["policy", "decision"], registry=registry)
        self.kept_traces_dropped = Counter(
            "otel_llm_kept_traces_dropped", "Kept traces a destination could not take (see its own counters).",
            ["sink"], registry=registry)
        self.intake_queued_spans = Gauge(
            "otel_llm_intake_queued_spans", "Spans accepted by a receiver and not yet processed.", registry=registry)
        self.spans_truncated = Counter(
            "otel_llm_spans_truncated", "Spans whose attributes were cut to the configured limits.", registry=registry)
