"""The product's own counters (prefix ``otel_llm_``): every refusal, malformed span and drop is visible."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.values import MutexValue

from otel_llm.internal import core as native_core
from otel_llm.internal.telemetry import TelemetryFamily
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


# The receiver process's counters (shared memory, collected by ReceiverCountersCollector).
RECEIVER_ACCEPTED_SPANS = TelemetryFamily(
    "otel_llm_receiver_accepted_spans", "counter", "Spans accepted by a receiver.", ("protocol",),
    "receivers.otlp")
RECEIVER_REFUSED_SPANS = TelemetryFamily(
    "otel_llm_receiver_refused_spans", "counter",
    "Spans refused by a receiver, by reason (whole requests count all their spans when known).",
    ("protocol", "reason"), "receivers.otlp", "Reasons: [Troubleshooting](../troubleshooting.md#receiver-refused).")
RECEIVER_REFUSED_REQUESTS = TelemetryFamily(
    "otel_llm_receiver_refused_requests", "counter", "Export requests refused as a whole, by reason.",
    ("protocol", "reason"), "receivers.otlp", "Reasons: [Troubleshooting](../troubleshooting.md#receiver-refused).")
RECEIVER_IGNORED_ITEMS = TelemetryFamily(
    "otel_llm_receiver_ignored_items", "counter",
    "OTLP metric data points and log records received and dropped (otel-llm keeps traces only; nothing of them "
    "is stored).", ("protocol", "signal"), "receivers.otlp",
    "`signal`: `metrics`, `logs`. Their requests (`/v1/metrics`, `/v1/logs`, the gRPC services) are answered "
    "with success, so a sender that exports every signal to one endpoint loses no traces.")
RECEIVER_CUT_VALUES = TelemetryFamily(
    "otel_llm_receiver_cut_values", "counter",
    "Attribute values nested deeper than 16 levels, replaced by a marker (the rest of the request admitted).",
    ("protocol",), "receivers.otlp")

SPANS_MALFORMED = TelemetryFamily(
    "otel_llm_spans_malformed", "counter", "Engine spans whose values were unusable; passed through, not measured.",
    ("reason",), notes="Reasons: [Troubleshooting](../troubleshooting.md#spans-malformed).")
SPANS_PASSED_THROUGH = TelemetryFamily(
    "otel_llm_spans_passed_through", "counter", "Spans that matched no engine adapter (kept with their trace).")
SPANS_MATCHED = TelemetryFamily(
    "otel_llm_spans_matched", "counter", "Spans matched by an engine adapter.", ("adapter",),
    notes="`adapter`: the request spans `vllm_v1`, `vllm_v0`, `sglang`, `tgi`, `genai`, `triton`, `trtllm`, "
          "`dynamo`, `llm-d`; the parts read from their request's root: `sglang_stage`, `triton_model`, "
          "`triton_compute`, `dynamo_worker`, `llm-d_proxy`, `llm-d_orchestration`.")
LATE_SPANS = TelemetryFamily("otel_llm_late_spans", "counter", "Spans that arrived after their trace was completed.",
                    notes="[Troubleshooting](../troubleshooting.md#late-spans).")
SPANS_DROPPED = TelemetryFamily(
    "otel_llm_spans_dropped", "counter", "Spans dropped after acceptance, by reason.", ("reason",),
    notes="Reasons: [Troubleshooting](../troubleshooting.md#spans-dropped).")
REQUESTS_ASSEMBLED = TelemetryFamily(
    "otel_llm_requests_assembled", "counter", "Request records assembled, by engine and outcome.",
    ("engine_kind", "outcome"), notes="`engine_kind=\"client\"` for client-side records.")
TRACES_COMPLETED = TelemetryFamily(
    "otel_llm_traces_completed", "counter", "Traces completed, by what completed them.", ("reason",))
CORE_INFO = TelemetryFamily(
    "otel_llm_core_info", "gauge", "Which implementation runs the per-span hot path: 1 for native (the compiled "
    "core, otel_llm._core) or python (the reference; OTEL_LLM_CORE=python, or no Rust at install).",
    ("implementation",), notes="One log line at start-up says which and why.")
TRACES_IN_MEMORY = TelemetryFamily("otel_llm_traces_in_memory", "gauge", "Traces buffered awaiting assembly and decision.")
TRACES_HELD_OPEN_CALLS = TelemetryFamily(
    "otel_llm_traces_held_open_calls", "gauge", "Traces held past decision_wait because a CLIENT span's parent "
    "(its caller, a call still in flight) has not arrived (tail_sampling.max_open_call_wait).")
SAMPLING_DECISIONS = TelemetryFamily(
    "otel_llm_sampling_decisions", "counter", "Tail-sampling decisions, by the first matching policy and outcome.",
    ("policy", "decision"))
KEPT_TRACES_DROPPED = TelemetryFamily(
    "otel_llm_kept_traces_dropped", "counter", "Kept traces a destination could not take (see its own counters).",
    ("sink",))
INTAKE_QUEUED_SPANS = TelemetryFamily(
    "otel_llm_intake_queued_spans", "gauge", "Spans accepted by a receiver and not yet processed.")
ATTRIBUTES_REDACTED = TelemetryFamily(
    "otel_llm_attributes_redacted", "counter", "Span, event and link attributes removed or reduced as possible "
    "content, by rule (not_allowed, url_reduced, content_key, free_text, content_event).", ("reason",))
VALUES_REJECTED = TelemetryFamily(
    "otel_llm_values_rejected", "counter", "Durations read at assembly (span times, edge TTFT, client and gateway "
    "overheads) that failed validation; the request is counted without them.", ("reason",),
    notes="Reasons: [Troubleshooting](../troubleshooting.md#values-rejected).")
SPANS_DUPLICATE = TelemetryFamily(
    "otel_llm_spans_duplicate", "counter",
    "Spans received again with a trace and span id already taken (a retried export): counted once, measured once.",
    notes="The decision cache is kept across a graceful restart beside the store.")
SPANS_TAKEN_OVER = TelemetryFamily(
    "otel_llm_spans_taken_over", "counter", "Spans of traces a gracefully stopped predecessor handed over undecided "
    "(service.hand_over_pending_traces), buffered again at start.")
HANDOVER_DAMAGED_RECORDS = TelemetryFamily(
    "otel_llm_handover_damaged_records", "counter", "Damaged records found in a predecessor's handover at start: "
    "the traces from the damage to the end of the file are lost (the log says which file).")
SPANS_TRUNCATED = TelemetryFamily(
    "otel_llm_spans_truncated", "counter", "Spans whose attributes were cut to the configured limits.")
SERVICE_UNMEASURED = TelemetryFamily(
    "otel_llm_service_unmeasured", "counter", "By service: engine spans refused as malformed (reason: why) and "
    "requests with a derived interval not measurable (reason: not_measurable_<interval>).",
    ("service_name", "reason"),
    notes=f"At most {MAX_UNMEASURED_SERVICES} services, the rest as `service_name=\"{OTHER_SERVICES}\"`. Reasons: "
          "[Troubleshooting](../troubleshooting.md#not-measurable).")


class ReceiverCountersCollector(Collector):
    """The receiver process's counters (shared memory), as ordinary counter families. Refusal series
    appear once non-zero, as labelled ``Counter`` children appear once used."""

    def __init__(self, counters: ReceiverCounters) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        accepted, spans, requests = self._counters.snapshot()
        family = RECEIVER_ACCEPTED_SPANS.collected()
        for protocol, value in accepted.items():
            family.add_metric([protocol], value)
        yield family
        for declared, values in ((RECEIVER_REFUSED_SPANS, spans), (RECEIVER_REFUSED_REQUESTS, requests)):
            family = declared.collected()
            for labels, value in values.items():
                if value:
                    family.add_metric(list(labels), value)
            yield family
        family = RECEIVER_IGNORED_ITEMS.collected()
        for labels, value in self._counters.ignored_snapshot().items():
            family.add_metric(list(labels), value)
        yield family
        family = RECEIVER_CUT_VALUES.collected()
        for protocol, value in self._counters.cut_snapshot().items():
            family.add_metric([protocol], value)
        yield family


class SelfTelemetry:
    def __init__(self, registry: CollectorRegistry, receivers: ReceiverCounters) -> None:
        registry.register(ReceiverCountersCollector(receivers))
        self.spans_malformed = SPANS_MALFORMED.counter(registry)
        self.spans_passed_through = SPANS_PASSED_THROUGH.counter(registry)
        self.spans_engine = SPANS_MATCHED.counter(registry)
        self.late_spans = LATE_SPANS.counter(registry)
        self.spans_dropped = SPANS_DROPPED.counter(registry)
        self.requests_assembled = REQUESTS_ASSEMBLED.counter(registry)
        self.traces_completed = TRACES_COMPLETED.counter(registry)
        self.core_info = CORE_INFO.gauge(registry)
        self.traces_in_memory = TRACES_IN_MEMORY.gauge(registry)
        self.traces_held_open_calls = TRACES_HELD_OPEN_CALLS.gauge(registry)
        self.sampling_decisions = SAMPLING_DECISIONS.counter(registry)
        self.kept_traces_dropped = KEPT_TRACES_DROPPED.counter(registry)
        self.intake_queued_spans = INTAKE_QUEUED_SPANS.gauge(registry)
        self.attributes_redacted = ATTRIBUTES_REDACTED.counter(registry)
        self.values_rejected = VALUES_REJECTED.counter(registry)
        self.spans_duplicate = SPANS_DUPLICATE.counter(registry)
        self.spans_taken_over = SPANS_TAKEN_OVER.counter(registry)
        self.handover_damaged = HANDOVER_DAMAGED_RECORDS.counter(registry)
        self.spans_truncated = SPANS_TRUNCATED.counter(registry)
        # What could not be measured, per service, next to the requests it counted (the web view's
        # cards and `otel-llm summary` show it). Service names come from spans: bounded in number and length.
        self.service_unmeasured = SERVICE_UNMEASURED.counter(registry)
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
