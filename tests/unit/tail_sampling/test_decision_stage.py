"""The decision stage's memory of what was measured: a trace decided before a crash and replayed
after it (the intake log's journal gives it a prior decision) keeps every span either run measured,
so a span measured before the crash is still a duplicate when it is redelivered afterwards."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from otel_llm.pdata.records import RequestRecord
from otel_llm.pdata.spans import PendingTrace
from otel_llm.pdata.traces import CompletedTrace, Decision, Remembered
from otel_llm.processor.tail_sampling.assembler import AssemblySettings, TraceAssembler
from otel_llm.processor.tail_sampling.stage import DecisionStage
from otel_llm.receiver.otlp.process import ReceiverCounters, spawn_context
from otel_llm.service.telemetry import SelfTelemetry

TRACE_ID = b"\x07" * 16
MEASURED_BEFORE = b"\x01" * 8  # a late span measured before the crash (in the journal's decision)
REPLAYED = b"\x02" * 8  # the engine span the replayed request brings


class Passed:
    def __init__(self) -> None:
        self.batches: list[list[CompletedTrace]] = []

    def consume_batch(self, batch: list[CompletedTrace]) -> None:
        self.batches.append(batch)


def record(span_id: bytes) -> RequestRecord:
    return RequestRecord(trace_id=TRACE_ID, span_id=span_id, engine_kind="vllm", adapter="vllm_v1",
                         service_name="s", model="m", model_source="test", request_model="m", response_model="m",
                         operation_name="chat", provider_name="vllm", outcome="success", ttft_s=0.1, e2e_s=1.0)


def test_a_replayed_trace_remembers_the_spans_its_prior_decision_measured_and_its_own() -> None:
    kept = Decision(True, "errors")
    prior = Remembered(kept, {MEASURED_BEFORE})
    buffer = TraceAssembler(AssemblySettings(decision_wait_s=1e9, grace_s=0.0), Passed(), clock=lambda: 0.0)
    buffer.restore_decisions([(TRACE_ID, prior)])  # the previous run's cache, as a graceful restart keeps it
    passed = Passed()
    stage = DecisionStage(None, buffer, SelfTelemetry(CollectorRegistry(), ReceiverCounters(spawn_context())), passed)
    replayed = CompletedTrace(PendingTrace(TRACE_ID, 0.0), "ready", prior=prior, records=[record(REPLAYED)])
    stage.consume_batch([replayed])
    assert passed.batches == [[replayed]] and replayed.decision is kept
    ((trace_id, remembered),) = buffer.decisions()
    assert trace_id == TRACE_ID and remembered.decision is kept
    assert set(remembered.measured) == {MEASURED_BEFORE, REPLAYED}
