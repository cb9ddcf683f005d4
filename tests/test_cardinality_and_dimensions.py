"""Series caps with an overflow series, configured extra dimensions with allow-lists, and
upstream probability sampling weighting observations by their adjusted count."""

from __future__ import annotations

import time

from opentelemetry.trace import SpanKind

from otel_llm_simulate.emitters import RequestTiming, emit_vllm_v1, engine_tracer_provider


def _timing() -> RequestTiming:
    return RequestTiming(time.time_ns(), 0.01, 0.1, 0.2, 1.0, completion_tokens=11)


def test_series_cap_sends_new_label_sets_to_one_overflow_series(make_server):
    server = make_server({"processors": {"llm_metrics": {"series_limit": 5}}})
    exporter = server.exporter("grpc")
    for i in range(12):  # 12 models, one request each: 5 get their own series, 7 overflow
        provider = engine_tracer_provider("vllm-v1", exporter, service_name=f"svc-{i}")
        emit_vllm_v1(provider, _timing(), request_id=str(i))
    scrape = server.wait_for_requests(12)
    names = {ls.get("service_name") for ls in scrape.label_sets("vllm:e2e_request_latency_seconds_count")}
    assert len(names - {None}) == 5
    assert scrape.value("vllm:e2e_request_latency_seconds_count", otel_metric_overflow="true") == 7
    assert scrape.value("vllm:e2e_request_latency_seconds_count") == 12  # nothing lost
    assert scrape.value("otel_llm_series_overflow_total", metric="vllm:e2e_request_latency_seconds") == 7


def _requests_behind_gateways(server, attribute: str, values: list) -> None:  # noqa: ANN001
    """One vLLM request per value, under a gateway span carrying ``attribute`` (absent for None)."""
    from opentelemetry.propagate import inject

    provider = engine_tracer_provider("vllm-v1", server.exporter("http"), service_name="dims")
    tracer = provider.get_tracer("gateway")
    for value in values:
        t = _timing()
        attributes = {attribute: value} if value is not None else {}
        with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER,
                                          attributes=attributes, start_time=t.arrival_unix_ns) as gw:
            headers: dict[str, str] = {}
            inject(headers)
            emit_vllm_v1(provider, t, request_id="d", traceparent_headers=headers)
            gw.end(end_time=t.end_unix_ns + 1000)


def test_dimension_allow_list_maps_everything_else_to_other(make_server):
    server = make_server({"processors": {"llm_metrics": {"dimensions": [
        {"name": "priority", "attribute": "llm.priority", "values": ["interactive", "batch"]}]}}})
    _requests_behind_gateways(server, "llm.priority", ["interactive", "interactive", "batch", "urgent!", None])
    scrape = server.wait_for_requests(5)
    count = "vllm:e2e_request_latency_seconds_count"
    assert scrape.value(count, priority="interactive") == 2
    assert scrape.value(count, priority="batch") == 1
    assert scrape.value(count, priority="other") == 2  # a value off the list, and a missing one
    assert scrape.value("gen_ai_server_request_duration_seconds_count", priority="batch") == 1


def test_upstream_sampling_threshold_weights_observations(server):
    """A span sampled at 25 % upstream (ot=th:c) stands for 4 requests."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from tests.test_bad_input import grpc_raw, vllm_request_proto

    request: ExportTraceServiceRequest = vllm_request_proto()
    request.resource_spans[0].scope_spans[0].spans[0].trace_state = "ot=th:c"
    grpc_raw(server, request.SerializeToString())
    scrape = server.wait_for_requests(1)
    assert scrape.value("vllm:e2e_request_latency_seconds_count") == 4.0
    assert scrape.value("vllm:request_success_total") == 4.0


def test_boolean_dimension_values_read_as_otlp_text(make_server):
    """A boolean attribute is the label text "true"/"false", as for every other attribute read."""
    server = make_server({"processors": {"llm_metrics": {"dimensions": [
        {"name": "stream", "attribute": "llm.stream", "values": ["true", "false"]}]}}})
    _requests_behind_gateways(server, "llm.stream", [True, True, False])
    scrape = server.wait_for_requests(3)
    count = "vllm:e2e_request_latency_seconds_count"
    assert (scrape.value(count, stream="true"), scrape.value(count, stream="false")) == (2, 1)


def test_series_cap_holds_when_a_key_first_seen_failing_succeeds_later():
    """A label key whose first request failed has no TTFT series yet; once other keys fill the cap,
    its first success goes to the overflow series (counted) instead of failing the recorder."""
    from otel_llm.pdata.records import Outcome
    from otel_llm.processor.llm_metrics.metrics.definitions import vllm_naming
    from otel_llm.processor.llm_metrics.metrics.recorder import MetricsRecorder
    from tests.test_sampling_policies import record

    recorder = MetricsRecorder([vllm_naming(1024)], (), series_limit=2)
    recorder.record(record(model="a", outcome=Outcome.ERROR))
    recorder.record(record(model="b"))
    recorder.record(record(model="c"))  # the TTFT family is now full: a's key is not in it
    recorder.record(record(model="a"))
    ttft = next(h.family for h in recorder.namings[0].histograms if h.spec.name == "vllm:time_to_first_token_seconds")
    assert len(ttft.series) == 2 + 1  # the cap plus the overflow series
    assert sum(series.count for series in ttft.series.values()) == 3  # b, c, and a's success: none lost
    assert ttft.overflowed == 1  # a's success


def test_token_buckets_follow_each_models_max_model_len(make_server):
    """vLLM builds its token buckets from each server's max_model_len (build_1_2_5_buckets); one fleet
    serves models with different context lengths."""
    from tests.support.captures import post
    from tests.support.payloads import vllm_batch

    server = make_server({"processors": {"llm_metrics": {"max_model_len": 8192,
                                                          "max_model_len_by_model": {"short": 1024}}}})
    assert post(server, vllm_batch(2, model="short")) == 200
    assert post(server, vllm_batch(3, model="long")) == 200
    scrape = server.wait_for_requests(5)
    # vLLM's build_1_2_5_buckets(1024) and (8192): 1, 2, 5, ... up to the last not above max_model_len
    short = ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "1000.0", "+Inf"]
    long = short[:-1] + ["2000.0", "5000.0", "+Inf"]
    for family in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens"):
        assert list(scrape.buckets(family, model_name="short")) == short
        assert list(scrape.buckets(family, model_name="long")) == long
    # 100 prompt tokens each (the payload's): the 100 bucket holds them, on either bucket set
    assert scrape.buckets("vllm:request_prompt_tokens", model_name="short")["100.0"] == 2
    assert scrape.buckets("vllm:request_prompt_tokens", model_name="long")["100.0"] == 3
    assert scrape.buckets("vllm:request_generation_tokens", model_name="long")["50.0"] == 0  # 51 tokens
    assert scrape.buckets("vllm:request_generation_tokens", model_name="long")["100.0"] == 3


def test_max_model_len_by_model_refuses_a_bad_length(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "c.yaml"
    config.write_text("processors:\n  llm_metrics:\n    max_model_len_by_model:\n      m: 0\n")
    out = subprocess.run([sys.executable, "-m", "otel_llm", "validate", str(config)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "processors.llm_metrics.max_model_len_by_model.m" in out.stderr + out.stdout
