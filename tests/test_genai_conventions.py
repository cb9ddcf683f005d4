"""The GenAI conventions version switch (``processors.llm_metrics.namings.gen_ai_version``) and the
overflow label as the OTel SDKs write it.

Spans are the real openai-v2 instrumentation's (``tests/testdata/emitters``, openai_v2_span_only:
opentelemetry-instrumentation-openai-v2 2.4b0 on openai 3.57), replayed over OTLP/HTTP into a real
otel-llm; the usage-detail keys a provider's cache and reasoning counts add are set on them as each
convention version names them (semconv v1.41.0 ``gen-ai-spans.md``: ``gen_ai.usage.cache_read.input_tokens``,
``gen_ai.usage.cache_creation.input_tokens``, ``gen_ai.usage.reasoning.output_tokens``;
semantic-conventions-genai v0.1.0: ``cache_creation`` renamed ``cache_write`` (genai #440);
research/genai-semconv.md §2a-2b). Expected names are written out here from the conventions
(research/genai-semconv.md §1d, §4b; research/field-2026.md §1.1), expected values summed from the
spans as sent.
"""

from __future__ import annotations

import time

import pytest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from otel_llm.config import ConfigError, config_from_dict
from tests.support.captures import (
    Replay,
    attribute,
    duration_s,
    earliest_start_ns,
    post,
    shifted,
    spans_of,
    trace_requests,
)
from tests.support.otelllm import RunningServer

CAPTURE = "openai_v2_span_only"  # 5 calls: chat, stream (both with usage), 500, 400, connection error
# The v0.1.0 names (client-inference.md @v0.1.0) as the OTLP->Prometheus rules expose them.
V01_HISTOGRAMS = ("gen_ai_client_inference_duration_seconds", "gen_ai_client_inference_time_to_first_chunk_seconds")
V01_COUNTERS = {
    "gen_ai_client_inference_usage_input_tokens_total": "gen_ai.usage.input_tokens",
    "gen_ai_client_inference_usage_output_tokens_total": "gen_ai.usage.output_tokens",
    "gen_ai_client_inference_usage_cache_read_input_tokens_total": "gen_ai.usage.cache_read.input_tokens",
    "gen_ai_client_inference_usage_cache_write_input_tokens_total": "cache_write",  # either version's key
    "gen_ai_client_inference_usage_reasoning_output_tokens_total": "gen_ai.usage.reasoning.output_tokens",
}
V141_FAMILIES = ("gen_ai_client_operation_duration_seconds_count", "gen_ai_client_token_usage_count")
# Usage details per answered call: (cache_read, cache write, reasoning) and the key the write uses.
DETAILS = [(16, 5, 3, "gen_ai.usage.cache_creation.input_tokens"),  # a v1.41.0 emitter
           (8, 2, 4, "gen_ai.usage.cache_write.input_tokens")]  # a v0.1.0 emitter


def _with_usage_details() -> list:
    """The capture's requests, the two answered calls given the usage details of ``DETAILS``."""
    requests = shifted(trace_requests(CAPTURE), time.time_ns() - earliest_start_ns(trace_requests(CAPTURE)))
    answered = [span for span in spans_of(requests) if attribute(span, "gen_ai.usage.input_tokens") is not None]
    assert len(answered) == len(DETAILS) == 2
    for span, (read, write, reasoning, write_key) in zip(answered, DETAILS):
        for key, value in (("gen_ai.usage.cache_read.input_tokens", read), (write_key, write),
                           ("gen_ai.usage.reasoning.output_tokens", reasoning)):
            kv = KeyValue(key=key)
            kv.value.int_value = value
            span.attributes.append(kv)
    return requests


def _send(server: RunningServer) -> Replay:
    requests = _with_usage_details()
    for request in requests:
        assert post(server, request) == 200
    return Replay(requests, 0)


def _settled(server: RunningServer, family: str, calls: int):
    return server.wait_until(lambda s: s.value(family) >= calls and s.value("otel_llm_traces_in_memory") == 0,
                             timeout_s=30, what=f"{calls} client calls in {family}")


def test_version_0_1_emits_the_standalone_release_names_from_spans_of_either_version(make_server):
    server = make_server({"processors": {"llm_metrics": {"namings": {"gen_ai": True, "gen_ai_version": "0.1"}}}})
    sent = _send(server)
    spans = sent.spans
    scrape = _settled(server, "gen_ai_client_inference_duration_seconds_count", len(spans))
    # Every call is an inference operation: its duration under the v0.1.0 name, none under v1.41's.
    assert scrape.value("gen_ai_client_inference_duration_seconds_count") == len(spans) == 5
    assert scrape.value("gen_ai_client_inference_duration_seconds_sum") == pytest.approx(
        sum(duration_s(span) for span in spans))
    for family in V141_FAMILIES:
        assert family.replace("_count", "") not in scrape.text, family
    # Usage counters: the sums of the attributes as sent, cache writes under either version's key.
    expected = {
        name: sum(attribute(span, key) or 0 for span in spans) if key != "cache_write" else
        sum((attribute(span, "gen_ai.usage.cache_write.input_tokens") or 0)
            + (attribute(span, "gen_ai.usage.cache_creation.input_tokens") or 0) for span in spans)
        for name, key in V01_COUNTERS.items()}
    assert expected["gen_ai_client_inference_usage_cache_write_input_tokens_total"] == 5 + 2
    for name, total in expected.items():
        assert total > 0 and scrape.value(name) == total, name
        # gen_ai.token.modality is Required in v0.1.0; spans give one total per kind: "unknown".
        assert {ls.get("gen_ai_token_modality") for ls in scrape.label_sets(name)} == {"unknown"}, name
        assert scrape.value(name, gen_ai_request_model="gpt-4o-mini", gen_ai_provider_name="openai") == total
    # The three gen_ai.server.* keep their names in v0.1.0; client spans never reach them.
    assert "gen_ai_server_request_duration_seconds" in scrape.text
    assert scrape.value("gen_ai_server_request_duration_seconds_count") == 0
    print("v0.1 sample lines:\n" + "\n".join(
        line for line in scrape.text.splitlines()
        if line.startswith(("gen_ai_client_inference_usage_cache_write_input_tokens_total{",
                            "gen_ai_client_inference_duration_seconds_count{"))))


def test_default_stays_1_41_and_the_v0_1_names_are_absent(make_server):
    server = make_server({"processors": {"llm_metrics": {"namings": {"gen_ai": True}}}})
    sent = _send(server)
    scrape = _settled(server, "gen_ai_client_operation_duration_seconds_count", len(sent.spans))
    assert scrape.value("gen_ai_client_operation_duration_seconds_count") == 5
    assert scrape.value("gen_ai_client_token_usage_sum", gen_ai_token_type="input") == sum(
        attribute(span, "gen_ai.usage.input_tokens") or 0 for span in sent.spans)
    assert "gen_ai_client_inference" not in scrape.text


@pytest.mark.parametrize("namings,version", [({"gen_ai": True}, "1.41"), ({"gen_ai_version": 0.1}, "0.1"),
                                             ({"gen_ai_version": "1.41"}, "1.41")])
def test_config_accepts_the_known_versions_and_the_old_boolean(namings, version):
    config = config_from_dict({"processors": {"llm_metrics": {"namings": namings}}})
    assert config.processors.llm_metrics.namings.gen_ai_version == version  # YAML's bare 0.1 is a float


@pytest.mark.parametrize("value", ["1.42", "0.2", "v0.1.0", "latest", 1.4])
def test_config_refuses_an_unknown_version_naming_the_path_and_the_choices(value):
    with pytest.raises(ConfigError) as error:
        config_from_dict({"processors": {"llm_metrics": {"namings": {"gen_ai_version": value}}}})
    message = str(error.value)
    assert "processors.llm_metrics.namings.gen_ai_version" in message
    assert "'1.41'" in message and "'0.1'" in message and repr(str(value)) in message


def test_config_refuses_a_version_for_a_naming_that_is_off():
    with pytest.raises(ConfigError) as error:
        config_from_dict({"processors": {"llm_metrics": {"namings": {"gen_ai": False, "gen_ai_version": "0.1"}}}})
    assert "processors.llm_metrics.namings.gen_ai_version" in str(error.value)
    assert "applies only with namings.gen_ai: true" in str(error.value)


def test_overflow_series_carries_the_sdk_label_on_metrics(make_server):
    """``series_limit: 1``: the second model's series is the overflow series, labelled
    ``otel_metric_overflow="true"`` (``otel.metric.overflow`` escaped, as spanmetrics' and the SDKs'
    are in Prometheus), never the old ``otel_llm_overflow``."""
    server = make_server({"processors": {"llm_metrics": {"series_limit": 1,
                                                          "namings": {"gen_ai_version": "0.1"}}}})
    _send(server)
    scrape = _settled(server, "gen_ai_client_inference_duration_seconds_count", 5)
    # 5 calls; model labels differ (with and without a response model, errors): past the first, overflow.
    overflowed = scrape.value("gen_ai_client_inference_duration_seconds_count", otel_metric_overflow="true")
    own = scrape.value("gen_ai_client_inference_duration_seconds_count") - overflowed
    assert overflowed > 0 and own > 0 and own + overflowed == 5
    assert "otel_llm_overflow" not in scrape.text
    assert scrape.value("otel_llm_series_overflow_total",
                        metric="gen_ai_client_inference_duration_seconds") == overflowed
