"""Malformed, oversized and absurd input: each gets a clear refusal or a counted reason, nothing bad
reaches a histogram, and the server keeps serving everyone else."""

from __future__ import annotations

import base64
import gzip
import json
import math
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request

import grpc
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from otel_llm_simulate.emitters import RequestTiming, emit_vllm_v1, engine_tracer_provider

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def grpc_raw(server, payload: bytes) -> bytes:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        return channel.unary_unary(EXPORT)(payload, timeout=10)


def http_post(server, body: bytes, content_type="application/x-protobuf", encoding=None, path="/v1/traces"):
    headers = {"Content-Type": content_type}
    if encoding:
        headers["Content-Encoding"] = encoding
    request = urllib.request.Request(f"http://127.0.0.1:{server.http_port}{path}", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers


def vllm_request_proto(ttft=0.5, queue=0.1, prefill=0.3, decode=2.0, e2e=2.6) -> ExportTraceServiceRequest:
    """A vLLM V1 span built directly as protobuf, for values the SDK path can't carry."""
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id = os.urandom(16)
    span.span_id = os.urandom(8)
    span.name = "llm_request"
    span.kind = 2  # SERVER
    span.start_time_unix_nano = time.time_ns()
    span.end_time_unix_nano = span.start_time_unix_nano + 10**9
    for key, value in (("time_to_first_token", ttft), ("time_in_queue", queue), ("time_in_model_prefill", prefill),
                       ("time_in_model_decode", decode), ("e2e", e2e)):
        kv = span.attributes.add()
        kv.key = "gen_ai.latency." + key
        kv.value.double_value = value
    return request


def assert_still_serving(server) -> None:
    """A good request after the bad ones is measured."""
    before = server.scrape().value("otel_llm_requests_assembled_total")
    provider = engine_tracer_provider("vllm-v1", server.exporter("grpc"), service_name="healthy")
    emit_vllm_v1(provider, RequestTiming(time.time_ns(), 0.01, 0.1, 0.2, 1.0), request_id="ok")
    server.wait_for_requests(int(before) + 1)


def test_grpc_random_bytes_and_truncated_protobuf_are_invalid_argument(server):
    rng = random.Random(1)
    good = vllm_request_proto().SerializeToString()
    for payload in [bytes(rng.getrandbits(8) for _ in range(200)), good[: len(good) // 2], b"\xff" * 64]:
        with pytest.raises(grpc.RpcError) as info:
            grpc_raw(server, payload)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed" in info.value.details()
    assert server.scrape().value("otel_llm_receiver_refused_requests_total", protocol="grpc", reason="malformed") == 3
    assert_still_serving(server)


def test_grpc_oversized_is_resource_exhausted(make_server):
    server = make_server({"receivers": {"otlp": {"protocols": {"grpc": {"max_recv_msg_size_mib": 1}}}}})
    with pytest.raises(grpc.RpcError) as info:
        grpc_raw(server, b"\x00" * (2 * 1024 * 1024))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_still_serving(server)


@pytest.mark.parametrize(
    "body,content_type,encoding,status,reason",
    [
        (b"\x0a\xff\xff\xff\xff\x0f", "application/x-protobuf", None, 400, "malformed"),
        (b"not json at all", "application/json", None, 400, "malformed"),
        (b'{"resourceSpans": {"not": "a list"}}', "application/json", None, 400, "malformed"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', "application/json", None, 400,
         "malformed"),
        (b'[1, 2, 3]', "application/json", None, 400, "malformed"),
        (b"\x1f\x8b\x08\x00garbage", "application/x-protobuf", "gzip", 400, "malformed"),
        (b"{}", "text/plain", None, 415, "unsupported_media_type"),
        (b"{}", "application/x-protobuf", "br", 415, "unsupported_encoding"),
    ],
    ids=["bad-protobuf", "bad-json", "wrong-json-shape", "bad-hex-id", "json-array", "bad-gzip", "text-plain",
         "brotli"],
)
def test_http_bad_bodies_get_status_and_reason(server, body, content_type, encoding, status, reason):
    code, payload, headers = http_post(server, body, content_type, encoding)
    assert code == status
    if headers["Content-Type"] == "application/x-protobuf":
        message = status_pb2.Status.FromString(payload).message
    else:
        message = json.loads(payload)["message"]
    assert message, "the refusal must say why"
    assert server.scrape().value("otel_llm_receiver_refused_requests_total", protocol="http", reason=reason) == 1
    assert_still_serving(server)


def test_http_oversized_and_gzip_bomb_are_413(make_server):
    server = make_server({"receivers": {"otlp": {"protocols": {"http": {"max_request_body_size": 100_000}}}}})
    code, _, _ = http_post(server, b"\x00" * 200_000)
    assert code == 413
    bomb = gzip.compress(b"\x00" * 50_000_000)  # 49 KB on the wire, 50 MB inflated
    assert len(bomb) < 100_000
    code, payload, _ = http_post(server, bomb, encoding="gzip")
    assert code == 413
    assert "exceeds" in status_pb2.Status.FromString(payload).message
    assert server.scrape().value("otel_llm_receiver_refused_requests_total", reason="too_large") == 2
    assert_still_serving(server)


def test_http_wrong_path_and_method(server):
    assert http_post(server, b"", path="/v1/profiles")[0] == 404
    assert http_post(server, b"", path="/v1/metrics")[0] == 200  # accepted, counted, dropped (test_other_signals.py)
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v1/traces", timeout=5)
    assert info.value.code == 405


def test_otlp_json_with_hex_ids_is_measured(server):
    span = {
        "traceId": os.urandom(16).hex(), "spanId": os.urandom(8).hex(), "name": "llm_request", "kind": 2,
        "startTimeUnixNano": str(time.time_ns()), "endTimeUnixNano": str(time.time_ns() + 10**9),
        "attributes": [
            {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": 0.3}},
            {"key": "gen_ai.latency.e2e", "value": {"doubleValue": 1.2}},
            {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": "11"}},
            {"key": "gen_ai.response.model", "value": {"stringValue": "json-model"}},
        ],
    }
    body = json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "json-svc"}}]},
        "scopeSpans": [{"spans": [span]}]}]}).encode()
    code, payload, headers = http_post(server, gzip.compress(body), "application/json", "gzip")
    assert code == 200 and headers["Content-Type"] == "application/json"
    scrape = server.wait_for_requests(1)
    assert scrape.value("vllm:time_to_first_token_seconds_count", model_name="json-model", service_name="json-svc") == 1
    assert scrape.buckets("vllm:time_to_first_token_seconds", model_name="json-model")["0.25"] == 0
    assert scrape.buckets("vllm:time_to_first_token_seconds", model_name="json-model")["0.5"] == 1


def test_invalid_ids_are_rejected_as_partial_success(server):
    request = vllm_request_proto()
    bad = request.resource_spans[0].scope_spans[0].spans.add()
    bad.CopyFrom(request.resource_spans[0].scope_spans[0].spans[0])
    bad.trace_id = b"\x01" * 8  # 8 bytes: not a valid OTLP trace id
    bad.span_id = os.urandom(8)
    zero = request.resource_spans[0].scope_spans[0].spans.add()
    zero.CopyFrom(bad)
    zero.trace_id = b"\x00" * 16
    response = ExportTraceServiceResponse.FromString(grpc_raw(server, request.SerializeToString()))
    assert response.partial_success.rejected_spans == 2
    assert "trace_id" in response.partial_success.error_message
    request.resource_spans[0].scope_spans[0].spans[0].trace_id = os.urandom(16)  # a new request, not a replay
    code, payload, _ = http_post(server, request.SerializeToString())
    assert code == 200
    assert ExportTraceServiceResponse.FromString(payload).partial_success.rejected_spans == 2
    scrape = server.wait_for_requests(2)  # the valid span of each request is still measured
    assert scrape.value("otel_llm_receiver_refused_spans_total", reason="invalid_id") == 4


@pytest.mark.parametrize(
    "values,reason",
    [
        ({"ttft": math.nan}, "nan_latency"),
        ({"e2e": math.inf}, "infinite_latency"),
        ({"queue": -0.5}, "negative_latency"),
        ({"decode": 1e30, "e2e": 1e30}, "absurd_latency"),
        ({"ttft": 3.0}, "inconsistent_latency"),  # ttft > e2e
    ],
)
def test_absurd_latencies_are_counted_never_observed(server, values, reason):
    grpc_raw(server, vllm_request_proto(**values).SerializeToString())
    scrape = server.wait_until(lambda s: s.value("otel_llm_spans_malformed_total", reason=reason) == 1, what=reason)
    assert scrape.value("vllm:e2e_request_latency_seconds_count") == 0
    assert scrape.value("vllm:time_to_first_token_seconds_count") == 0
    assert_still_serving(server)


def test_string_latency_and_attribute_free_span(server):
    provider = engine_tracer_provider("vllm-v1", server.exporter("http"), service_name="weird")
    tracer = provider.get_tracer("vllm.tracing.otel")
    from opentelemetry.trace import SpanKind

    tracer.start_span("llm_request", kind=SpanKind.SERVER).end()
    tracer.start_span("llm_request", kind=SpanKind.SERVER,
                      attributes={"gen_ai.latency.e2e": "fast", "gen_ai.latency.time_to_first_token": 0.1}).end()
    scrape = server.wait_until(lambda s: s.value("otel_llm_spans_malformed_total") == 2)
    assert scrape.value("otel_llm_spans_malformed_total", reason="missing_latency") == 1
    assert scrape.value("otel_llm_spans_malformed_total", reason="non_numeric_latency") == 1
    assert scrape.value("vllm:e2e_request_latency_seconds_count") == 0
    assert_still_serving(server)


def test_resource_attributes_are_bounded_like_span_attributes(make_server):
    """10 000 resource attributes (and one huge value) are cut to the span limits before buffering:
    every buffered span shares its resource, so an unbounded one would be held per request."""
    from otel_llm.processor.llm_metrics.digest import digest_in_process
    from tests.support.payloads import vllm_batch

    server = make_server({"processors": {"redaction": {"max_attributes_per_span": 64,
                                                       "max_attribute_value_bytes": 1024}}})
    request = vllm_batch(3, model="fat-resource")
    resource = request.resource_spans[0].resource
    for index in range(10_000):
        kv = resource.attributes.add()
        kv.key, kv.value.string_value = f"k{index}", "v" * (5000 if index == 0 else 8)
    body = request.SerializeToString()  # the stage trims in place
    spans, counts = digest_in_process(request, server.service.pipeline.digest_settings)
    assert counts.truncated == 3
    kept = spans[0].resource.attributes
    assert len(kept) == 64 and max(len(kv.value.string_value) for kv in kept) == 1024
    assert spans[0].service_name == "raw"  # service.name came first and survived
    assert http_post(server, body)[0] == 200
    scrape = server.wait_for_requests(3)
    assert scrape.value("otel_llm_spans_truncated_total") == 3
    assert scrape.value("vllm:request_success_total", model_name="fat-resource") == 3


def _with_service(request: ExportTraceServiceRequest, service: str) -> ExportTraceServiceRequest:
    kv = request.resource_spans[0].resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", service
    return request


def test_two_clocks_leave_an_interval_not_measurable_and_the_request_counted(server):
    """A live vLLM's TTFT and e2e are the API server's timestamps, decode the engine core's: their
    difference (postprocess) is negative for about half of real requests. The request is measured with
    every value the engine reported; the derived interval is not measurable, counted per service."""
    # e2e - ttft - decode = 2.6 - 0.5 - 2.2 = -0.1 s; queue + prefill 0.6 > ttft 0.5: preprocess -0.1 s
    grpc_raw(server, _with_service(vllm_request_proto(queue=0.2, prefill=0.4, decode=2.2), "two-clocks")
             .SerializeToString())
    grpc_raw(server, _with_service(vllm_request_proto(ttft=3.0), "broken").SerializeToString())  # TTFT after e2e
    scrape = server.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") == 1
                               and s.value("otel_llm_spans_malformed_total") == 1, what="one measured, one refused")
    labels = {"model_name": "two-clocks", "service_name": "two-clocks"}
    assert scrape.value("vllm:e2e_request_latency_seconds_sum", **labels) == 2.6
    assert scrape.value("vllm:request_decode_time_seconds_sum", **labels) == 2.2
    assert scrape.value("vllm:request_queue_time_seconds_sum", **labels) == 0.2
    assert scrape.value("vllm:time_to_first_token_seconds_sum", **labels) == 0.5
    assert scrape.value("otel_llm_service_unmeasured_total", service_name="two-clocks",
                        reason="not_measurable_postprocess") == 1
    assert scrape.value("otel_llm_service_unmeasured_total", service_name="two-clocks",
                        reason="not_measurable_preprocess") == 1
    assert scrape.value("otel_llm_service_unmeasured_total", service_name="broken", reason="inconsistent_latency") == 1
    assert scrape.value("otel_llm_spans_malformed_total", reason="inconsistent_latency") == 1
    # Neither segment is drawn or observed for that request; the others are.
    assert scrape.value("otel_llm_request_segment_seconds_count", segment="postprocess") == 0
    assert scrape.value("otel_llm_request_segment_seconds_count", segment="decode") == 1

    # Where users look: the CLI summary lists, per service, what was counted and what was not.
    out = subprocess.run([sys.executable, "-m", "otel_llm", "summary", "--api", server.metrics_url],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()[1:]}
    assert lines["two-clocks"].split()[1:4] == ["vllm", "1", "0"]
    assert "postprocess 1" in lines["two-clocks"] and "preprocess 1" in lines["two-clocks"]
    assert lines["broken"].split()[1:5] == ["-", "0", "1", "inconsistent_latency"]


def test_summary_shows_hostile_service_names_inert(server):
    grpc_raw(server, _with_service(vllm_request_proto(), "evil\x1b[2J\nname").SerializeToString())
    server.wait_for_requests(1)
    out = subprocess.run([sys.executable, "-m", "otel_llm", "summary", "--api", server.metrics_url],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "\x1b" not in out.stdout and len(out.stdout.splitlines()) == 2, out.stdout
    assert "evil\\x1b[2J\\nname" in out.stdout


@pytest.mark.parametrize("protocol", ["grpc", "http", "http/json"])
def test_a_90_level_nested_attribute_is_cut_not_a_400(server, protocol):
    """A 90-level nested attribute map on one span of two exceeds the protobuf decoder's depth: the
    value is cut at 16 levels (counted), and both spans are admitted and measured, not the whole
    request refused with a 400 / INVALID_ARGUMENT."""
    from tests.support.payloads import vllm_batch

    request = vllm_batch(2)
    kv = request.resource_spans[0].scope_spans[0].spans[0].attributes.add()
    kv.key = "deep"
    value = kv.value
    for level in range(90):
        inner = value.kvlist_value.values.add()
        inner.key = f"level{level}"
        value = inner.value
    value.string_value = "bottom"
    payload = request.SerializeToString()
    if protocol == "grpc":
        grpc_raw(server, payload)
    elif protocol == "http":
        assert http_post(server, payload)[0] == 200
    else:  # OTLP/JSON: ids in hex, as the spec writes them; the parser's recursion bound was the 400
        document = json_format.MessageToDict(request)
        for span in document["resourceSpans"][0]["scopeSpans"][0]["spans"]:
            for key in ("traceId", "spanId"):
                span[key] = base64.b64decode(span[key]).hex()
        assert http_post(server, json.dumps(document).encode(), content_type="application/json")[0] == 200
    scrape = server.wait_for_requests(2)
    assert scrape.value("otel_llm_receiver_cut_values_total", protocol=protocol.split("/")[0]) == 1
    assert scrape.value("otel_llm_receiver_accepted_spans_total") == 2
    assert scrape.value("otel_llm_receiver_refused_requests_total") == 0
