"""What flows along the completion chain, in batches of traces: the tail sampler's buffer completes
the traces that are due; ``llm_metrics`` adds their request records; ``tail_sampling`` their
decisions; ``redaction`` turns the kept ones into ``KeptTrace``s for the exporters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from otel_llm.pdata.records import RequestRecord
from otel_llm.pdata.spans import BufferedSpan, PendingTrace


@dataclass(slots=True, frozen=True)
class Decision:
    keep: bool
    policy: str = ""  # the first policy that matched, stamped on kept spans
    threshold: str = ""  # OTel ``th`` of the probability the trace was kept with ("0" = always)
    rate_limited: bool = False


DROP = Decision(False)
KEEP_UNSAMPLED = Decision(True)  # no tail_sampling in the pipeline: every trace goes on, no policy named


@dataclass(slots=True)
class Remembered:
    """What the tail sampler's decision cache keeps of a completed trace: its decision, and which
    engine spans were measured, so a replayed span is not measured twice while a genuinely late one is."""

    decision: Decision
    # Nearly always one span id: a tuple then (48 B, where a set of one is 216 B, times the
    # decision cache's 100 000 entries); a set once a late span is measured too.
    measured: tuple[bytes, ...] | set[bytes]
    # Spans its trace was completed with plus late spans taken since (set by the buffer's decision
    # cache): ``max_spans_per_trace`` holds for late spans too.
    taken: int = 0

    def add_measured(self, span_id: bytes) -> None:
        if isinstance(self.measured, set):
            self.measured.add(span_id)
        else:
            self.measured = {*self.measured, span_id}


@dataclass(slots=True)
class CompletedTrace:
    """One completed trace (or one late span of a decided trace) on its way along the chain.

    ``prior``: the trace was decided before, by this run (a late span) or by the run before a crash
    (the intake log's journal); the same decision applies and nothing measured then is measured again."""

    trace: PendingTrace
    reason: str  # why it completed: ready, decision_wait, memory_limit, memory_pressure, shutdown, late
    prior: Remembered | None = None
    late: bool = False
    records: list[RequestRecord] = field(default_factory=list)
    decision: Decision | None = None
    # What failed for this trace in a stage: the later stages pass it by, and the chain's entry logs
    # and counts it, so one trace that fails costs its batch nothing else.
    error: Exception | None = None

    @property
    def trace_id(self) -> bytes:
        return self.trace.trace_id

    @property
    def spans(self) -> list[BufferedSpan]:
        return list(self.trace.spans.values())


class TraceConsumer(Protocol):
    """A stage of the completion chain. It takes the traces one tick completed together (the
    locks, lookups and calls a stage needs are paid per batch, not per trace), in order; a
    trace's own failure is set on its ``error`` and never raised, and a trace with one set is
    passed by."""

    def consume_batch(self, batch: list[CompletedTrace]) -> None: ...
