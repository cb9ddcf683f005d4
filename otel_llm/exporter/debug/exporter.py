"""Logs kept traces. Every string from a span is written with ``repr``-style escaping, so a model
name carrying a newline or a terminal escape cannot forge log lines."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from prometheus_client import Counter

from otel_llm.component import Host
from otel_llm.exporter.debug.config import DebugExporter
from otel_llm.internal.telemetry import TelemetryFamily
from otel_llm.pdata.records import KeptTrace

log = logging.getLogger("otel_llm.exporter.debug")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}s"


DEBUG_EXPORTER_LOGGED_TRACES = TelemetryFamily(
    "otel_llm_debug_exporter_logged_traces", "counter",
    "Kept traces the debug exporter wrote to the log (after its sampling).", ("exporter",), "exporters.debug")


class DebugComponent:
    def __init__(self, name: str, config: DebugExporter, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.config = config
        self._clock = clock
        self._window = -1
        self._seen_in_window = 0
        self._logged: Counter | None = None

    def start(self, host: Host) -> None:
        self._logged = DEBUG_EXPORTER_LOGGED_TRACES.counter(host.registry)

    def consume(self, kept: KeptTrace) -> bool:
        window = int(self._clock())
        if window != self._window:
            self._window, self._seen_in_window = window, 0
        self._seen_in_window += 1
        beyond = self._seen_in_window - self.config.sampling_initial
        if beyond > 0 and beyond % self.config.sampling_thereafter:
            return True  # sampled out: consumed all the same
        log.info("kept trace %s: %d spans, %d requests, policy %r", kept.trace_id.hex(), kept.spans,
                 len(kept.records), kept.policy)
        if self.config.verbosity in ("normal", "detailed"):
            for record in kept.records:
                log.info("  request %s: side=%s engine=%s model=%r outcome=%s ttft=%s e2e=%s queue=%s tokens=%s/%s",
                         record.span_id.hex(), record.side, record.engine_kind, record.model, record.outcome,
                         _seconds(record.ttft_s), _seconds(record.e2e_s), _seconds(record.queue_s),
                         record.prompt_tokens, record.completion_tokens)
        if self.config.verbosity == "detailed":
            for resource_spans in kept.request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        log.info("  span %s %r: %.6fs", bytes(span.span_id).hex(), span.name,
                                 (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9)
        if self._logged is not None:
            self._logged.labels(self.name).inc()
        return True

    def flush(self, only_if_due: bool) -> None:
        """Nothing is batched."""

    def shutdown(self, grace_s: float) -> None:
        """Nothing to release."""
