"""When the ticker falls behind (saturated: the worker and the ticker share one GIL), the worker
completes the due traces itself before it buffers more, so ``max_traces`` does not end traces early."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from bench.workload import generate
from otel_llm.processor.memory_limiter.config import MemoryLimiterProcessor
from otel_llm.processor.redaction.config import RedactionProcessor
from otel_llm.processor.tail_sampling.config import TailSamplingProcessor
from otel_llm.receiver.otlp.process import IntakeState, ReceiverCounters, spawn_context
from otel_llm.service.graph import WORKER_COMPLETES_AFTER_S, Pipeline
from otel_llm.service.telemetry import SelfTelemetry


def _poll(condition: object, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def _put(pipeline: Pipeline, state: IntakeState, payload: bytes, spans: int) -> None:
    assert not state.reserve(spans, len(payload))
    pipeline.intake.put(payload, spans, len(payload))


def test_the_worker_completes_due_traces_when_the_ticker_does_not() -> None:
    context = spawn_context()
    telemetry = SelfTelemetry(CollectorRegistry(), ReceiverCounters(context))
    state = IntakeState(context, 100_000, 1 << 30)
    sampling = TailSamplingProcessor(decision_wait=600.0, grace=0.0)
    pipeline = Pipeline({"memory_limiter": MemoryLimiterProcessor(), "tail_sampling": sampling,
                         "redaction": RedactionProcessor()}, [], telemetry, state)
    first, second = generate(2, seed=7)
    pipeline.start(tick_interval_s=3600.0)  # the ticker never ticks during the test: it stands for one behind
    try:
        assembler = pipeline.assembler
        _put(pipeline, state, first.payload, first.spans)
        assert _poll(lambda: pipeline.intake.queued_spans == 0)
        held = len(assembler)
        assert held > 0 and not assembler.completions  # buffered, ready (grace 0), not completed
        assert _poll(lambda: assembler.completion_lag() > WORKER_COMPLETES_AFTER_S)
        _put(pipeline, state, second.payload, second.spans)
        # The worker buffers the second request, finds the first's traces overdue and completes them.
        assert _poll(lambda: pipeline.intake.queued_spans == 0 and assembler.completions.get("ready", 0) > 0)
        assert set(assembler.completions) == {"ready"}  # due traces only, none ended early
        # What stays is what is not ready (a gateway span alone waits for decision_wait), nothing due.
        assert assembler.completion_lag() == 0.0
        left = assembler.take_pending(lambda trace: True)
        assert left and all(trace.ready_at is None for trace in left)
    finally:
        pipeline.shutdown(timeout_s=5)

