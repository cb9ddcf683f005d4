"""Per-request prefix-cache, speculative-decoding and LoRA-adapter accounting (issue 26, items 1-3),
from real emitters' spans to a real Prometheus.

Emitters:
- OpenLLMetry's OpenAI instrumentation (``opentelemetry-instrumentation-openai`` 0.62.4, the capture
  group of tests/live/instrumentations.sh, with the httpx instrumentation carrying the traceparent) run
  in a child process with the real ``openai`` 3.57 client. It writes ``gen_ai.usage.cache_read.input_tokens``
  from the response's ``usage.prompt_tokens_details.cached_tokens`` (openai/shared/__init__.py:285-290;
  a null ``prompt_tokens_details`` raises inside its ``@dont_throw`` setter, so no attribute). The
  official openai-v2 2.4b0 writes the key only on the Responses API, which it does not wrap
  (response_extractors.py:350-378; __init__.py wraps chat completions and embeddings), so its chat
  spans carry none. The upstream answers in vLLM 0.32's
  shape: ``usage.prompt_tokens_details`` (entrypoints/serve/engine/protocol.py:121-123, returned with
  ``--enable-prompt-tokens-details``; null without it) and, for a LoRA request, the adapter's name as
  ``model`` (entrypoints/openai/models/serving.py:144-146). Behind it, the vLLM V1 engine span
  (``otel_llm_simulate.emitters.emit_vllm_v1``: vLLM's ``do_tracing``, no cache attribute at all,
  v1/engine/output_processor.py:900-915 @ 0.32.0) with the client span's traceparent.
- SGLang 0.5.23's own spans, as captured (tests/testdata/engines/sglang/normal_nonstream.binpb):
  ``gen_ai.usage.cached_tokens`` = 0 of 24 prompt tokens.
- Speculative decoding: no emitter in reach puts it on a span (vLLM 0.32 returns it in the response
  body only, ``metrics.speculative_decoding``, v1/metrics/stats.py RequestSpecDecodeMetrics.to_dict), so
  its keys are written on an engine span here under the prefix otel-llm reads (README, llm_metrics).
"""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

from otel_llm_simulate.emitters import RequestTiming, emit_vllm_v1, engine_tracer_provider
from tests.support.captures import earliest_start_ns, shifted
from tests.support.prometheus import PrometheusServer

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent
RULES = ROOT.parent / "collector-config" / "alerts" / "llm_serving.yml"
SGLANG_CAPTURE = ROOT / "testdata" / "engines" / "sglang" / "normal_nonstream.binpb"
BASE = "qwen3-0.6b"  # no "org/" prefix: OpenLLMetry reports only the part after a slash
ADAPTER = "sql-lora"
CONFIG = {"processors": {
    "tail_sampling": {"decision_wait": "5s", "grace": "100ms", "policies": [
        {"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]},
    "llm_metrics": {"lora_adapters": {ADAPTER: BASE}},
}}

CHILD = r'''
import os, sys
import openai
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor
from opentelemetry.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

tp = TracerProvider(resource=Resource.create({"service.name": "app-openllmetry"}))
tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=os.environ["OTLP"] + "/v1/traces")))
OpenAIInstrumentor().instrument(tracer_provider=tp)
HTTPX2ClientInstrumentor().instrument(tracer_provider=tp)
client = openai.OpenAI(base_url=os.environ["UPSTREAM"] + "/v1", api_key="none", max_retries=0)
for model in sys.argv[1:]:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8)
tp.shutdown()
'''


class _Upstream(http.server.BaseHTTPRequestHandler):
    """Answers each call with the next planned (prompt tokens, cached tokens or None), vLLM 0.32's body."""

    plan: list[tuple[int, int | None]] = []
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        with self.lock:
            prompt, cached = self.plan[len(self.seen)]
            self.seen.append({"model": body["model"], "traceparent": self.headers.get("traceparent"),
                              "prompt": prompt})
        usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": 8, "total_tokens": prompt + 8,
                                 "prompt_tokens_details": None if cached is None else {"cached_tokens": cached}}
        answer = json.dumps({
            "id": f"chatcmpl-{len(self.seen)}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": usage}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


def _capture_python() -> str:
    script = str(ROOT / "live" / "instrumentations.sh")
    built = subprocess.run([script, "build", "capture"], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    return subprocess.run([script, "path", "capture"], capture_output=True, text=True, check=True).stdout.strip()


def _run_client(tmp_path: Path, server, upstream_port: int, models: list[str]) -> None:
    script = tmp_path / "openllmetry_child.py"
    script.write_text(CHILD)
    env = {"PATH": "/usr/bin:/bin", "OTLP": f"http://127.0.0.1:{server.http_port}",
           "UPSTREAM": f"http://127.0.0.1:{upstream_port}", "OTEL_RESOURCE_ATTRIBUTES": "",
           "TRACELOOP_TRACE_CONTENT": "false"}
    child = subprocess.run([_capture_python(), str(script), *models], env=env, capture_output=True, text=True,
                           timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]


def _engine_spans(server, calls: list[dict[str, Any]], first: int) -> None:
    """vLLM behind the upstream, serving BASE (its service name, as docs/engines/vllm.md says): one engine
    span per call, under the call's traceparent."""
    provider = engine_tracer_provider("vllm-v1", server.exporter("http"), service_name=BASE)
    for index, call in enumerate(calls):
        assert call["traceparent"], "the client span's context reached the upstream"
        emit_vllm_v1(provider, RequestTiming(time.time_ns() - 50_000_000, 0.001, 0.001, 0.002, 0.004,
                                             prompt_tokens=call["prompt"], completion_tokens=8),
                     request_id=f"acct-{first + index}", traceparent_headers={"traceparent": call["traceparent"]})
    provider.shutdown()


def _rule_expr(record: str) -> str:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("record") == record:
                return str(rule["expr"])
    raise AssertionError(f"no recording rule {record}")


def _value(result: list[dict], **labels: str) -> float | None:
    for sample in result:
        if all(sample["metric"].get(k) == v for k, v in labels.items()):
            return float(sample["value"][1])
    return None


def test_cache_reads_and_adapters_from_openllmetry_and_vllm_reach_prometheus(make_server, tmp_path):
    server = make_server(CONFIG)
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    # The rule's selectors carry the label prometheus.yml adds to otel-llm's job.
    prometheus = PrometheusServer(tmp_path / "prom", [], scrape_interval="1s", extra_scrape_configs=[{
        "job_name": "otel-llm-spans", "honor_labels": True,
        "static_configs": [{"targets": [server.metrics_url.removeprefix("http://")], "labels": {"source": "spans"}}]}])
    prometheus.start()
    try:
        # Phase 1: one request (12 of 23 cached), so the base model's counters exist before phase 2
        # grows them. Its ratio is phase 2's for the base model (96 of 120 and the adapter's 0 of 64:
        # vLLM serves both, and labels both with its served model name), so the two counters stay
        # proportional and the rule's rate() extrapolates both alike: the ratio is exact whatever the
        # scrape times.
        _Upstream.plan, _Upstream.seen = [(23, 12)], []
        _run_client(tmp_path, server, upstream.server_address[1], [BASE])
        _engine_spans(server, list(_Upstream.seen), 0)
        prometheus.wait_for('sum(otel_llm_prompt_tokens_cached_total{model_name="%s"})' % BASE,
                            lambda r: bool(r) and float(r[0]["value"][1]) == 12)
        # Phase 2: 96 of 120 cached; a LoRA request with nothing cached; a response without details
        # (vLLM without --enable-prompt-tokens-details): that one reports nothing, so it is in no cache number.
        _Upstream.plan += [(120, 96), (64, 0), (50, None)]
        _run_client(tmp_path, server, upstream.server_address[1], [BASE, ADAPTER, BASE])
        _engine_spans(server, _Upstream.seen[1:], 1)
        scrape = server.wait_until(lambda s: s.value("vllm:request_success_total") >= 4
                                   and s.value("otel_llm_traces_in_memory") == 0, timeout_s=60,
                                   what="four engine requests recorded")
        assert [c["model"] for c in _Upstream.seen] == [BASE, BASE, ADAPTER, BASE]

        # Counters: reporting requests only (phase 1: 12 of 23; phase 2: 96 of 120, 0 of 64).
        assert scrape.value("otel_llm_prompt_tokens_cached_total") == 12 + 96 + 0
        assert scrape.value("otel_llm_prompt_tokens_computed_total") == 11 + 24 + 64
        assert scrape.value("vllm:prompt_tokens_cached_total") == 108
        assert scrape.value("vllm:prompt_tokens_total") == 23 + 120 + 64 + 50  # every request, as before
        assert scrape.value("otel_llm_prompt_tokens_cache_write_total") == 0  # nobody reported a write
        assert "otel_llm_prompt_tokens_cache_write_total{" not in scrape.text
        # vLLM's per-request computed-prefill histogram: 11, 24, 64.
        assert scrape.value("vllm:request_prefill_kv_computed_tokens_count") == 3
        assert scrape.value("vllm:request_prefill_kv_computed_tokens_sum") == 99
        # Hit ratio per request: 12/23, 0.8, 0.0 (the request without details is not a zero).
        ratio = scrape.buckets("otel_llm_request_prefix_cache_hit_ratio")
        assert (ratio["0.0"], ratio["0.5"], ratio["0.6"], ratio["0.8"], ratio["+Inf"]) == (1, 1, 2, 3, 3)
        assert scrape.value("otel_llm_request_prefix_cache_hit_ratio_sum") == pytest.approx(12 / 23 + 0.8)
        # No speculative decoding was reported: no series.
        assert "vllm:spec_decode_num_drafts_total{" not in scrape.text
        assert "otel_llm_request_spec_decode_acceptance_length_count{" not in scrape.text

        # LoRA: the adapter request counted under its configured base model; the others not at all.
        adapter = {"adapter": ADAPTER, "model_name": BASE}
        assert scrape.value("otel_llm_adapter_requests_total", **adapter) == 1
        assert scrape.value("otel_llm_adapter_requests_total") == 1
        assert scrape.value("otel_llm_adapter_prompt_tokens_total", **adapter) == 64
        assert scrape.value("otel_llm_adapter_generation_tokens_total", **adapter) == 8
        # The existing families keep their labels: no adapter label on them.
        assert all("adapter" not in labels for labels in scrape.label_sets("vllm:request_success_total"))

        # Through the real Prometheus, once it has scraped phase 2: the recording rule's expression for the
        # base model, 108 cached of 108 + 99; counted as a zero, the request without details would make
        # it 108 / 257.
        prometheus.wait_for('sum(otel_llm_prompt_tokens_cached_total{model_name="%s"})' % BASE,
                            lambda r: bool(r) and float(r[0]["value"][1]) == 108)
        prometheus.wait_for('sum(otel_llm_adapter_requests_total{source="spans"})', lambda r: bool(r))
        expr = _rule_expr("llm:prompt_cache_hit_ratio:ratio_rate5m").replace("[5m]", "[1m]")
        result = prometheus.wait_for(expr, lambda r: _value(r, model_name=BASE) is not None)
        assert _value(result, model_name=BASE) == pytest.approx(12 / 23)
        quantile = prometheus.query(
            'histogram_quantile(1, sum by (le) (otel_llm_request_prefix_cache_hit_ratio_bucket{source="spans"}))')
        assert float(quantile[0]["value"][1]) == pytest.approx(0.8)  # the highest request's bucket bound
        adapters = prometheus.query('sum by (adapter, model_name) (otel_llm_adapter_requests_total{source="spans"})')
        assert [(s["metric"], float(s["value"][1])) for s in adapters] == [(adapter, 1.0)]
    finally:
        prometheus.stop()
        upstream.shutdown()


def _post(server, request: ExportTraceServiceRequest) -> None:
    http_request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/traces",
                                          data=request.SerializeToString(),
                                          headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(http_request, timeout=10) as response:
        assert response.status == 200


def test_sglang_capture_reports_its_cached_tokens(make_server):
    """SGLang's own span says 0 of 24 prompt tokens were cached: a reported zero is a hit ratio of 0."""
    server = make_server(CONFIG)
    capture = ExportTraceServiceRequest.FromString(SGLANG_CAPTURE.read_bytes())
    [request] = shifted([capture], time.time_ns() - 5_000_000_000 - earliest_start_ns([capture]))
    _post(server, request)
    scrape = server.wait_until(lambda s: s.value("vllm:request_success_total") >= 1
                               and s.value("otel_llm_traces_in_memory") == 0, timeout_s=30, what="the request")
    assert scrape.value("otel_llm_prompt_tokens_cached_total", engine_kind="sglang") == 0
    assert scrape.value("otel_llm_prompt_tokens_computed_total", engine_kind="sglang") == 24
    assert scrape.buckets("otel_llm_request_prefix_cache_hit_ratio", engine_kind="sglang")["0.0"] == 1
    assert scrape.value("otel_llm_request_prefix_cache_hit_ratio_count") == 1
    assert scrape.value("otel_llm_adapter_requests_total") == 0  # its model is no configured adapter


def _spec_span(provider: TracerProvider, name: str, accepted: int, draft: int, steps: int, prompt: int = 20) -> None:
    """A vLLM engine span with the per-request speculative-decoding keys (see the module docstring),
    spelled out here: vLLM's response object ``metrics.speculative_decoding`` (PR #48915) under ``vllm.``."""
    start = time.time_ns() - 100_000_000
    attributes = {"gen_ai.latency.e2e": 0.05, "gen_ai.latency.time_to_first_token": 0.01,
                  "gen_ai.latency.time_in_queue": 0.001, "gen_ai.latency.time_in_model_prefill": 0.009,
                  "gen_ai.latency.time_in_model_decode": 0.04, "gen_ai.latency.time_in_model_inference": 0.049,
                  "gen_ai.usage.prompt_tokens": prompt, "gen_ai.usage.completion_tokens": 30,
                  "gen_ai.request.id": name,
                  "vllm.metrics.speculative_decoding.num_accepted_draft_tokens": accepted,
                  "vllm.metrics.speculative_decoding.num_draft_tokens": draft,
                  "vllm.metrics.speculative_decoding.num_spec_steps": steps}
    span = provider.get_tracer("vllm.v1").start_span("llm_request", kind=SpanKind.SERVER, attributes=attributes,
                                                     start_time=start)
    span.end(end_time=start + 50_000_000)


def test_spec_decode_per_request_and_pooled(make_server, tmp_path):
    """Two requests: 9 accepted of 12 drafted in 3 steps (length 4.0) and 1 of 30 in 10 steps (1.1).
    The per-request mean is (4.0 + 1.1) / 2 = 2.55; pooled, 1 + 10 / 13 = 1.77: the definitions differ."""
    server = make_server(CONFIG)
    prometheus = PrometheusServer(tmp_path / "prom", [], scrape_interval="1s", extra_scrape_configs=[{
        "job_name": "otel-llm-spans", "honor_labels": True,
        "static_configs": [{"targets": [server.metrics_url.removeprefix("http://")], "labels": {"source": "spans"}}]}])
    prometheus.start()
    try:
        provider = engine_tracer_provider("vllm-v1", server.exporter("http"), service_name="vllm-eagle")
        _spec_span(provider, "spec-a", 9, 12, 3)
        _spec_span(provider, "spec-b", 1, 30, 10)
        # Inconsistent: more accepted than drafted. Its numbers are rejected with a reason, never
        # observed; the request itself is measured.
        _spec_span(provider, "spec-bad", 5, 4, 2)
        provider.shutdown()
        scrape = server.wait_until(lambda s: s.value("vllm:request_success_total") >= 3
                                   and s.value("otel_llm_traces_in_memory") == 0, timeout_s=30, what="three spans")
        assert scrape.value("otel_llm_values_rejected_total", reason="inconsistent_spec_decode") == 1
        assert scrape.value("otel_llm_spans_malformed_total") == 0
        assert scrape.value("vllm:spec_decode_num_accepted_tokens_total") == 10
        assert scrape.value("vllm:spec_decode_num_draft_tokens_total") == 42
        assert scrape.value("vllm:spec_decode_num_drafts_total") == 13
        lengths = scrape.buckets("otel_llm_request_spec_decode_acceptance_length")
        assert (lengths["1.0"], lengths["1.25"], lengths["3.5"], lengths["4.0"]) == (0, 1, 1, 2)
        assert scrape.value("otel_llm_request_spec_decode_acceptance_length_sum") == pytest.approx(5.1)
        # No cache reads reported by these spans: no cache series from them.
        assert scrape.value("otel_llm_request_prefix_cache_hit_ratio_count") == 0
        per_request = prometheus.wait_for(
            "sum(otel_llm_request_spec_decode_acceptance_length_sum) / sum(otel_llm_request_spec_decode_acceptance_length_count)",
            lambda r: bool(r))
        assert float(per_request[0]["value"][1]) == pytest.approx(2.55)
        pooled = prometheus.wait_for(
            '1 + sum(vllm:spec_decode_num_accepted_tokens_total{source="spans"}) / sum(vllm:spec_decode_num_drafts_total{source="spans"})',
            lambda r: bool(r))
        assert float(pooled[0]["value"][1]) == pytest.approx(1 + 10 / 13)
    finally:
        prometheus.stop()


def _vllm_span(provider: TracerProvider, name: str, model: str, prompt: int, cached: int,
               spec: tuple[int, int, int] | None = None) -> None:
    """A vLLM engine span as vllm#47633 (``gen_ai.request.model``) and #54476
    (``gen_ai.usage.cache_read.input_tokens``) write it (tests/testdata/engines/FACTS.md, vLLM row)."""
    start = time.time_ns() - 100_000_000
    attributes: dict[str, Any] = {
        "gen_ai.latency.e2e": 0.05, "gen_ai.latency.time_to_first_token": 0.01, "gen_ai.latency.time_in_queue": 0.001,
        "gen_ai.latency.time_in_model_prefill": 0.009, "gen_ai.latency.time_in_model_decode": 0.04,
        "gen_ai.latency.time_in_model_inference": 0.049, "gen_ai.usage.prompt_tokens": prompt,
        "gen_ai.usage.completion_tokens": 30, "gen_ai.request.id": name, "gen_ai.request.model": model,
        "gen_ai.usage.cache_read.input_tokens": cached}
    if spec is not None:
        for key, value in zip(("num_accepted_draft_tokens", "num_draft_tokens", "num_spec_steps"), spec):
            attributes["vllm.metrics.speculative_decoding." + key] = value
    span = provider.get_tracer("vllm.v1").start_span("llm_request", kind=SpanKind.SERVER, attributes=attributes,
                                                     start_time=start)
    span.end(end_time=start + 50_000_000)


def test_web_view_cards_show_cache_spec_decode_and_adapters(tmp_path):
    from tests.support import browser
    from tests.support.otelllm import start_server
    from tests.test_webview import WEB, _api, _open

    server = start_server(str(tmp_path / "store"), {**CONFIG, "extensions": {"webview": WEB}})
    driver = browser.chromium()
    try:
        provider = engine_tracer_provider("vllm-v1", server.exporter("http"), service_name="vllm-qwen")
        _vllm_span(provider, "w1", BASE, 100, 60, spec=(9, 12, 3))   # length 4.0
        _vllm_span(provider, "w2", BASE, 100, 20, spec=(1, 30, 10))  # length 1.1
        _vllm_span(provider, "w3", ADAPTER, 50, 10)
        # More cached than the prompt holds: rejected with its reason, the request counted without it.
        _vllm_span(provider, "w4", BASE, 10, 11)
        provider.shutdown()
        server.wait_until(lambda s: s.value("vllm:request_success_total") == 4
                          and s.value("otel_llm_traces_in_memory") == 0, what="four requests")
        assert server.scrape().value("otel_llm_values_rejected_total", reason="cached_tokens_exceed_prompt") == 1
        cards = {g["model"]: g for g in _api(server, "/api/ui/overview?window=start")["groups"]}
        base, lora = cards[BASE]["accounting"], cards[ADAPTER]["accounting"]
        assert base["prompt_cache"]["cached_tokens"] == 80 and base["prompt_cache"]["computed_tokens"] == 120
        assert base["prompt_cache"]["hit_ratio"] == pytest.approx(80 / 200)
        assert base["prompt_cache"]["mean_request_hit_ratio"] == pytest.approx((0.6 + 0.2) / 2)
        assert base["prompt_cache"]["cache_write_tokens"] is None  # never reported: absent, not 0
        assert base["spec_decode"]["pooled_acceptance_length"] == pytest.approx(1 + 10 / 13)
        assert base["spec_decode"]["mean_request_acceptance_length"] == pytest.approx((4.0 + 1.1) / 2)
        assert base["adapters"] == {ADAPTER: 1}
        assert lora["adapter_of"] == BASE and "spec_decode" not in lora
        assert lora["prompt_cache"]["hit_ratio"] == pytest.approx(0.2)
        _open(driver, server.webview_url + "/?window=start")
        shown = driver.execute_script(
            "const out = {}; for (const c of document.querySelectorAll('section.group')) {"
            " out[c.dataset.model] = Object.fromEntries([...c.querySelectorAll('.accounting [data-stat]')]"
            ".map(s => [s.dataset.stat, s.dataset.value + '|' + s.querySelector('.stat-value').textContent])); }"
            " return out;")
        assert shown[BASE]["cache_hit_ratio"] == f"{80 / 200}|40.00 %"
        assert shown[BASE]["cached_tokens"].endswith("|80 / 120")
        assert shown[BASE]["spec_pooled_acceptance_length"].endswith(f"|{1 + 10 / 13:.2f}")
        assert shown[BASE]["spec_mean_request_acceptance_length"].endswith("|2.55")
        assert shown[BASE]["adapter_requests"] == "1|1 req"
        assert shown[ADAPTER]["adapter_of"] == f"|{BASE}"
        assert "cache_write_tokens" not in shown[BASE]
    finally:
        driver.quit()
        server.stop()


@pytest.mark.parametrize(("adapters", "where", "message"), [
    ({"sql-lora": ""}, "processors.llm_metrics.lora_adapters.sql-lora", "non-empty base model"),
    ({"sql-lora": "sql-lora"}, "processors.llm_metrics.lora_adapters.sql-lora", "must differ from its base model"),
    (["sql-lora"], "processors.llm_metrics.lora_adapters", "expected a mapping"),
])
def test_lora_adapters_are_validated(adapters, where, message):
    from otel_llm.confmap import ConfigError
    from otel_llm.config import config_from_dict

    with pytest.raises(ConfigError) as raised:
        config_from_dict({"processors": {"llm_metrics": {"lora_adapters": adapters}}})
    assert where in str(raised.value) and message in str(raised.value)


def test_a_dimension_cannot_take_the_adapter_label():
    from otel_llm.confmap import ConfigError
    from otel_llm.config import config_from_dict

    dimension = {"name": "adapter", "attribute": "x", "values": ["a"]}
    with pytest.raises(ConfigError, match="adapter"):
        config_from_dict({"processors": {"llm_metrics": {"dimensions": [dimension],
                                                         "lora_adapters": {"sql-lora": "llama"}}}})
    # Without adapters nothing has that label: an existing dimension named so keeps working.
    config_from_dict({"processors": {"llm_metrics": {"dimensions": [dimension]}}})


def test_a_gateway_span_gives_the_engine_request_its_cache_reads_and_writes(make_server):
    """LiteLLM's proxy span in semconv mode (``gen_ai_semconv.py:77-80`` @ 1.110: usage
    ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` as ``gen_ai.usage.cache_read.input_tokens``
    / ``gen_ai.usage.cache_creation.input_tokens``) in front of a vLLM 0.32 engine span that has neither."""
    from opentelemetry import trace
    from opentelemetry.propagate import inject

    server = make_server(CONFIG)
    gateway = engine_tracer_provider("gateway", server.exporter("http"))
    engine = engine_tracer_provider("vllm-v1", server.exporter("http"), service_name=BASE)
    timing = RequestTiming(time.time_ns() - 2_000_000_000, 0.001, 0.01, 0.05, 0.2, prompt_tokens=400,
                           completion_tokens=20)
    span = gateway.get_tracer("litellm").start_span(
        "Received Proxy Server Request", kind=SpanKind.SERVER, start_time=timing.arrival_unix_ns - 1_000_000,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": BASE, "gen_ai.response.model": BASE,
                    "gen_ai.usage.input_tokens": 400, "gen_ai.usage.output_tokens": 20,
                    "gen_ai.usage.cache_read.input_tokens": 300, "gen_ai.usage.cache_creation.input_tokens": 100})
    headers: dict[str, str] = {}
    inject(headers, context=trace.set_span_in_context(span))
    emit_vllm_v1(engine, timing, request_id="gw-1", traceparent_headers=headers)
    span.end(end_time=timing.end_unix_ns + 2_000_000)
    gateway.shutdown()
    engine.shutdown()
    scrape = server.wait_until(lambda s: s.value("vllm:request_success_total") >= 1
                               and s.value("otel_llm_traces_in_memory") == 0, timeout_s=30, what="the request")
    assert scrape.value("vllm:request_success_total") == 1  # one request: the gateway is the engine's
    labels = {"engine_kind": "vllm", "model_name": BASE}
    assert scrape.value("otel_llm_prompt_tokens_cached_total", **labels) == 300
    assert scrape.value("otel_llm_prompt_tokens_computed_total", **labels) == 100
    assert scrape.value("otel_llm_prompt_tokens_cache_write_total", **labels) == 100
    assert scrape.buckets("otel_llm_request_prefix_cache_hit_ratio", **labels)["0.7"] == 0
    assert scrape.buckets("otel_llm_request_prefix_cache_hit_ratio", **labels)["0.8"] == 1  # 0.75
