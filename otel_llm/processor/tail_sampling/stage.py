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

    def consume_batch(self, batch: list[CompletedTrace]) -> None:
        undecided = [c for c in batch if c.error is None and not c.late and c.prior is None]
        if self._sampler is not None and undecided:
            decisions = self._sampler.decide_batch([(c.trace, c.records) for c in undecided])
            for completed, decided in zip(undecided, decisions):
                if isinstance(decided, Decision):
                    completed.decision = decided
                else:
                    completed.error = decided
        remembering: list[tuple[bytes, Remembered]] = []
        dropped = 0
        # Nearly every trace: decided just now, one record, nothing to journal. Its decision is
        # remembered here without ``_follow``'s call, checks and branches.
        plain = self._sampler is not None and self.intake_log is None
        for completed in batch:
            if completed.error is not None:
                continue
            records = completed.records
            decision = completed.decision
            if plain and len(records) == 1 and completed.prior is None and not completed.late and decision is not None:
                remembering.append((completed.trace.trace_id, Remembered(decision, (records[0].span_id,))))
                if decision is DROP:
                    dropped += 1
                else:
                    self._count(decision, 1)
                continue
            try:
                dropped += self._follow(completed, remembering)
            except Exception as exc:  # noqa: BLE001 - this trace's, set on it for the chain's entry
                completed.error = exc
        if dropped:
            self._count(DROP, dropped)
        if remembering:
            self._assembler.remember_decisions(remembering)
        self._next.consume_batch(batch)

    @property
    def sampler(self) -> TailSampler | None:
        return self._sampler

    def decided_in_lane(self, dropped: int, kept: list[Decision]) -> None:
        """What ``consume_batch`` counts of traces the completion lane decided (``service/lane.py``;
        the lane remembers their decisions in the buffer itself): the dropped and each kept one."""
        for decision in kept:
            self._count(decision, 1)
        if dropped:
            self._count(DROP, dropped)

    def _follow(self, completed: CompletedTrace, remembering: list[tuple[bytes, Remembered]]) -> int:
        """Set ``completed``'s decision; what to remember of it is appended to ``remembering``.
        Returns 1 for a new decision to drop (counted once per batch), else 0."""
        prior = completed.prior
        if completed.late:
            # A late span follows its trace's decision (one that came while its trace was being completed
            # waited for it in the buffer); without one (the cache forgot the trace) it is not kept.
            completed.decision = prior.decision if prior is not None else DROP
            if prior is not None and self.intake_log is not None:
                self._journal(completed.trace.trace_id, prior)
            return 0
        records = completed.records
        decision: Decision | None = prior.decision if prior is not None else (
            completed.decision if self._sampler is not None else KEEP_UNSAMPLED)
        assert decision is not None  # the sampler's, set in consume_batch
        measured: tuple[bytes, ...] | set[bytes]
        if prior is not None:
            measured = {r.span_id for r in records}
            measured.update(prior.measured)
        else:
            measured = (records[0].span_id,) if len(records) == 1 else tuple({r.span_id for r in records})
        remembered = Remembered(decision, measured)
        trace_id = completed.trace.trace_id
        remembering.append((trace_id, remembered))
        if self.intake_log is not None:
            self._journal(trace_id, remembered)
        completed.decision = decision
        if prior is not None:
            return 0
        if decision is DROP:
            return 1
        self._count(decision, 1)
        return 0

    def _journal(self, trace_id: bytes, remembered: Remembered) -> None:
        assert self.intake_log is not None
        decision = remembered.decision
        self.intake_log.decided(trace_id, decision.keep, decision.rate_limited, decision.policy,
                                decision.threshold, remembered.measured)

    def _count(self, decision: Decision, traces: int) -> None:
        """Add ``traces`` to ``decision``'s sampling_decisions child (its increment looked up once per label set)."""
        key = (decision.policy, decision.keep, decision.rate_limited)
        count = self._counters.get(key)
        if count is None:
            outcome = "kept" if decision.keep else ("rate_limited" if decision.rate_limited else "dropped")
            count = self._counters[key] = incrementer(
                self._telemetry.sampling_decisions.labels(decision.policy or "none", outcome))
        count(traces)
