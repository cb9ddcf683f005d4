"""Client-chosen weights and durations from every source go through the same validation as engine
latencies (issue 12, items 4 and 5): counted with a reason, never observed, nothing else lost."""

from __future__ import annotations

import math

from tests.support.captures import post
from tests.support.payloads import gateway_batch, vllm_batch

FAST = {"processors": {"tail_sampling": {"decision_wait": "1s", "grace": "50ms"}}}
MAX_U64 = 2**64 - 1


def _finite_sums(scrape) -> None:
    for (name, _), value in scrape.samples.items():
        if name.endswith("_sum"):
            assert math.isfinite(value) and value < 1e7, (name, value)


def test_a_client_chosen_weight_is_malformed_and_counters_keep_counting(make_server):
    server = make_server(FAST)
    poisoned = vllm_batch(1, model="weights")
    poisoned.resource_spans[0].scope_spans[0].spans[0].trace_state = "ot=th:ffffffffffffff"  # weight 2^56
    assert post(server, poisoned) == 200
    server.wait_until(lambda s: s.value("otel_llm_spans_malformed_total", reason="absurd_sampling_threshold") == 1,
                      what="the absurd threshold counted")
    assert post(server, vllm_batch(100, model="weights")) == 200
    scrape = server.wait_for_requests(100)
    assert scrape.value("vllm:request_success_total", model_name="weights") == 100  # every increment counts
    # A sane threshold still weighs: 1 in 4 sampled upstream -> each span counts 4.
    sampled = vllm_batch(3, model="sampled")
    for span in sampled.resource_spans[0].scope_spans[0].spans:
        span.trace_state = "ot=th:c"
    assert post(server, sampled) == 200
    scrape = server.wait_until(lambda s: s.value("vllm:request_success_total", model_name="sampled") == 12,
                               what="3 spans at adjusted count 4")
    _finite_sums(scrape)


def test_a_gateway_ending_at_the_end_of_time_is_counted_not_observed(make_server):
    server = make_server(FAST)
    assert post(server, gateway_batch(gateway_end_ns=MAX_U64)) == 200
    assert post(server, gateway_batch(gateway_end_ns=MAX_U64, engine=False)) == 200  # gateway only
    scrape = server.wait_for_requests(2)
    assert scrape.value("otel_llm_values_rejected_total", reason="absurd_span_duration") == 2
    # Both still counted: the engine's request under its service name, the gateway-only one its model.
    assert scrape.value("vllm:request_success_total", model_name="raw") == 1
    assert scrape.value("vllm:request_success_total", model_name="absurd-model") == 1
    assert scrape.value("otel_llm_gateway_overhead_seconds_count") == 0
    # The engine's own e2e is observed; the gateway-only request has no duration to observe.
    assert scrape.value("vllm:e2e_request_latency_seconds_count") == 1
    assert scrape.value("vllm:e2e_request_latency_seconds_count", model_name="raw") == 1
    _finite_sums(scrape)


def test_an_infinite_edge_ttft_is_counted_not_observed(make_server):
    server = make_server(FAST)
    # A plain HTTP gateway: no adapter claims it, so its edge TTFT is read (and checked) at assembly.
    assert post(server, gateway_batch(edge_ttft="inf", genai=False)) == 200
    assert post(server, gateway_batch(edge_ttft="0.25", genai=False)) == 200
    scrape = server.wait_for_requests(2)
    assert scrape.value("otel_llm_values_rejected_total", reason="invalid_edge_ttft") == 1
    assert scrape.value("otel_llm_edge_time_to_first_token_seconds_count") == 1
    assert scrape.value("otel_llm_edge_time_to_first_token_seconds_sum") == 0.25
    assert scrape.value("otel_llm_gateway_overhead_seconds_count") == 2
    _finite_sums(scrape)
