"""The ``tail_sampling`` decision stage: the first matching policy keeps a trace; the decision is
remembered in the buffer's decision cache (late spans follow it) and journaled by the intake log."""

from __future__ import annotations

from collections.abc import Callable

from otel_llm.pdata.traces import DROP, KEEP_UNSAMPLED, CompletedTrace, Decision, Remembered, TraceConsumer
from otel_llm.processor.tail_sampling.assembler import TraceAssembler
from otel_llm.processor.tail_sampling.sampler import TailSampler
from otel_llm.receiver.otlp.intake_log import IntakeLogKeeper
from otel_llm.service.telemetry import SelfTelemetry, incrementer


class DecisionStage:
    """``sampler`` None: tail_sampling is not in the pipeline, and every trace goes on (no policy named)."""

    def __init__(self, sampler: TailSampler | None, assembler: TraceAssembler, telemetry: SelfTelemetry,
                 next: TraceConsumer, intake_log: IntakeLogKeeper | None = None) -> None:  # noqa: A002
        self._sampler = sampler
        self._assembler = assembler
        self._telemetry = telemetry
        self._next = next
        self.intake_log = intake_log
        self._counters: dict[tuple[str, bool, bool], Callable[[float], None]] = {}

    def consume(self, completed: CompletedTrace) -> None:
        prior = completed.prior
        if completed.late:
            # A late span follows its trace's decision (one that came while its trace was being completed
            # waited for it in the buffer); without one (the cache forgot the trace) it is not kept.
            completed.decision = prior.decision if prior is not None else DROP
            if prior is not None and self.intake_log is not None:
                self._journal(completed.trace.trace_id, prior)
        else:
            records = completed.records
            if prior is not None:
                decision = prior.decision
            elif self._sampler is not None:
                decision = self._sampler.decide(completed.trace, records)
            else:
                decision = KEEP_UNSAMPLED
            # One record nearly always: a set display, not a comprehension's frame.
            measured = {records[0].span_id} if len(records) == 1 else {r.span_id for r in records}
            if prior is not None:
                measured |= prior.measured
            remembered = Remembered(decision, measured)
            trace_id = completed.trace.trace_id
            self._assembler.remember_decision(trace_id, remembered)
            if prior is None:
                count = self._counters.get((decision.policy, decision.keep, decision.rate_limited))
                if count is None:
                    count = self._counter(decision)
                count(1)
            if self.intake_log is not None:
                self._journal(trace_id, remembered)
            completed.decision = decision
        self._next.consume(completed)

    def _journal(self, trace_id: bytes, remembered: Remembered) -> None:
        assert self.intake_log is not None
        decision = remembered.decision
        self.intake_log.decided(trace_id, decision.keep, decision.rate_limited, decision.policy,
                                decision.threshold, remembered.measured)

    def _counter(self, decision: Decision) -> Callable[[float], None]:
        """The increment of ``decision``'s sampling_decisions child, looked up once per label set."""
        outcome = "kept" if decision.keep else ("rate_limited" if decision.rate_limited else "dropped")
        count = incrementer(self._telemetry.sampling_decisions.labels(decision.policy or "none", outcome))
        self._counters[(decision.policy, decision.keep, decision.rate_limited)] = count
        return count
