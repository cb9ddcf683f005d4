"""What flows along the completion chain, one trace at a time: the tail sampler's buffer completes a
trace; ``llm_metrics`` adds its request records; ``tail_sampling`` adds its decision; ``redaction``
turns a kept one into a ``KeptTrace`` for the exporters."""

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
    measured: set[bytes]


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

    @property
    def trace_id(self) -> bytes:
        return self.trace.trace_id

    @property
    def spans(self) -> list[BufferedSpan]:
        return list(self.trace.spans.values())


class TraceConsumer(Protocol):
    """A stage of the completion chain."""

    def consume(self, completed: CompletedTrace) -> None: ...
