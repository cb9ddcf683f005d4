"""The completion lane: the traces the compiled core reads whole, completed past the chain's stages.

Nearly every completed trace is one request whose record the core builds, decided by policies the
core runs, and dropped. Along the chain (entry -> ``llm_metrics`` -> ``tail_sampling``'s decision ->
``redaction``) each such trace cost a ``CompletedTrace``, three stages' loops and the lists handed
between the core's per-batch calls: ~2–3 µs of the chain's ~9 µs per trace in one process
(``bench.hotpath --split``), more at saturation (docs/development/performance-history.md, stage seventeen). The lane
hands a run of them to the core's ``Lane`` (``rust/src/lane.rs``), which builds, decides, records
and remembers them (the decision cache, in the buffer), and does here, once per run, what the
stages do besides: the counts and the kept traces to the redaction stage. Everything else (a trace the core does not build, a late span, a
decision from the intake log's journal) goes along the chain, in order with the lane's runs, so
the decider and the recorder see every trace in the order the chain would have given them.

The lane runs only where the chain is what it stands for: the core's buffer, record builder,
decider (no rate limit) and recording (no accounting), and no intake log (``completion_lane``).
``tests/unit/service/test_completion_lane.py`` compares it with the chain."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from otel_llm.pdata.traces import DROP, CompletedTrace, Remembered
from otel_llm.processor.llm_metrics.metrics.recorder import RECORD_MANY_CHUNK
from otel_llm.processor.llm_metrics.stage import LlmMetricsStage
from otel_llm.processor.redaction.stage import RedactionStage
from otel_llm.processor.tail_sampling.assembler import NativeTraceAssembler, TraceAssembler
from otel_llm.processor.tail_sampling.stage import DecisionStage

if TYPE_CHECKING:
    from otel_llm.service.graph import _Entry


class Lane:
    def __init__(self, core: Any, assembler: NativeTraceAssembler, entry: _Entry, metrics: LlmMetricsStage,
                 decision: DecisionStage, redaction: RedactionStage, sampler_lock: threading.Lock,
                 recorder_lock: threading.Lock) -> None:
        self._core = core
        self._assembler = assembler
        self._entry = entry
        self._metrics = metrics
        self._decision = decision
        self._redaction = redaction
        self._sampler_lock = sampler_lock
        self._recorder_lock = recorder_lock

    @property
    def completed(self) -> int:
        """Traces completed by the lane so far."""
        return int(self._core.completed)

    def complete(self, due: list[tuple[Any, str]], chain: Callable[[list[tuple[Any, str]]], None]) -> None:
        """``due`` (trace, reason) in order: each run the core takes completed here, each other run by ``chain``."""
        build = self._core.build
        position = 0
        while position < len(due):
            end, run = build(due, position)
            if run is None:
                chain(due[position:end])
            else:
                self._complete_run(run)
            position = end

    def _complete_run(self, run: Any) -> None:
        core = self._core
        try:
            with self._sampler_lock:
                core.decide(run)
        except Exception as exc:  # noqa: BLE001 - not one trace's (those are in the run): the run fails, counted
            self._fail(run, exc)
            return
        failure: Exception | None = None
        try:
            for start in range(0, len(run), RECORD_MANY_CHUNK):
                with self._recorder_lock:  # a scrape waits for one chunk at most, as with record_many
                    core.record(run, start, start + RECORD_MANY_CHUNK)
        except Exception as exc:  # noqa: BLE001 - as the chain: the run's kept traces still go on, then all are failed
            failure = exc
        try:
            kept, raised, dropped, assembled, refused, reasons = core.finish(run)
            self._assembler.remember_lane(core, run)
        except Exception as exc:  # noqa: BLE001 - as above
            self._fail(run, failure or exc)
            return
        entry = self._entry
        for reason, traces in reasons:
            self._assembler.count_completed(reason, traces)
            entry.count_completed(reason, traces)
        self._metrics.count_lane(assembled, refused)
        self._decision.decided_in_lane(dropped, [decision for _, _, _, decision in kept])
        if failure is None and not kept and not raised:
            return
        handed = [CompletedTrace(trace, reason, records=[record], decision=decision)
                  for trace, reason, record, decision in kept]
        handed += [CompletedTrace(trace, reason, records=[record], error=error)
                   for trace, reason, record, error in raised]
        if failure is not None:  # every trace of the run fails, as the chain's entry fails its batch
            handed_ids = {id(completed.trace) for completed in handed}
            handed += [CompletedTrace(trace, reason) for trace, reason in core.items(run)
                       if id(trace) not in handed_ids]
        entry.hand_on(handed, self._redaction, failure)

    def _fail(self, run: Any, failure: Exception) -> None:
        """Every trace of ``run`` completed and failed: counted by reason, logged, its spans counted dropped."""
        failed = [CompletedTrace(trace, reason) for trace, reason in self._core.items(run)]
        by_reason: dict[str, int] = {}
        for completed in failed:
            by_reason[completed.reason] = by_reason.get(completed.reason, 0) + 1
        for reason, traces in by_reason.items():
            self._assembler.count_completed(reason, traces)
            self._entry.count_completed(reason, traces)
        self._entry.hand_on(failed, self._redaction, failure)  # undecided: the redaction stage passes them by


def completion_lane(extension: Any, assembler: TraceAssembler, entry: _Entry, metrics: LlmMetricsStage | None,
                    decision: DecisionStage, redaction: RedactionStage) -> Lane | None:
    """The lane where the chain is the one it stands for (see the module's doc), else None."""
    if extension is None or not hasattr(extension, "Lane") or not isinstance(assembler, NativeTraceAssembler):
        return None
    if metrics is None or metrics.native_records is None or metrics.intake_log is not None:
        return None
    sampler = decision.sampler
    decider = sampler.lane_decider() if sampler is not None else None
    recording = metrics.recorder.core_recording()
    if decider is None or recording is None or decision.intake_log is not None:
        return None
    native_decider, sampler_lock, kept = decider
    core_recording, recorder_lock = recording
    core = extension.Lane(metrics.native_records, native_decider, core_recording, Remembered, DROP, kept)
    return Lane(core, assembler, entry, metrics, decision, redaction, sampler_lock, recorder_lock)
