"""The adapter stage (``digest.py``): the engine span's observation is read; only the configured
keys are kept; attribute limits truncate and are counted. Inputs from ``tests/unit/service/testdata``."""

from __future__ import annotations

from pathlib import Path

from otel_llm.processor.llm_metrics.config import LlmMetricsProcessor
from otel_llm.processor.llm_metrics.digest import digest_in_process, digest_settings
from otel_llm.processor.redaction.config import RedactionProcessor
from otel_llm.receiver.otlp.otlpjson import parse_otlp_json

REQUEST = Path(__file__).parent.parent / "service" / "testdata" / "gateway_vllm.json"


def test_the_engine_span_is_read_and_only_the_configured_keys_kept():
    request = parse_otlp_json(REQUEST.read_bytes())
    settings = digest_settings(LlmMetricsProcessor(), RedactionProcessor())
    local, local_counts = digest_in_process(request, settings)
    engine = next(s for s in local if s.observation is not None)
    raw = {kv.key: kv.value for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans
           if s.name == "llm_request" for kv in s.attributes}
    assert engine.observation.ttft_s == raw["gen_ai.latency.time_to_first_token"].double_value
    assert engine.observation.prompt_tokens == raw["gen_ai.usage.prompt_tokens"].int_value
    assert local_counts.matched == {"vllm_v1": 1}
    # Only the keys assembly reads are kept beside the bytes: the prompt is not among them.
    kept_keys = set(engine.attrs[::2])
    assert "gen_ai.prompt" not in kept_keys and kept_keys <= set(settings.kept_attribute_keys)


def test_attribute_limits_truncate_and_count():
    request = parse_otlp_json(REQUEST.read_bytes())
    prompt = next(kv.value.string_value for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans
                  for kv in s.attributes if kv.key == "gen_ai.prompt")
    limit = len(prompt.encode()) // 2
    settings = digest_settings(LlmMetricsProcessor(), RedactionProcessor(max_attribute_value_bytes=limit))
    spans, counts = digest_in_process(request, settings)
    assert counts.truncated == 1  # the one span with a value over the limit
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    engine = next(s for s in spans if s.observation is not None)
    parsed = Span()
    parsed.ParseFromString(engine.payload)
    value = next(kv.value.string_value for kv in parsed.attributes if kv.key == "gen_ai.prompt")
    assert len(value.encode()) <= limit and prompt.startswith(value)
