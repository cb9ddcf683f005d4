"""The simulated fleet's full engine mix (issue 14) into a real ``otel-llm serve``: every engine kind counted
exactly as the plan says (an ensemble, a disaggregated Dynamo or llm-d request once; aborts and failures only
the gateway saw as "genai"), and the histograms whose values the plan knows bucket by bucket.

Expected values are computed here from the plan's timings and each emitter's documented timeline
(``otel_llm_simulate/emitters.py``), never from otel-llm's code."""

from __future__ import annotations

import time
from collections import Counter

from otel_llm_simulate.runner import otlp_exporter_factory, run_plan
from otel_llm_simulate.scenarios import DEFAULT_MODELS, Plan, PlannedRequest, plan
from tests.support.workload import LATENCY_BUCKETS, TTFT_BUCKETS, expected_cumulative

FAST_DECISIONS = {"processors": {"tail_sampling": {"decision_wait": "1s", "grace": "100ms"}}}
OK = ("stop", "length")
# The engine_kind label of each simulated engine (README, "Engines and what each gives").
KIND = {"vllm-v1": "vllm", "vllm-next": "vllm", "sglang": "sglang", "tgi": "tgi", "triton": "triton",
        "triton-ensemble": "triton", "trtllm": "trtllm", "dynamo": "dynamo", "llm-d": "llm-d"}
NEW_ENGINES = {"vllm-next", "triton", "triton-ensemble", "trtllm", "dynamo", "llm-d"}


def expected_kind(r: PlannedRequest) -> str:
    # No engine span (a vLLM/Triton/... abort, or a failure behind the gateway): only the gateway's record.
    return KIND[r.engine] if r.timing is not None else "genai"


def make_plan(scenario: str = "errors", seed: int = 14, rate: float = 10.0, duration_s: float = 30.0) -> Plan:
    return plan(scenario, seed=seed, rate=rate, duration_s=duration_s,
                start_ns=time.time_ns() - round(duration_s * 1e9))


def served(p: Plan, engine: str) -> list[PlannedRequest]:
    return [r for r in p.requests if r.engine == engine and r.timing is not None and r.outcome in OK]


def test_default_mix_has_every_engine_shape_with_its_weight():
    engines = {m.engine for m in DEFAULT_MODELS}
    assert engines == set(KIND)
    p = make_plan("steady", rate=20.0, duration_s=60.0)
    counts = Counter(r.engine for r in p.requests)
    total_weight = sum(m.weight for m in DEFAULT_MODELS)
    by_model = Counter(r.model for r in p.requests)
    for m in DEFAULT_MODELS:
        assert abs(by_model[m.name] / len(p.requests) - m.weight / total_weight) < 0.04, (m.name, by_model)
    # The engines of issue 14 are about a quarter of the traffic, each present.
    new = sum(counts[e] for e in NEW_ENGINES)
    assert 0.18 < new / len(p.requests) < 0.32 and all(counts[e] > 10 for e in NEW_ENGINES)
    # Each disaggregated request has its KV transfer; its processes are members of the fleet.
    assert all(r.kv_transfer_s > 0 for r in p.requests if r.engine in ("dynamo", "llm-d"))
    roles = {(m.engine, m.role) for m in p.members if m.role}
    assert roles == {("dynamo", "prefill"), ("dynamo", "decode"), ("llm-d", "sidecar"), ("llm-d", "prefill"),
                     ("llm-d", "decode")}


def test_full_mix_counts_every_engine_kind_once_and_exact_buckets(make_server):
    p = make_plan()
    server = make_server(FAST_DECISIONS)
    result = run_plan(p, otlp_exporter_factory(f"127.0.0.1:{server.grpc_port}", "grpc"), realtime=False)
    assert result.ok and result.requests_sent == len(p.requests), result
    records = len(p.requests) + len(p.client_legs())
    scrape = server.wait_until(
        lambda s: s.value("otel_llm_requests_assembled_total") >= records
        and s.value("otel_llm_traces_in_memory") == 0,
        what=f"{records} assembled requests and no pending trace")
    assert scrape.value("otel_llm_spans_malformed_total") == 0
    assert scrape.value("otel_llm_requests_assembled_total") == records

    # Per engine kind: exactly the plan's requests, never one per worker, per composing model or per pod.
    expected = Counter(expected_kind(r) for r in p.requests)
    assert set(expected) >= {"vllm", "sglang", "tgi", "triton", "trtllm", "dynamo", "llm-d", "genai"}
    for kind, n in expected.items():
        assert scrape.value("otel_llm_requests_assembled_total", engine_kind=kind) == n, kind
        assert scrape.value("vllm:request_success_total", engine_kind=kind) == n, kind
    for m in DEFAULT_MODELS:  # the model names the engines report themselves (or the gateway gives)
        n = sum(1 for r in p.requests if r.model == m.name and r.timing is not None)
        assert scrape.value("vllm:request_success_total", engine_kind=KIND[m.engine], model_name=m.name) == n, m.name

    # trtllm-serve: its span's latencies are the executor's (queue + prefill [+ decode]), from the plan.
    trt = served(p, "trtllm")
    assert trt
    assert scrape.buckets("vllm:e2e_request_latency_seconds", engine_kind="trtllm") == expected_cumulative(
        [r.timing.queue_s + r.timing.prefill_s + r.timing.decode_s for r in trt], LATENCY_BUCKETS)
    assert scrape.buckets("vllm:time_to_first_token_seconds", engine_kind="trtllm") == expected_cumulative(
        [r.timing.queue_s + r.timing.prefill_s for r in trt], TTFT_BUCKETS)
    assert scrape.buckets("vllm:request_queue_time_seconds", engine_kind="trtllm") == expected_cumulative(
        [r.timing.queue_s for r in trt], LATENCY_BUCKETS)

    # Triton (a TensorRT-LLM model and the ensemble in front of one): the queue before the compute; TTFT from
    # the stream's first response, measured from the end of the network read (half the preprocess time).
    tri = served(p, "triton") + served(p, "triton-ensemble")
    assert served(p, "triton") and served(p, "triton-ensemble")
    assert scrape.buckets("vllm:request_queue_time_seconds", engine_kind="triton") == expected_cumulative(
        [r.timing.queue_s for r in tri], LATENCY_BUCKETS)
    assert scrape.buckets("vllm:time_to_first_token_seconds", engine_kind="triton") == expected_cumulative(
        [r.timing.ttft_s - r.timing.preprocess_s / 2 for r in tri], TTFT_BUCKETS)
    assert scrape.value("otel_llm_request_segment_seconds_count", engine_kind="triton", segment="compute") == \
        len(tri)
    assert scrape.value("vllm:request_prefill_time_seconds_count", engine_kind="triton") == 0  # never split

    # Dynamo, prefill and decode on two workers: TTFT as the frontend measured it (the KV transfer delays it).
    dyn = served(p, "dynamo")
    assert dyn
    assert scrape.buckets("vllm:time_to_first_token_seconds", engine_kind="dynamo") == expected_cumulative(
        [r.timing.ttft_s + r.kv_transfer_s for r in dyn], TTFT_BUCKETS)
    assert scrape.buckets("otel_llm_request_segment_seconds", engine_kind="dynamo", segment="kv_transfer") == \
        expected_cumulative([r.kv_transfer_s for r in dyn], TTFT_BUCKETS)

    # llm-d P/D: queue and prefill from the prefill pod's vLLM, decode from the decode pod's.
    llmd = served(p, "llm-d")
    assert llmd
    for metric, values in (("vllm:request_queue_time_seconds", [r.timing.queue_s for r in llmd]),
                           ("vllm:request_prefill_time_seconds", [r.timing.prefill_s for r in llmd]),
                           ("vllm:request_decode_time_seconds", [r.timing.decode_s for r in llmd])):
        assert scrape.buckets(metric, engine_kind="llm-d") == expected_cumulative(values, LATENCY_BUCKETS), metric
    assert scrape.buckets("otel_llm_request_segment_seconds", engine_kind="llm-d", segment="kv_transfer") == \
        expected_cumulative([r.kv_transfer_s for r in llmd], TTFT_BUCKETS)

    # vLLM's coming span: one inter-token latency per step from its token events (one step per token, evenly
    # over the decode), on spans under the SDK's 128-event limit (a pair of events per output token).
    nxt = served(p, "vllm-next")
    steps = [r.timing.decode_s / (r.timing.completion_tokens - 1) for r in nxt
             for _ in range(r.timing.completion_tokens - 1) if 2 * r.timing.completion_tokens < 128]
    assert nxt and steps
    assert scrape.value("vllm:inter_token_latency_seconds_count", model_name="qwen3-8b") == len(steps)


def test_summary_lists_the_server_requests_per_engine_kind():
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from otel_llm_simulate.runner import format_summary

    class Drop(SpanExporter):
        def export(self, spans):  # noqa: ANN001
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    p = make_plan("aborts", rate=6.0, duration_s=20.0)
    summary = format_summary(p, run_plan(p, Drop, realtime=False))
    expected = Counter(expected_kind(r) for r in p.requests)
    line = next(x for x in summary.splitlines() if x.startswith("server requests by engine_kind: "))
    got = dict(item.rsplit(" ", 1) for item in line.split(": ", 1)[1].split(", "))
    assert {k: int(v) for k, v in got.items()} == dict(expected)
    for engine in KIND:  # a row per engine of the fleet
        assert any(row.split()[:1] == [engine] for row in summary.splitlines()), engine


def test_dashboard_engine_variable_lists_every_engine_kind():
    import json
    from pathlib import Path

    dashboard = json.loads((Path(__file__).parent.parent / "collector-config" / "grafana" / "dashboards"
                            / "llm-serving.json").read_text(encoding="utf-8"))
    (engine,) = [v for v in dashboard["templating"]["list"] if v["name"] == "engine"]
    assert "engine_kind" in json.dumps(engine["query"])  # the label values that exist, new kinds included
    listed = set(engine["description"].split(":", 1)[1].split(",", 1)[0].strip().split("|"))
    assert listed == set(KIND.values()) | {"genai"}
