"""A real vLLM 0.32 with prefix caching and ``--enable-prompt-tokens-details``, called by OpenLLMetry's
OpenAI instrumentation (the capture group of tests/live/instrumentations.sh) with the httpx
instrumentation carrying the traceparent to vLLM. vLLM 0.32's own span has no cache attribute
(v1/engine/output_processor.py:900-915); the client span carries the response's
``usage.prompt_tokens_details.cached_tokens`` as ``gen_ai.usage.cache_read.input_tokens``, and
otel-llm joins it to vLLM's span. vLLM's own ``/metrics`` is the reference: its
``vllm:prompt_tokens_cached`` counter and its ``vllm:request_prefill_kv_computed_tokens`` histogram."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.live.test_vllm_live import model_dir, poll  # noqa: F401 - model_dir is a fixture
from tests.live.vllm_server import MAX_MODEL_LEN, SERVED_MODEL, VllmServer
from tests.support.otelllm import start_server

pytestmark = pytest.mark.timeout(1500)
ROOT = Path(__file__).resolve().parent.parent
LONG = "a prefix cache keeps the keys and values of a prompt it has seen " * 8  # shared by the repeats
CHILD = r'''
import json, os, sys
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
client = openai.OpenAI(base_url=os.environ["UPSTREAM"] + "/v1", api_key="none", max_retries=0, timeout=600)
seen = []
for prompt in json.loads(os.environ["PROMPTS"]):
    r = client.chat.completions.create(model=os.environ["MODEL"], messages=[{"role": "user", "content": prompt}],
                                       max_tokens=4, temperature=0.0)
    details = r.usage.prompt_tokens_details
    seen.append({"prompt_tokens": r.usage.prompt_tokens, "cached": details.cached_tokens if details else None})
tp.shutdown()
print(json.dumps(seen))
'''


def _capture_python() -> str:
    script = str(ROOT / "live" / "instrumentations.sh")
    built = subprocess.run([script, "build", "capture"], capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    return subprocess.run([script, "path", "capture"], capture_output=True, text=True, check=True).stdout.strip()


def test_cached_prompt_tokens_of_a_live_vllm_equal_its_own_counter(model_dir, tmp_path):  # noqa: F811
    otel = start_server(str(tmp_path / "store"), {"processors": {
        "llm_metrics": {"max_model_len": MAX_MODEL_LEN},
        "tail_sampling": {"decision_wait": "3s", "grace": "100ms"}}})
    vllm = VllmServer.api_server(model_dir, f"http://127.0.0.1:{otel.grpc_port}", "grpc", tmp_path / "vllm.log",
                                 extra_args=("--enable-prefix-caching", "--enable-prompt-tokens-details"))
    try:
        vllm.wait_ready()
        prompts = [LONG + "one", LONG + "two", LONG + "three", "something else entirely", LONG + "four"]
        script = tmp_path / "child.py"
        script.write_text(CHILD)
        env = {"PATH": "/usr/bin:/bin", "OTLP": f"http://127.0.0.1:{otel.http_port}", "UPSTREAM": vllm.base_url,
               "MODEL": SERVED_MODEL, "PROMPTS": json.dumps(prompts), "OTEL_RESOURCE_ATTRIBUTES": "",
               "TRACELOOP_TRACE_CONTENT": "false"}
        child = subprocess.run([_capture_python(), str(script)], env=env, capture_output=True, text=True, timeout=600)
        assert child.returncode == 0, child.stderr[-3000:]
        seen = json.loads(child.stdout.strip().splitlines()[-1])
        cached = sum(s["cached"] for s in seen)
        assert cached > 0, seen  # the repeats hit vLLM's prefix cache
        theirs = poll(vllm, lambda s: s.value("vllm:e2e_request_latency_seconds_count", model_name=SERVED_MODEL)
                      == len(prompts), "vLLM finished every call")
        ours = otel.wait_until(lambda s: s.value("vllm:request_success_total") >= len(prompts)
                               and s.value("otel_llm_traces_in_memory") == 0, timeout_s=120,
                               what="every call joined and measured")
        # What the client saw = what otel-llm counts = what vLLM counts itself.
        assert ours.value("otel_llm_prompt_tokens_cached_total") == cached
        assert ours.value("vllm:prompt_tokens_cached_total", model_name=SERVED_MODEL) == \
            theirs.value("vllm:prompt_tokens_cached_total", model_name=SERVED_MODEL) == cached
        assert ours.value("otel_llm_prompt_tokens_computed_total") == sum(s["prompt_tokens"] - s["cached"] for s in seen)
        name = "vllm:request_prefill_kv_computed_tokens"
        assert ours.buckets(name, model_name=SERVED_MODEL) == theirs.buckets(name, model_name=SERVED_MODEL) != {}
        assert ours.value(name + "_sum", model_name=SERVED_MODEL) == theirs.value(name + "_sum", model_name=SERVED_MODEL)
        assert ours.value("otel_llm_request_prefix_cache_hit_ratio_count") == len(prompts)
        print(f"live vLLM prefix cache: client saw {cached} cached tokens of "
              f"{sum(s['prompt_tokens'] for s in seen)}; vLLM vllm:prompt_tokens_cached_total "
              f"{theirs.value('vllm:prompt_tokens_cached_total', model_name=SERVED_MODEL):g}, vllm:prefix_cache_hits_total "
              f"{theirs.value('vllm:prefix_cache_hits_total', model_name=SERVED_MODEL):g}; otel-llm "
              f"{ours.value('otel_llm_prompt_tokens_cached_total'):g}; per request {[s['cached'] for s in seen]}")
    finally:
        vllm.stop()
        otel.stop()
