"""Spans from every engine shape, sent with the real OTLP exporters over gRPC and HTTP, scraped
from /metrics: every histogram of both namings has exactly the per-bucket counts the inputs imply."""

from __future__ import annotations

import pytest

from tests.support.workload import (
    FLEET_CONFIG,
    GENAI_DURATION_BUCKETS,
    GENAI_TPOT_BUCKETS,
    GENAI_TTFT_BUCKETS,
    LATENCY_BUCKETS,
    TOKEN_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    Group,
    expected_cumulative,
    send_mixed_fleet,
)

VLLM_HISTOGRAMS = [
    ("vllm:time_to_first_token_seconds", "ttft", TTFT_BUCKETS),
    ("vllm:request_time_per_output_token_seconds", "tpot", TPOT_BUCKETS),
    ("vllm:e2e_request_latency_seconds", "e2e", LATENCY_BUCKETS),
    ("vllm:request_queue_time_seconds", "queue", LATENCY_BUCKETS),
    ("vllm:request_prefill_time_seconds", "prefill", LATENCY_BUCKETS),
    ("vllm:request_decode_time_seconds", "decode", LATENCY_BUCKETS),
    ("vllm:request_inference_time_seconds", "inference", LATENCY_BUCKETS),
    ("vllm:request_prompt_tokens", "prompt_tokens", TOKEN_BUCKETS),
    ("vllm:request_generation_tokens", "completion_tokens", TOKEN_BUCKETS),
]
GENAI_HISTOGRAMS = [
    ("gen_ai_server_time_to_first_token_seconds", "ttft", GENAI_TTFT_BUCKETS),
    ("gen_ai_server_time_per_output_token_seconds", "tpot", GENAI_TPOT_BUCKETS),
    ("gen_ai_server_request_duration_seconds", "e2e", GENAI_DURATION_BUCKETS),
]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The fleet through the server: the adapter stage on the pipeline's worker thread."""
    from tests.support.otelllm import start_server

    server = start_server(str(tmp_path_factory.mktemp("store")), FLEET_CONFIG)
    assert server.service.ingest is not None
    assert [p.name for p in server.service.ingest._processes] == ["otel-llm-receivers"]
    try:
        groups = send_mixed_fleet(server)
        total = sum(g.count for g in groups.values())
        scrape = server.wait_for_requests(total)
        yield server, groups, scrape
    finally:
        server.stop()


def _vllm_labels(g: Group) -> dict[str, str]:
    return {"model_name": g.model, "engine_kind": g.engine_kind, "service_name": g.service_name}


@pytest.mark.parametrize("group", ["vllm_gw", "vllm_res", "vllm_v0", "sglang", "tgi"])
@pytest.mark.parametrize("metric,field,bounds", VLLM_HISTOGRAMS, ids=[m[0] for m in VLLM_HISTOGRAMS])
def test_vllm_naming_exact_buckets(fleet, group, metric, field, bounds):
    _, groups, scrape = fleet
    g = groups[group]
    values = getattr(g, field)
    got = scrape.buckets(metric, **_vllm_labels(g))
    if not values:
        assert got == {}, f"{metric} must have no series for {group}: the engine does not report {field}"
        return
    assert got == expected_cumulative(values, bounds)
    assert scrape.value(metric + "_count", **_vllm_labels(g)) == len(values)
    assert scrape.value(metric + "_sum", **_vllm_labels(g)) == pytest.approx(sum(values), rel=1e-6)


@pytest.mark.parametrize("group", ["vllm_gw", "vllm_res", "vllm_v0", "sglang", "tgi"])
@pytest.mark.parametrize("metric,field,bounds", GENAI_HISTOGRAMS, ids=[m[0] for m in GENAI_HISTOGRAMS])
def test_genai_naming_exact_buckets(fleet, group, metric, field, bounds):
    _, groups, scrape = fleet
    g = groups[group]
    labels = {"gen_ai_request_model": g.model, "gen_ai_provider_name": g.provider}
    values = getattr(g, field)
    got = scrape.buckets(metric, **labels)
    if not values:
        assert got == {}
        return
    assert got == expected_cumulative(values, bounds)


def test_genai_labels_follow_the_conventions(fleet):
    _, groups, scrape = fleet
    labels = scrape.label_sets("gen_ai_server_request_duration_seconds_count")
    by_model = {ls["gen_ai_request_model"]: ls for ls in labels}
    assert set(by_model) == {g.model for g in groups.values()}
    gateway = by_model["llama-3-8b"]
    assert gateway["gen_ai_operation_name"] == "chat"  # from the gateway route / span
    assert gateway["gen_ai_provider_name"] == "vllm"
    # vLLM V1 reports no model and the gateway only the one it was asked for: no response model was
    # observed, so none is made up (issue 11).
    assert gateway["gen_ai_response_model"] == ""
    assert by_model["falcon-7b"]["gen_ai_operation_name"] == "text_completion"  # TGI /generate


def test_token_counters_and_outcomes(fleet):
    _, groups, scrape = fleet
    for g in groups.values():
        labels = _vllm_labels(g)
        assert scrape.value("vllm:prompt_tokens_total", **labels) == sum(g.prompt_tokens)
        assert scrape.value("vllm:generation_tokens_total", **labels) == sum(g.completion_tokens)
        for reason in set(g.outcomes):
            assert scrape.value("vllm:request_success_total", finished_reason=reason, **labels) == g.outcomes.count(reason)


def test_gateway_overhead_is_edge_minus_engine(fleet):
    _, groups, scrape = fleet
    g = groups["vllm_gw"]
    got = scrape.buckets("otel_llm_gateway_overhead_seconds", model_name=g.model)
    assert got == expected_cumulative(g.gateway_overhead, GENAI_DURATION_BUCKETS)
    # Requests with no gateway have no overhead to report.
    assert scrape.buckets("otel_llm_gateway_overhead_seconds", model_name="qwen2.5-7b") == {}


def test_segments_cover_every_engine(fleet):
    _, groups, scrape = fleet
    g = groups["vllm_gw"]
    queue = scrape.buckets("otel_llm_request_segment_seconds", model_name=g.model, segment="queue")
    assert queue == expected_cumulative(g.queue, TTFT_BUCKETS)
    assert scrape.value("otel_llm_request_segment_seconds_count", model_name=g.model, segment="decode") == g.count
    # V0 has no prefill/decode split, so it has no segments at all.
    assert scrape.value("otel_llm_request_segment_seconds_count", model_name="mistral-7b") == 0


def test_self_telemetry_counts_spans(fleet):
    _, groups, scrape = fleet
    # vLLM/V0 spans are single; gateway 30; SGLang and TGI send child spans that are passed through.
    assert scrape.value("otel_llm_spans_matched_total", adapter="vllm_v1") == groups["vllm_gw"].count + groups["vllm_res"].count
    assert scrape.value("otel_llm_spans_matched_total", adapter="vllm_v0") == groups["vllm_v0"].count
    assert scrape.value("otel_llm_spans_matched_total", adapter="sglang") == groups["sglang"].count
    assert scrape.value("otel_llm_spans_matched_total", adapter="tgi") == groups["tgi"].count
    assert scrape.value("otel_llm_spans_passed_through_total") > 0
    assert scrape.value("otel_llm_spans_malformed_total") == 0
    received = scrape.value("otel_llm_receiver_accepted_spans_total")
    matched = scrape.value("otel_llm_spans_matched_total")
    assert received == matched + scrape.value("otel_llm_spans_passed_through_total")
