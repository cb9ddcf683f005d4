"""The ``redaction`` stage: a kept trace, its content removed and its segment spans synthesized,
handed to every kept-trace consumer (the exporters of the pipeline)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.component import KeptTraceConsumer
from otel_llm.internal import core as native_core
from otel_llm.pdata.records import KeptTrace, RequestRecord, Side
from otel_llm.pdata.traces import CompletedTrace, Decision
from otel_llm.processor.redaction.config import METADATA_KEYS, URL_KEYS, RedactionProcessor
from otel_llm.processor.redaction.synthesis import (
    NO_REDACTION, REDACTION_REASONS, Redaction, RedactionCounts, kept_trace, native_kept_trace_writer)
from otel_llm.service.telemetry import SelfTelemetry


def redaction_of(config: RedactionProcessor) -> Redaction:
    if config.allow_content:
        return NO_REDACTION
    extra_globs = [k for k in config.additional_blocked_keys if "*" in k]
    extra_prefixes = [k for k in config.additional_blocked_keys if "*" not in k]
    return Redaction(
        key_prefixes=tuple(config.blocked_key_prefixes + extra_prefixes),
        key_patterns=tuple(config.blocked_key_patterns + extra_globs),
        event_names=frozenset(config.blocked_event_names),
        max_free_text_bytes=config.max_free_text_bytes,
        allowed_keys=frozenset(k for k in config.allowed_keys if "*" not in k),
        allowed_patterns=tuple(k for k in config.allowed_keys if "*" in k),
        metadata_keys=METADATA_KEYS,
        url_keys=URL_KEYS,
    )


def intake_redaction_of(config: RedactionProcessor, read_keys: Sequence[str]) -> Redaction | None:
    """The same rules for the intake log (``receivers.otlp.intake_log``), applied in the receiver
    process to every admitted request before it is written, so no content is ever on its disk; the
    keys the pipeline reads from spans and resources after intake (``read_keys``: dimensions, tenants,
    edge TTFT, ``model_name.from_resource``) are added to the allowlist. ``None`` with ``allow_content``."""
    redaction = redaction_of(config)
    if redaction is NO_REDACTION:
        return None
    extra = tuple(k for k in read_keys if k not in redaction.allowed_keys)
    return dataclasses.replace(redaction, allowed_keys=redaction.allowed_keys | frozenset(extra))


def one_per_request(records: list[RequestRecord]) -> list[RequestRecord]:
    """The records a store row is written for: a client record joined to a server record is the
    same request, described once (by the server record, which carries the client overhead)."""
    return [r for r in records if r.side == Side.SERVER or not r.joined_span_id]


class RedactionStage:
    def __init__(self, config: RedactionProcessor, telemetry: SelfTelemetry,
                 consumers: Sequence[KeptTraceConsumer]) -> None:
        self.redaction = redaction_of(config)
        self.native_writer = native_kept_trace_writer(self.redaction, native_core.active()[0])
        self._consumers = list(consumers)
        self._dropped = {c.name: telemetry.kept_traces_dropped.labels(c.name) for c in self._consumers}
        self._redacted: dict[str, Any] = {reason: telemetry.attributes_redacted.labels(reason)
                                          for reason in REDACTION_REASONS}

    def consume_batch(self, batch: list[CompletedTrace]) -> None:
        if not self._consumers:
            return
        for completed in batch:
            decision = completed.decision
            if completed.error is None and decision is not None and decision.keep:
                try:
                    self._hand_on(completed, decision)
                except Exception as exc:  # noqa: BLE001 - this trace's, set on it for the chain's entry
                    completed.error = exc

    def _hand_on(self, completed: CompletedTrace, decision: Decision) -> None:
        """A kept trace's spans, redacted, to every kept-trace consumer."""
        spans = completed.spans
        built = (self.native_writer.build(spans, completed.records, decision.policy, decision.threshold)
                 if self.native_writer is not None else None)
        request: ExportTraceServiceRequest | bytes
        counts: list[tuple[str, int]]
        if built is not None:  # the request's bytes and rows, written by the core
            request, count, span_rows, by_reason = built
            counts = list(zip(REDACTION_REASONS, by_reason))
        else:
            redacted = RedactionCounts()
            request, count, span_rows = kept_trace(spans, completed.records, decision.policy, decision.threshold,
                                                   self.redaction, redacted)
            counts = list(redacted.by_reason())
        for reason, removed in counts:
            if removed:
                self._redacted[reason].inc(removed)
        kept = KeptTrace(request, count, one_per_request(completed.records), decision.policy, span_rows)
        for consumer in self._consumers:
            if not consumer.consume(kept):
                self._dropped[consumer.name].inc()
