"""The completion chain on its own, in process and without sockets: the adapter stage's spans into
the tail sampler's buffer, then llm_metrics -> decision -> redaction -> kept-trace consumers, as
``service/graph.py`` builds it from the pipeline's processors. Inputs are OTLP requests read from
``testdata/`` (OTLP JSON); every expected value is computed from those inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import CollectorRegistry

from otel_llm.component import Host
from otel_llm.pdata.records import KeptTrace
from otel_llm.processor.llm_metrics.config import LlmMetricsProcessor
from otel_llm.processor.redaction.config import RedactionProcessor
from otel_llm.processor.tail_sampling.config import PolicyConfig, ProbabilisticPolicyConfig, TailSamplingProcessor
from otel_llm.receiver.otlp.otlpjson import parse_otlp_json
from otel_llm.receiver.otlp.process import IntakeState, ReceiverCounters, spawn_context
from otel_llm.service.graph import Pipeline
from otel_llm.service.telemetry import SelfTelemetry

TESTDATA = Path(__file__).parent / "testdata"
KEEP_ALL = TailSamplingProcessor(decision_wait=3600.0, grace=0.0, policies=[
    PolicyConfig(name="all", type="probabilistic", probabilistic=ProbabilisticPolicyConfig(100.0))])
KEEP_NONE = TailSamplingProcessor(decision_wait=3600.0, grace=0.0, policies=[
    PolicyConfig(name="none", type="probabilistic", probabilistic=ProbabilisticPolicyConfig(0.0))])


class Collecting:
    """A kept-trace consumer (the SDK's SpanExporter shape) that keeps what it is given."""

    def __init__(self, name: str = "collecting", accept: bool = True) -> None:
        self.name, self.accept = name, accept
        self.kept: list[KeptTrace] = []
        self.flushes: list[bool] = []

    def start(self, host: Host) -> None:
        pass

    def consume(self, kept: KeptTrace) -> bool:
        self.kept.append(kept)
        return self.accept

    def flush(self, only_if_due: bool) -> None:
        self.flushes.append(only_if_due)

    def shutdown(self, grace_s: float) -> None:
        pass


def request_of(name: str) -> ExportTraceServiceRequest:
    """OTLP/JSON (hex ids, as the spec writes them), read as the HTTP receiver reads it."""
    return parse_otlp_json((TESTDATA / name).read_bytes())


def spans_of(request: ExportTraceServiceRequest) -> list:
    return [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def pipeline(processors: dict, consumers: list) -> tuple[Pipeline, CollectorRegistry]:
    registry = CollectorRegistry()
    context = spawn_context()
    telemetry = SelfTelemetry(registry, ReceiverCounters(context))
    return Pipeline(processors, consumers, telemetry, IntakeState(context, 10_000, 1 << 30)), registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def attribute(span, key: str):
    for kv in span.attributes:
        if kv.key == key:
            return json_format.MessageToDict(kv.value)
    return None


def default_processors(sampling: TailSamplingProcessor) -> dict:
    return {"llm_metrics": LlmMetricsProcessor(), "tail_sampling": sampling, "redaction": RedactionProcessor()}


def test_a_gateway_and_vllm_trace_goes_one_way_to_every_consumer():
    request = request_of("gateway_vllm.json")
    engine = next(s for s in spans_of(request) if s.name == "llm_request")
    latency = {kv.key: kv.value.double_value for kv in engine.attributes if kv.key.startswith("gen_ai.latency.")}
    prompt = "".join(kv.value.string_value for kv in engine.attributes if kv.key == "gen_ai.prompt")
    store, exporter = Collecting("store"), Collecting("otlp")
    chain, registry = pipeline(default_processors(KEEP_ALL), [store, exporter])
    chain.buffer(request.SerializeToString())
    assert chain.assembler.tick() == 1  # rooted, and a grace of 0: complete at the first tick
    chain.shutdown(timeout_s=5)  # drains: every pending trace completes and the consumers are flushed

    assert [len(c.kept) for c in (store, exporter)] == [1, 1] and store.kept[0] is exporter.kept[0]
    kept = store.kept[0]
    assert kept.policy == "all" and len(kept.records) == 1
    record = kept.records[0]
    assert record.engine_kind == "vllm" and record.ttft_s == latency["gen_ai.latency.time_to_first_token"]
    assert record.e2e_s == latency["gen_ai.latency.e2e"] and record.queue_s == latency["gen_ai.latency.time_in_queue"]
    gateway = next(s for s in spans_of(request) if s.name.startswith("POST"))
    gateway_s = (gateway.end_time_unix_nano - gateway.start_time_unix_nano) / 1e9
    assert record.gateway_overhead_s == pytest.approx(gateway_s - latency["gen_ai.latency.e2e"], abs=1e-9)
    out = spans_of(kept.request)
    segments = sorted(attribute(s, "otel_llm.segment")["stringValue"] for s in out if attribute(s, "otel_llm.segment"))
    # DESIGN.md §4: preprocess = TTFT - queue - prefill and postprocess = e2e - TTFT - decode, when not zero.
    preprocess = latency["gen_ai.latency.time_to_first_token"] - latency["gen_ai.latency.time_in_queue"] \
        - latency["gen_ai.latency.time_in_model_prefill"]
    postprocess = latency["gen_ai.latency.e2e"] - latency["gen_ai.latency.time_to_first_token"] \
        - latency["gen_ai.latency.time_in_model_decode"]
    expected = ["decode", "prefill", "queue"] + (["preprocess"] if preprocess > 0 else []) \
        + (["postprocess"] if postprocess > 0 else [])
    assert segments == sorted(expected) and len(expected) == 5
    assert kept.spans == len(out) == len(spans_of(request)) + len(expected)
    kept_engine = next(s for s in out if s.name == "llm_request")
    assert attribute(kept_engine, "gen_ai.prompt") is None and prompt  # redaction ran before any consumer
    assert sample(registry, "otel_llm_attributes_redacted_total", reason="content_key") >= 1
    assert chain.recorder is not None and chain.recorder.requests_recorded == 1
    assert sample(registry, "otel_llm_sampling_decisions_total", policy="all", decision="kept") == 1
    assert store.flushes and store.flushes[-1] is False  # the final flush is not "only if due"


def test_a_dropped_trace_is_measured_and_reaches_no_consumer():
    store = Collecting()
    chain, registry = pipeline(default_processors(KEEP_NONE), [store])
    chain.buffer(request_of("gateway_vllm.json").SerializeToString())
    chain.shutdown(timeout_s=5)
    assert store.kept == []
    assert chain.recorder is not None and chain.recorder.requests_recorded == 1
    # A 0 % policy never matches: no policy named, dropped.
    assert sample(registry, "otel_llm_sampling_decisions_total", policy="none", decision="dropped") == 1
    assert sample(registry, "otel_llm_sampling_decisions_total", policy="none", decision="kept") == 0


def test_a_late_engine_span_follows_the_decision_and_is_measured_once():
    request = request_of("gateway_vllm.json")
    engine_only = ExportTraceServiceRequest()
    engine_only.CopyFrom(request)
    for rs in engine_only.resource_spans:
        for ss in rs.scope_spans:
            keep = [s for s in ss.spans if s.name == "llm_request"]
            del ss.spans[:]
            ss.spans.extend(keep)
    gateway_only = ExportTraceServiceRequest()
    gateway_only.CopyFrom(request)
    for rs in gateway_only.resource_spans:
        for ss in rs.scope_spans:
            keep = [s for s in ss.spans if s.name != "llm_request"]
            del ss.spans[:]
            ss.spans.extend(keep)
    store = Collecting()
    chain, registry = pipeline(default_processors(KEEP_ALL), [store])
    chain.buffer(gateway_only.SerializeToString())
    chain.assembler.drain()  # the trace completes without its engine span: no request yet
    assert chain.recorder is not None and chain.recorder.requests_recorded == 0 and len(store.kept) == 1
    chain.buffer(engine_only.SerializeToString())  # late: follows "kept", measured now
    assert sample(registry, "otel_llm_late_spans_total") == 1
    assert chain.recorder.requests_recorded == 1 and len(store.kept) == 2
    assert [s.name for s in spans_of(store.kept[1].request) if not attribute(s, "otel_llm.segment")] == ["llm_request"]
    chain.buffer(engine_only.SerializeToString())  # the same span again: not measured twice
    assert chain.recorder.requests_recorded == 1 and sample(registry, "otel_llm_late_spans_total") == 1
    assert sample(registry, "otel_llm_spans_duplicate_total") == 1  # a redelivery, counted as one
    chain.shutdown(timeout_s=5)


def test_without_llm_metrics_and_tail_sampling_every_trace_is_kept_unmeasured():
    store = Collecting()
    chain, registry = pipeline({"redaction": RedactionProcessor()}, [store])
    assert chain.metrics is None and chain.recorder is None
    chain.buffer(request_of("gateway_vllm.json").SerializeToString())
    chain.shutdown(timeout_s=5)
    assert len(store.kept) == 1 and store.kept[0].policy == "" and store.kept[0].records == []
    assert sample(registry, "otel_llm_sampling_decisions_total", policy="none", decision="kept") == 1


def test_a_consumer_that_refuses_is_counted_and_the_others_still_get_the_trace():
    refusing, taking = Collecting("full", accept=False), Collecting("store")
    chain, registry = pipeline(default_processors(KEEP_ALL), [refusing, taking])
    chain.buffer(request_of("gateway_vllm.json").SerializeToString())
    chain.shutdown(timeout_s=5)
    assert len(refusing.kept) == len(taking.kept) == 1
    assert sample(registry, "otel_llm_kept_traces_dropped_total", sink="full") == 1
    assert sample(registry, "otel_llm_kept_traces_dropped_total", sink="store") == 0


def test_a_failing_stage_is_counted_and_the_next_trace_still_completes():
    class Exploding(Collecting):
        def consume(self, kept: KeptTrace) -> bool:
            if not self.kept:
                self.kept.append(kept)
                raise RuntimeError("boom")
            return super().consume(kept)

    consumer = Exploding()
    chain, registry = pipeline(default_processors(KEEP_ALL), [consumer])
    request = request_of("gateway_vllm.json")
    chain.buffer(request.SerializeToString())
    chain.assembler.drain()
    assert sample(registry, "otel_llm_spans_dropped_total", reason="assembly_error") == len(spans_of(request))
    assert chain.recorder is not None and chain.recorder.requests_recorded == 1  # the metrics are not lost with it
    second = request_of("gateway_vllm.json")
    for span in spans_of(second):
        span.trace_id = bytes.fromhex("ab" * 16)
    chain.buffer(second.SerializeToString())
    chain.shutdown(timeout_s=5)
    assert len(consumer.kept) == 2


def test_a_trace_that_fails_costs_the_traces_completed_with_it_nothing():
    """Traces due together go along the chain as one batch: one whose exporter fails is counted
    (its own spans only), and the others of its batch are still kept and measured."""
    failing_trace = bytes.fromhex("cd" * 16)

    class ExplodingOnOne(Collecting):
        def consume(self, kept: KeptTrace) -> bool:
            if any(span.trace_id == failing_trace for span in spans_of(kept.request)):
                raise RuntimeError("boom")
            return super().consume(kept)

    consumer = ExplodingOnOne()
    chain, registry = pipeline(default_processors(KEEP_ALL), [consumer])
    requests = [request_of("gateway_vllm.json") for _ in range(3)]
    for number, request in enumerate(requests):
        for span in spans_of(request):
            span.trace_id = failing_trace if number == 1 else bytes([0xa0 + number]) * 16
        chain.buffer(request.SerializeToString())
    assert chain.assembler.drain() == 3  # one batch
    assert sample(registry, "otel_llm_spans_dropped_total", reason="assembly_error") == len(spans_of(requests[1]))
    assert sorted(kept.records[0].trace_id for kept in consumer.kept) == [b"\xa0" * 16, b"\xa2" * 16]
    assert chain.recorder is not None and chain.recorder.requests_recorded == 3
    chain.shutdown(timeout_s=5)
