"""Tail sampling end to end: every outlier, error and abort kept; the baseline at its rate; rate
limits and memory bounds hold; kept traces carry exact segment spans, readable by API and CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from otel_llm_simulate.emitters import RequestTiming, emit_vllm_v1, engine_tracer_provider
from otel_llm.exporter.store.sqlite import StoreReader
from tests.support.sampling_workload import send_sampling_workload

BASELINE_RATE = 0.10
SAMPLING = {
    "decision_wait": "3s",
    "grace": "200ms",
    "policies": [
        {"name": "errors", "type": "errors"},
        {"name": "slowest", "type": "slowest", "slowest": {"metrics": ["ttft", "e2e"], "quantile": 0.99, "window": "10m"}},
        {"name": "baseline", "type": "probabilistic", "probabilistic": {"sampling_percentage": BASELINE_RATE * 100}},
    ],
}


def api(server, path: str):
    with urllib.request.urlopen(server.metrics_url + path, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    from tests.support.otelllm import start_server

    store = tmp_path_factory.mktemp("store")
    server = start_server(str(store), {"processors": {"tail_sampling": SAMPLING}})
    try:
        sent = send_sampling_workload(server.exporter("grpc"), requests=3000)
        scrape = server.wait_for_requests(sent.total, timeout_s=60)
        server.service.store.flush()
        yield server, sent, scrape, StoreReader(Path(store))
    finally:
        server.stop()


def test_every_outlier_error_and_abort_is_kept(sampled):
    server, sent, scrape, reader = sampled
    assert len(sent.outliers) >= 5 and len(sent.errors) >= 15 and len(sent.aborts) >= 15
    for trace_id in sent.outliers:
        trace = reader.get_trace(trace_id)
        assert trace is not None, f"outlier {trace_id} not kept"
        assert trace["summary"]["policy"] == "slowest"
    for trace_id in sent.errors + sent.aborts:
        trace = reader.get_trace(trace_id)
        assert trace is not None, f"error/abort {trace_id} not kept"
        assert trace["summary"]["policy"] == "errors"
    print(f"\nkept: {len(sent.outliers)} outliers, {len(sent.errors)} errors, {len(sent.aborts)} aborts of "
          f"{sent.total} requests")
    aborts = reader.list_requests(outcome="abort", limit=10_000)
    assert {r["trace_id"] for r in aborts} == set(sent.aborts)
    assert scrape.value("vllm:request_success_total", finished_reason="abort") == len(sent.aborts)


def test_baseline_keeps_its_rate(sampled):
    _, sent, scrape, _ = sampled
    reached = scrape.value("otel_llm_sampling_decisions_total", policy="baseline", decision="kept") + scrape.value(
        "otel_llm_sampling_decisions_total", policy="none", decision="dropped")
    kept = scrape.value("otel_llm_sampling_decisions_total", policy="baseline", decision="kept")
    assert reached > 0.9 * len(sent.normal)  # "slowest" takes ~1 %, the rest reach the baseline
    print(f"\nbaseline: kept {kept:.0f} of {reached:.0f} ({kept / reached:.3f}, target {BASELINE_RATE})")
    assert BASELINE_RATE * 0.7 <= kept / reached <= BASELINE_RATE * 1.3


def test_metrics_count_every_request_but_exemplars_only_kept(sampled):
    server, sent, scrape, reader = sampled
    # Every request, aborts included (their e2e is the gateway's, as vLLM counts aborted requests too).
    assert scrape.value("vllm:e2e_request_latency_seconds_count") == sent.total
    assert scrape.value("vllm:time_to_first_token_seconds_count") == sent.total - len(sent.aborts) - len(sent.errors)
    om = server.scrape(accept="application/openmetrics-text; version=1.0.0")
    exemplar_traces = set()
    for line in om.text.splitlines():
        if "# {" in line and line.startswith("vllm:time_to_first_token_seconds_bucket"):
            exemplar_traces.add(line.split('trace_id="')[1][:32])
    assert exemplar_traces, "OpenMetrics must carry exemplars"
    for trace_id in exemplar_traces:
        assert reader.get_trace(trace_id) is not None, f"exemplar {trace_id} points at a trace that was not kept"
    assert "# {" not in server.scrape().text  # classic text exposition carries none


def test_kept_request_has_exact_segment_spans(sampled):
    server, sent, _, _ = sampled
    trace = api(server, f"/api/traces/{sent.outliers[0]}")
    spans = {s["span_id"]: s for s in trace["spans"]}
    engine = next(s for s in trace["spans"] if s["name"] == "llm_request")
    attrs = engine["attributes"]
    assert attrs["otel_llm.sampling.policy"] == "slowest"
    assert attrs["gen_ai.usage.output_tokens"] == attrs["gen_ai.usage.completion_tokens"]
    assert attrs["gen_ai.provider.name"] == "vllm" and attrs["gen_ai.request.model"] == trace["summary"]["model"]
    segments = {s["name"]: s for s in trace["spans"] if "otel_llm.segment" in s["attributes"]}
    assert set(segments) >= {"queue", "prefill", "decode"}
    for name, key in (("queue", "time_in_queue"), ("prefill", "time_in_model_prefill"),
                      ("decode", "time_in_model_decode")):
        span = segments[name]
        assert span["parent_span_id"] == engine["span_id"]
        assert span["end_time_unix_nano"] - span["start_time_unix_nano"] == pytest.approx(
            attrs["gen_ai.latency." + key] * 1e9, abs=2)
        assert engine["start_time_unix_nano"] <= span["start_time_unix_nano"]
        assert span["end_time_unix_nano"] <= engine["end_time_unix_nano"]
    ttft_end = engine["start_time_unix_nano"] + attrs["gen_ai.latency.time_to_first_token"] * 1e9
    assert segments["prefill"]["end_time_unix_nano"] == pytest.approx(ttft_end, abs=2)
    assert len(spans) == len(trace["spans"])


def test_api_lists_and_sorts(sampled):
    server, sent, _, _ = sampled
    rows = api(server, "/api/traces?sort=ttft&limit=5")["traces"]
    assert [r["ttft_s"] for r in rows] == sorted([r["ttft_s"] for r in rows], reverse=True)
    assert rows[0]["trace_id"] in sent.outliers
    errors = api(server, "/api/traces?outcome=abort&limit=1000")["traces"]
    assert len(errors) == len(sent.aborts)
    model_rows = api(server, "/api/traces?model=qwen2.5-7b&limit=1000")["traces"]
    assert model_rows and all(r["model"] == "qwen2.5-7b" for r in model_rows)
    service_rows = api(server, "/api/traces?service=qwen2.5-7b&limit=1000")["traces"]
    # Aborts of that model have the gateway's service: the filters select different rows.
    assert service_rows and all(r["service_name"] == "qwen2.5-7b" for r in service_rows)
    assert {r["trace_id"] for r in service_rows} == {
        r["trace_id"] for r in model_rows if r["service_name"] == "qwen2.5-7b"} != {r["trace_id"] for r in model_rows}
    everything = api(server, "/api/traces?limit=10000")["traces"]
    starts = sorted(r["start_time_unix_nano"] for r in everything)
    middle = starts[len(starts) // 2]
    later = api(server, f"/api/traces?since={middle}&limit=10000")["traces"]
    earlier = api(server, f"/api/traces?until={middle}&limit=10000")["traces"]
    assert later and earlier and len(later) + len(earlier) == len(everything)
    assert all(r["start_time_unix_nano"] >= middle for r in later)
    assert all(r["start_time_unix_nano"] < middle for r in earlier)
    with pytest.raises(urllib.error.HTTPError) as info:
        api(server, "/api/traces/" + "0" * 32)
    assert info.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as info:
        api(server, "/api/traces?sort=bogus")
    assert info.value.code == 400


def test_cli_table_and_waterfall(sampled):
    server, sent, _, reader = sampled
    store = str(reader.path.parent)
    table = subprocess.run([sys.executable, "-m", "otel_llm", "traces", "--store", store, "--sort", "ttft",
                            "--limit", "3"], capture_output=True, text=True, timeout=30)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("TRACE ID") and len(lines) == 4
    assert lines[1].split()[0] in sent.outliers
    trace_id = lines[1].split()[0]
    view = subprocess.run([sys.executable, "-m", "otel_llm", "trace", trace_id, "--api", server.metrics_url],
                          capture_output=True, text=True, timeout=30)
    assert view.returncode == 0, view.stderr
    text = view.stdout
    assert "[queue]" in text and "[prefill]" in text and "[decode]" in text and "llm_request" in text
    trace = reader.get_trace(trace_id)
    queue = next(s for s in trace["spans"] if s["name"] == "queue")
    queue_ms = (queue["end_time_unix_nano"] - queue["start_time_unix_nano"]) / 1e6
    assert f"{queue_ms:.1f} ms" in text
    # The workload's requests started 1-60 s before it was sent: --since 0s keeps none of them.
    recent = subprocess.run([sys.executable, "-m", "otel_llm", "traces", "--store", store, "--since", "0s"],
                            capture_output=True, text=True, timeout=30)
    assert recent.returncode == 0 and recent.stdout == "no kept requests match\n"
    hour = subprocess.run([sys.executable, "-m", "otel_llm", "traces", "--store", store, "--since", "1h",
                           "--limit", "5"], capture_output=True, text=True, timeout=30)
    assert len(hour.stdout.splitlines()) == 6
    missing = subprocess.run([sys.executable, "-m", "otel_llm", "trace", "f" * 32, "--store", store],
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode == 1 and "not in the store" in missing.stderr


def test_replaying_the_same_spans_creates_no_duplicates(make_server, tmp_path):
    server = make_server({"processors": {"tail_sampling": {
        "policies": [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}}})
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    captured = InMemorySpanExporter()
    provider = engine_tracer_provider("vllm-v1", captured, service_name="replay")
    emit_vllm_v1(provider, RequestTiming(time.time_ns(), 0.01, 0.2, 0.3, 1.5), request_id="x")
    spans = captured.get_finished_spans()
    exporter = server.exporter("http")
    exporter.export(spans)
    server.wait_for_requests(1)
    server.service.store.flush()
    trace_id = format(spans[0].context.trace_id, "032x")
    reader = StoreReader(server.service.store.path)
    first = reader.get_trace(trace_id)
    assert first is not None and len(first["spans"]) == 1 + 3 + 1  # engine + queue/prefill/decode + preprocess
    exporter.export(spans)  # the same input again, after the decision: a redelivery
    scrape = server.wait_until(lambda s: s.value("otel_llm_spans_duplicate_total") == 1)
    assert scrape.value("otel_llm_late_spans_total") == 0  # a duplicate, not a late span
    server.service.store.flush()
    again = reader.get_trace(trace_id)
    assert sorted(s["span_id"] for s in again["spans"]) == sorted(s["span_id"] for s in first["spans"])
    # Measured once: the late replay is not a second request.
    assert server.scrape().value("vllm:e2e_request_latency_seconds_count") == 1


def test_rate_limit_per_model_and_overall(make_server):
    server = make_server({
        "processors": {
            "llm_metrics": {"model_name": {"from_resource": [{"attribute": "service.name"}]}},
            "tail_sampling": {
                "decision_wait": "2s", "grace": "50ms",
                "policies": [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}],
                "rate_limit": {"per_model_traces_per_second": 5, "traces_per_second": 14}}}})
    exporter = server.exporter("grpc")
    providers = {name: engine_tracer_provider("vllm-v1", exporter, service_name=name, simple=False)
                 for name in ("noisy", "loud", "quiet")}
    sends = {"noisy": 300, "loud": 300, "quiet": 4}
    start = time.monotonic()
    for name, count in sends.items():
        for i in range(count):
            emit_vllm_v1(providers[name], RequestTiming(time.time_ns(), 0.01, 0.1, 0.1, 1.0), request_id=f"{name}{i}")
    for provider in providers.values():
        provider.force_flush()
    scrape = server.wait_for_requests(sum(sends.values()))
    elapsed = time.monotonic() - start
    kept = scrape.value("otel_llm_sampling_decisions_total", policy="all", decision="kept")
    limited = scrape.value("otel_llm_sampling_decisions_total", policy="all", decision="rate_limited")
    assert kept + limited == sum(sends.values())
    assert limited > 0
    assert kept <= 14 * (elapsed + 1)  # overall: a burst of 14, then 14/s
    server.service.store.flush()
    reader = StoreReader(server.service.store.path)
    for name in ("noisy", "loud"):
        assert len(reader.list_requests(model=name, limit=1000)) <= 5 * (elapsed + 1)  # per model: 5, then 5/s
    # Two noisy models take at most 10 of the 14 overall: a quiet one is never starved.
    assert len(reader.list_requests(model="quiet", limit=100)) == 4


def test_overall_rate_limit_holds(make_server):
    server = make_server({"processors": {"tail_sampling": {
        "decision_wait": "2s", "grace": "50ms",
        "policies": [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}],
        "rate_limit": {"traces_per_second": 5}}}})
    provider = engine_tracer_provider("vllm-v1", server.exporter("grpc"), service_name="one", simple=False)
    start = time.monotonic()
    for i in range(150):
        emit_vllm_v1(provider, RequestTiming(time.time_ns(), 0.01, 0.1, 0.1, 1.0), request_id=str(i))
    provider.force_flush()
    scrape = server.wait_for_requests(150)
    elapsed = time.monotonic() - start
    kept = scrape.value("otel_llm_sampling_decisions_total", policy="all", decision="kept")
    assert 5 <= kept <= 5 * (elapsed + 1)
    assert scrape.value("otel_llm_sampling_decisions_total", policy="all", decision="rate_limited") == 150 - kept


def test_memory_bound_decides_early_and_loses_nothing(make_server):
    server = make_server({"processors": {"tail_sampling": {
        "decision_wait": "60s", "num_traces": 20,
        "policies": [{"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}}})
    provider = engine_tracer_provider("vllm-v1", server.exporter("grpc"), service_name="bounded", simple=False)
    for i in range(200):
        # A parent that never arrives keeps each trace waiting for its gateway: only the bound can end it.
        headers = {"traceparent": f"00-{(i + 1):032x}-{(i + 1):016x}-01"}
        emit_vllm_v1(provider, RequestTiming(time.time_ns(), 0.01, 0.1, 0.1, 1.0), request_id=str(i),
                     traceparent_headers=headers)
    provider.force_flush()
    scrape = server.wait_for_requests(180)
    assert scrape.value("otel_llm_traces_in_memory") <= 20
    assert scrape.value("otel_llm_traces_completed_total", reason="memory_limit") >= 180
    server.service.stop(grace_s=1.0)  # shutdown decides the last 20
    assert server.service.pipeline.recorder.requests_recorded == 200
