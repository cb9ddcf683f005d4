"""The product's own counters (prefix ``otel_llm_``): every refusal, malformed span and drop is visible."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.values import MutexValue

from otel_llm.internal import core as native_core
from otel_llm.receiver.otlp.process import ReceiverCounters


# Distinct services in ``otel_llm_service_unmeasured_total`` before the rest share one label value.
MAX_UNMEASURED_SERVICES = 200
MAX_SERVICE_LABEL_CHARS = 128
OTHER_SERVICES = "_other"


# Held while a child's value is swapped for the core's, so two threads taking the same child's
# increment at once end with the same value object (and neither loses the other's counts).
_SWAP_LOCK = threading.Lock()


def incrementer(child: Any) -> Callable[[float], None]:
    """A counter child's increment for the per-trace chain, which runs several per trace.

    With the compiled core: the child's value becomes the core's ``CounterValue`` (``MutexValue``'s
    float, exemplar and methods, which the exposition reads as before) and its ``inc`` is returned,
    an addition the GIL keeps whole (~0.03 µs, against ~0.16 µs for the mutex's acquire and release
    in Python). Done only to a value of exactly prometheus_client's ``MutexValue``, under its lock,
    and only for children every increment of which goes through here (a thread that called the old
    value's ``inc`` meanwhile would count into it). Without the core: that value's own ``inc``,
    under its lock, without the checks ``Counter.inc`` repeats per call (a labelled child, a
    non-negative amount: true of every caller here), ~0.4 µs less each. Falls back to ``Counter.inc``
    where a prometheus_client release lays its values out otherwise."""
    value = getattr(child, "_value", None)
    extension = native_core.active()[0]
    if extension is not None and type(value) is MutexValue:
        with _SWAP_LOCK:
            value = child._value
            if type(value) is MutexValue:
                with value._lock:
                    value = child._value = extension.CounterValue(value._value, value._exemplar)
    value_inc = getattr(value, "inc", None)
    return value_inc if callable(value_inc) else child.inc  # type: ignore[no-any-return]


class ReceiverCountersCollector(Collector):
    """The receiver process's counters (shared memory), as ordinary counter families. Refusal series
    appear once non-zero, as labelled ``Counter`` children appear once used."""

    def __init__(self, counters: ReceiverCounters) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        accepted, spans, requests = self._counters.snapshot()
        family = CounterMetricFamily("otel_llm_receiver_accepted_spans", "Spans accepted by a receiver.",
                                     labels=["protocol"])
        for protocol, value in accepted.items():
            family.add_metric([protocol], value)
        yield family
        for name, help_text, values in (
                ("otel_llm_receiver_refused_spans",
                 "Spans refused by a receiver, by reason (whole requests count all their spans when known).", spans),
                ("otel_llm_receiver_refused_requests", "Export requests refused as a whole, by reason.", requests)):
            family = CounterMetricFamily(name, help_text, labels=["protocol", "reason"])
            for labels, value in values.items():
                if value:
                    family.add_metric(list(labels), value)
            yield family
        family = CounterMetricFamily("otel_llm_receiver_ignored_items",
                                     "OTLP metric data points and log records received and dropped (otel-llm keeps "
                                     "traces only; nothing of them is stored).", labels=["protocol", "signal"])
        for labels, value in self._counters.ignored_snapshot().items():
            family.add_metric(list(labels), value)
        yield family
        family = CounterMetricFamily("otel_llm_receiver_cut_values",
                                     "Attribute values nested deeper than 16 levels, replaced by a marker (the rest "
                                     "of the request admitted).", labels=["protocol"])
        for protocol, value in self._counters.cut_snapshot().items():
            family.add_metric([protocol], value)
        yield family


class SelfTelemetry:
    def __init__(self, registry: CollectorRegistry, receivers: ReceiverCounters) -> None:
        registry.register(ReceiverCountersCollector(receivers))
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
        self.core_info = Gauge(
            "otel_llm_core_info", "Which implementation runs the per-span hot path: 1 for native (the compiled "
            "core, otel_llm._core) or python (the reference; OTEL_LLM_CORE=python, or no Rust at install).",
            ["implementation"], registry=registry)
        self.traces_in_memory = Gauge(
            "otel_llm_traces_in_memory", "Traces buffered awaiting assembly and decision.", registry=registry)
        self.traces_held_open_calls = Gauge(
            "otel_llm_traces_held_open_calls", "Traces held past decision_wait because a CLIENT span's parent "
            "(its caller, a call still in flight) has not arrived (tail_sampling.max_open_call_wait).",
            registry=registry)
        self.sampling_decisions = Counter(
            "otel_llm_sampling_decisions", "Tail-sampling decisions, by the first matching policy and outcome.",
            ["policy", "decision"], registry=registry)
        self.kept_traces_dropped = Counter(
            "otel_llm_kept_traces_dropped", "Kept traces a destination could not take (see its own counters).",
            ["sink"], registry=registry)
        self.intake_queued_spans = Gauge(
            "otel_llm_intake_queued_spans", "Spans accepted by a receiver and not yet processed.", registry=registry)
        self.attributes_redacted = Counter(
            "otel_llm_attributes_redacted", "Span, event and link attributes removed or reduced as possible content, "
            "by rule (not_allowed, url_reduced, content_key, free_text, content_event).", ["reason"], registry=registry)
        self.values_rejected = Counter(
            "otel_llm_values_rejected", "Durations read at assembly (span times, edge TTFT, client and gateway "
            "overheads) that failed validation; the request is counted without them.", ["reason"], registry=registry)
        self.spans_duplicate = Counter(
            "otel_llm_spans_duplicate",
            "Spans received again with a trace and span id already taken (a retried export): counted once, measured once.",
            registry=registry)
        self.spans_taken_over = Counter(
            "otel_llm_spans_taken_over", "Spans of traces a gracefully stopped predecessor handed over undecided "
            "(service.hand_over_pending_traces), "
            "buffered again at start.", registry=registry)
        self.handover_damaged = Counter(
            "otel_llm_handover_damaged_records", "Damaged records found in a predecessor's handover at start: the "
            "traces from the damage to the end of the file are lost (the log says which file).", registry=registry)
        self.spans_truncated = Counter(
            "otel_llm_spans_truncated", "Spans whose attributes were cut to the configured limits.", registry=registry)
        # What could not be measured, per service, next to the requests it counted (the web view's
        # cards and `otel-llm summary` show it). Service names come from spans: bounded in number and length.
        self.service_unmeasured = Counter(
            "otel_llm_service_unmeasured", "By service: engine spans refused as malformed (reason: why) and "
            "requests with a derived interval not measurable (reason: not_measurable_<interval>).",
            ["service_name", "reason"], registry=registry)
        self._unmeasured: dict[tuple[str, str], Any] = {}  # (service, reason) -> child; a cache
        self._unmeasured_services: set[str] = set()  # label values admitted, at most MAX_UNMEASURED_SERVICES
        self._unmeasured_lock = threading.Lock()

    def count_unmeasured(self, service_name: str, reason: str, amount: int = 1) -> None:
        key = (service_name, reason)
        child = self._unmeasured.get(key)
        if child is None:
            with self._unmeasured_lock:
                label = service_name[:MAX_SERVICE_LABEL_CHARS]
                if label not in self._unmeasured_services:
                    if len(self._unmeasured_services) < MAX_UNMEASURED_SERVICES:
                        self._unmeasured_services.add(label)
                    else:
                        label = OTHER_SERVICES
                if len(self._unmeasured) >= 64 * MAX_UNMEASURED_SERVICES:
                    self._unmeasured.clear()  # hostile service names: the cache restarts, the counter keeps its children
                child = self._unmeasured[key] = self.service_unmeasured.labels(label, reason)
        child.inc(amount)
