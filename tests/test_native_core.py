"""The compiled core (``otel_llm._core``, ``rust/``) against the Python reference it replaces.

Every engine fixture, every emitter and SGLang capture and a sample of the bench's workload go
through the adapter stage on both paths (``OTEL_LLM_CORE`` forced per run) and must give the same
buffered spans, the same counts, and, end to end through a real pipeline with its SQLite store,
the same ``/metrics`` text and the same store rows. Hostile bytes must get the same verdict from
the core's decoder as from upb's parse into ``otlp_view`` (the Python path's), and a seeded
mutation run (bounded count) checks that no input crashes the core or gets another verdict.

Where the two legitimately differ, the comparison says so: the Python path buffers a span as the
view's re-serialization (upb's map puts attributes in hash order), the core as received, so span
attributes are compared as a mapping, never as an order.
"""

from __future__ import annotations

import gc
import json
import marshal
import math
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from otel_llm.internal import core as native_core
from otel_llm.pdata.attributes import any_value_to_python
from otel_llm.pdata.otlp_view import DESCRIPTOR as VIEW_DESCRIPTOR, ExportTraceServiceRequest as ViewRequest
from otel_llm.processor.llm_metrics import digest as digest_module
from otel_llm.processor.llm_metrics.digest import AttributeLimits, DigestSettings
from tests.support import engine_fixtures as F
from tests.support.cores import implementation
from tests.support.store_rows import store_rows

TESTDATA = Path(__file__).parent / "testdata"

try:
    from otel_llm import _core as extension  # type: ignore[attr-defined]
except ImportError as exc:  # pragma: no cover - only on a machine without Rust
    extension = None
    if os.environ.get(native_core.REQUIRE_ENV) == "1":
        raise AssertionError(f"{native_core.REQUIRE_ENV}=1 (make test) but the compiled core does not import: "
                             f"{exc}; is cargo on PATH at install time?") from None

pytestmark = pytest.mark.skipif(
    extension is None, reason="the compiled core is not built (no cargo at install): only the Python path exists "
                              "here, nothing to compare it with")


# --- the inputs -----------------------------------------------------------------------------------

def _fixture_requests() -> dict[str, bytes]:
    requests = {f"fixture:{name}": builder().SerializeToString() for name, builder in F.BUILDERS.items()}
    requests["fixture:dynamo_request_disagg"] = F.dynamo_request(disaggregated=True).SerializeToString()
    requests["fixture:llmd_mooncake"] = F.llmd_disaggregated(connector="mooncake").SerializeToString()
    requests["fixture:trtllm_serve_disaggregated"] = F.trtllm_serve_disaggregated().SerializeToString()
    variants = {
        "vllm_llm_request_old_keys": F.vllm_request_span(span_name_style="llm_request", token_keys="old"),
        "vllm_finish_reasons_array": F.vllm_request_span(finish_reasons_as="array"),
        "vllm_no_token_events": F.vllm_request_span(token_events=False, cached_tokens=None),
        "vllm_event_limit": F.vllm_request_span(decode_steps=(0.001,) * 200),
        # Malformed variants the adapters refuse (counted by reason): the refusal must match too.
        "vllm_out_of_order_events": F.shift_event(F.vllm_request_span(), "token_generated", 1.0, 1),
        "vllm_non_numeric_latency": F.set_attr(F.vllm_request_span(span_name_style="llm_request"), "llm_request",
                                               "gen_ai.latency.e2e", "fast"),
        "vllm_no_e2e": F.set_attr(F.vllm_request_span(span_name_style="llm_request"), "llm_request",
                                  "gen_ai.latency.e2e", None),
        "triton_no_queue_start": F.drop_events(F.triton_request(), ["QUEUE_START"]),
        "dynamo_without_worker": F.drop_spans(F.dynamo_request(), ["engine.generate"]),
    }
    requests.update({f"fixture:{name}": request.SerializeToString() for name, request in variants.items()})
    return requests


def _is_traces(path: Path) -> bool:
    """The emitters' captures hold their metrics and logs requests too (``*.metrics.N``, ``*.logs.N``)."""
    return ".metrics." not in path.name and ".logs." not in path.name


CAPTURE_FILES = sorted(TESTDATA.rglob("*.binpb"))


def _capture_requests() -> dict[str, bytes]:
    return {f"capture:{path.parent.name}/{path.name}": path.read_bytes() for path in CAPTURE_FILES if _is_traces(path)}


def _bench_requests() -> dict[str, bytes]:
    from bench.workload import generate
    return {f"bench:{index}": batch.payload for index, batch in enumerate(generate(2, seed=7, min_spans=200,
                                                                                     max_spans=300))}


def _edge_requests() -> dict[str, bytes]:
    """Shapes the fixtures do not have, built by hand: where a byte-level decoder could go wrong."""
    base = F.BUILDERS["vllm_request_span"]()
    out: dict[str, bytes] = {}
    # A repeated attribute key: the view keeps the last, plain OTLP both.
    dup = ExportTraceServiceRequest()
    dup.CopyFrom(base)
    span = dup.resource_spans[0].scope_spans[0].spans[0]
    extra = span.attributes.add()
    extra.key = span.attributes[0].key
    extra.value.string_value = "second value"
    out["edge:duplicate_key"] = dup.SerializeToString()
    # A span over the attribute limits (the settings below: 8 attributes, 64 bytes a value).
    big = ExportTraceServiceRequest()
    big.CopyFrom(base)
    span = big.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.add(key="long", value=AnyValue(string_value="x" * 500))
    span.events.add(name="e", time_unix_nano=span.start_time_unix_nano,
                    attributes=[KeyValue(key=f"k{i}", value=AnyValue(int_value=i)) for i in range(20)])
    span.links.add(trace_id=b"\x07" * 16, span_id=b"\x08" * 8,
                   attributes=[KeyValue(key=f"l{i}", value=AnyValue(int_value=i)) for i in range(20)])
    out["edge:over_limits"] = big.SerializeToString()
    # Fields written twice: scalars take the last, messages (status, resource, scope) merge.
    twice = ExportTraceServiceRequest()
    twice.CopyFrom(base)
    data = bytearray(twice.SerializeToString())
    resource_spans = twice.resource_spans[0]
    second = ExportTraceServiceRequest()
    rs = second.resource_spans.add()
    rs.resource.attributes.add(key="extra.resource.key", value=AnyValue(string_value="merged"))
    ss = rs.scope_spans.add()
    ss.scope.version = "9.9"
    sp = ss.spans.add()
    sp.CopyFrom(resource_spans.scope_spans[0].spans[0])
    sp.span_id = b"\x01" * 8
    sp.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR))
    status_again = Span(status=Status(message="only a message")).SerializeToString()
    kind_again = Span(kind=Span.SPAN_KIND_CLIENT, name="renamed").SerializeToString()
    span_bytes = sp.SerializeToString() + status_again + kind_again
    inner = (_ld(1, rs.resource.SerializeToString()) + _ld(1, b"") +  # the resource twice: merged
             _ld(2, _ld(1, ss.scope.SerializeToString()) + _ld(2, span_bytes) + _ld(1, b"\x0a\x03abc")))
    out["edge:fields_twice"] = bytes(data) + _ld(1, inner)
    # Unknown fields (a future field number) everywhere, and a known field with another wire type.
    unknown = bytearray(base.SerializeToString())
    out["edge:unknown_fields"] = bytes(unknown) + _ld(1, _ld(2, _ld(2, Span(name="u").SerializeToString()
                                                                     + b"\xf8\x01\x05" + b"\x30" + b"\x01"
                                                                     + b"\x2a\x00")) + b"\xa0\x06\x07")
    # A negative kind (an overlong 10-byte varint) and an empty request.
    out["edge:negative_kind"] = _ld(1, _ld(2, _ld(2, _ld(5, b"n") + b"\x30" + b"\xff" * 9 + b"\x01")))
    out["edge:empty"] = b""
    out.update(_vllm_v1_variants())
    out.update(_shape_variants())
    return out


VLLM_V1 = {  # otel_llm_simulate.emitters.emit_vllm_v1's attributes: what the core reads itself
    "gen_ai.latency.time_to_first_token": 0.25, "gen_ai.latency.e2e": 1.5, "gen_ai.latency.time_in_queue": 0.05,
    "gen_ai.usage.prompt_tokens": 120, "gen_ai.usage.completion_tokens": 40,
    "gen_ai.latency.time_in_model_prefill": 0.2, "gen_ai.latency.time_in_model_decode": 1.2,
    "gen_ai.latency.time_in_model_inference": 1.4, "gen_ai.request.id": "req-1", "gen_ai.request.max_tokens": 512,
    "gen_ai.request.model": "llama", "server.port": 8000,
}


def _vllm_v1_request(attributes: dict[str, Any], *, status: int = 0, events: int = 0, trace_state: str = "",
                     raw_attributes: bytes = b"") -> bytes:
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value=AnyValue(string_value="vllm-edge"))
    span = rs.scope_spans.add().spans.add(
        trace_id=bytes(range(1, 17)), span_id=b"\x05" * 8, name="llm_request", kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=1_700_000_000_000_000_000, end_time_unix_nano=1_700_000_001_500_000_000,
        trace_state=trace_state)
    span.attributes.extend(F.kv(attributes))
    span.status.code = status
    for index in range(events):
        span.events.add(name="token_generated", time_unix_nano=span.start_time_unix_nano + (index + 1) * 1000)
    data = bytearray(request.SerializeToString())
    if raw_attributes:  # appended to the one span: re-encode the three enclosing lengths
        span_bytes = span.SerializeToString() + raw_attributes
        scope = _ld(2, span_bytes)
        return _ld(1, _ld(1, rs.resource.SerializeToString()) + _ld(2, scope))
    return bytes(data)


def _vllm_v1_variants() -> dict[str, bytes]:
    """The shape the core reads itself, and every way out of it (each must match the Python adapter)."""
    def but(**changes: Any) -> dict[str, Any]:
        attributes = dict(VLLM_V1)
        for key, value in changes.items():
            key = key.replace("__", ".")
            if value is None:
                attributes.pop(key, None)
            else:
                attributes[key] = value
        return attributes

    lat = "gen_ai__latency__"
    variants = {
        "plain": _vllm_v1_request(VLLM_V1),
        "int_latency": _vllm_v1_request(but(**{lat + "e2e": 2})),
        "numeric_string_latency": _vllm_v1_request(but(**{lat + "time_in_queue": " 0.5e-1 "})),
        "text_latency": _vllm_v1_request(but(**{lat + "e2e": "slow"})),
        "bool_latency": _vllm_v1_request(but(**{lat + "time_in_model_decode": True})),
        "whole_double_tokens": _vllm_v1_request(but(gen_ai__usage__prompt_tokens=120.0)),
        "fractional_double_tokens": _vllm_v1_request(but(gen_ai__usage__prompt_tokens=120.5)),
        "new_token_keys": _vllm_v1_request(but(gen_ai__usage__prompt_tokens=None, gen_ai__usage__completion_tokens=None,
                                               gen_ai__usage__input_tokens=7, gen_ai__usage__output_tokens=9)),
        "double_port": _vllm_v1_request(but(server__port=8000.0)),
        "bool_model": _vllm_v1_request(but(gen_ai__request__model=True)),
        "array_model": _vllm_v1_request(but(gen_ai__request__model=["a", "b"])),
        "cached_and_address": _vllm_v1_request(but(**{"gen_ai__usage__cache_read__input_tokens": 64,
                                                      "server__address": "10.0.0.1"})),
        # Keys the Python adapter reads and the core does not: every one sends the span to Python.
        "cache_write": _vllm_v1_request(but(**{"gen_ai__usage__cache_creation__input_tokens": 16})),
        "sglang_cached_tokens": _vllm_v1_request(but(**{"gen_ai__usage__cached_tokens": 8})),
        "reasoning_tokens": _vllm_v1_request(but(**{"gen_ai__usage__reasoning__output_tokens": 5})),
        "spec_decode": _vllm_v1_request(but(**{"vllm__metrics__speculative_decoding__num_accepted_draft_tokens": 6,
                                               "vllm__metrics__speculative_decoding__num_draft_tokens": 9,
                                               "vllm__metrics__speculative_decoding__num_spec_steps": 3})),
        "spec_decode_incomplete": _vllm_v1_request(but(**{
            "vllm__metrics__speculative_decoding__num_spec_steps": 3})),
        "no_inference": _vllm_v1_request(but(**{lat + "time_in_model_inference": None})),
        "finish_reasons_json": _vllm_v1_request(but(gen_ai__response__finish_reasons='["length"]')),
        "error_status": _vllm_v1_request(VLLM_V1, status=Status.STATUS_CODE_ERROR),
        "token_events": _vllm_v1_request(VLLM_V1, events=3),
        "negative_e2e": _vllm_v1_request(but(**{lat + "e2e": -1.0})),
        "nan_ttft": _vllm_v1_request(but(**{lat + "time_to_first_token": float("nan")})),
        "huge_int_latency": _vllm_v1_request(but(**{lat + "e2e": 2**63 - 1})),
        "kept_key_array": _vllm_v1_request(but(error__type=["x"])),
        "kept_key_int": _vllm_v1_request(but(gen_ai__response__model=7)),
        "bad_trace_state": _vllm_v1_request(VLLM_V1, trace_state="ot=th:zz"),
        "sampled_trace_state": _vllm_v1_request(VLLM_V1, trace_state="ot=th:8"),
        # An attribute whose value sets two oneof fields (upb keeps the last), and one with no value.
        "two_oneofs": _vllm_v1_request(VLLM_V1, raw_attributes=_ld(9, _ld(1, b"gen_ai.request.model")
                                                                   + _ld(2, _ld(1, b"first") + b"\x18\x05"))),
        "empty_value": _vllm_v1_request(VLLM_V1, raw_attributes=_ld(9, _ld(1, b"gen_ai.operation.name") + _ld(2, b""))),
        "value_twice": _vllm_v1_request(VLLM_V1, raw_attributes=_ld(9, _ld(1, b"gen_ai.operation.name")
                                                                    + _ld(2, _ld(1, b"chat")) + _ld(2, b"\x18\x01"))),
    }
    return {f"edge:vllm_{name}": data for name, data in variants.items()}


def _span_request(name: str, kind: int, attributes: dict[str, Any], *, status: int = 0, events: int = 0,
                  trace_state: str = "") -> bytes:
    """One span of any name and kind in a request of its own (the shapes stage two reads in Rust)."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value=AnyValue(string_value="shape-edge"))
    span = rs.scope_spans.add().spans.add(
        trace_id=bytes(range(2, 18)), span_id=b"\x06" * 8, name=name, kind=kind,
        start_time_unix_nano=1_700_000_000_000_000_000, end_time_unix_nano=1_700_000_002_000_000_000,
        trace_state=trace_state)
    span.attributes.extend(F.kv(attributes))
    span.status.code = status
    for index in range(events):
        span.events.add(name="exception", time_unix_nano=span.start_time_unix_nano + (index + 1) * 1000,
                        attributes=F.kv({"exception.type": "openai.RateLimitError"}))
    return request.SerializeToString()


GATEWAY = {  # otel_llm_simulate.emitters.emit_gateway's attributes, with a time to first token
    "http.request.method": "POST", "http.route": "/v1/chat/completions", "url.path": "/v1/chat/completions",
    "url.scheme": "http", "http.response.status_code": 200, "server.address": "llm-gateway", "server.port": 4000,
    "gen_ai.operation.name": "chat", "gen_ai.request.model": "llama", "gen_ai.server.time_to_first_token": 0.3,
}
SGLANG_ROOT = {  # emit_sglang's root at the end of a request
    "rid": "abc", "module": "sglang::request", "gen_ai.usage.completion_tokens": 40,
    "gen_ai.usage.prompt_tokens": 120, "gen_ai.usage.cached_tokens": 16, "gen_ai.request.id": "abc",
    "gen_ai.request.max_tokens": 256, "gen_ai.response.model": "deepseek", "gen_ai.response.finish_reasons": '["stop"]',
    "gen_ai.latency.time_to_first_token": 0.2, "gen_ai.latency.e2e": 1.5, "gen_ai.latency.time_in_model_decode": 1.1,
    "gen_ai.latency.time_in_model_inference": 1.3, "gen_ai.latency.time_in_model_prefill": 0.25,
}
TGI_HANDLER = {  # emit_tgi's handler span on success: Rust Duration Debug text
    "parameters": "GenerateParameters { .. }", "total_time": "1.502345ms", "validation_time": "120.5µs",
    "queue_time": "3ms", "inference_time": "1.2s", "time_per_token": "30ms", "seed": "None",
}


def _changed(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    attributes = dict(base)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            attributes.pop(key, None)
        else:
            attributes[key] = value
    return attributes


def _shape_variants() -> dict[str, bytes]:
    """Stage two's shapes (GenAI gateway/client, SGLang's root and stages, TGI's handler): each read
    by the core, and each way out of its reading (every one must match the Python adapters)."""
    server, client, internal = Span.SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT, Span.SPAN_KIND_INTERNAL
    error = Status.STATUS_CODE_ERROR
    gw = "POST /v1/chat/completions"
    fr = "gen_ai__response__finish_reasons"
    genai = {
        "plain": _span_request(gw, server, GATEWAY),
        "client": _span_request("chat llama", client, _changed(GATEWAY, gen_ai__provider__name="openai",
                                                               gen_ai__response__model="llama-3")),
        "internal_named": _span_request("chat llama", internal, GATEWAY),
        "internal_unnamed": _span_request("handler", internal, GATEWAY),  # may_be_llm: not a candidate
        "logfire_name": _span_request("Chat completion with 'llama'", internal, GATEWAY),
        "int_ttft": _span_request(gw, server, _changed(GATEWAY, gen_ai__server__time_to_first_token=1)),
        "string_ttft": _span_request(gw, server, _changed(GATEWAY, gen_ai__server__time_to_first_token="0.3")),
        "text_ttft": _span_request(gw, server, _changed(GATEWAY, gen_ai__server__time_to_first_token="soon")),
        "chunk_ttft_first": _span_request(gw, server, _changed(GATEWAY, gen_ai__response__time_to_first_chunk=0.1)),
        "error": _span_request(gw, server, _changed(GATEWAY, error__type="500"), status=error),
        "error_empty_type": _span_request(gw, server, _changed(GATEWAY, error__type=""), status=error),
        "error_no_type": _span_request(gw, server, GATEWAY, status=error),
        "error_exception_event": _span_request(gw, server, GATEWAY, status=error, events=1),
        "error_int_type": _span_request(gw, server, _changed(GATEWAY, error__type=500), status=error),
        "error_double_type": _span_request(gw, server, _changed(GATEWAY, error__type=5.0), status=error),
        "usage_all": _span_request(gw, client, _changed(GATEWAY, **{
            "gen_ai__usage__input_tokens": 10, "gen_ai__usage__prompt_tokens": 11, "gen_ai__usage__output_tokens": 5,
            "gen_ai__usage__cache_read__input_tokens": 4, "gen_ai__usage__cache_write__input_tokens": 3,
            "gen_ai__usage__reasoning__output_tokens": 2, "gen_ai__request__max_tokens": 64})),
        "usage_old_keys": _span_request(gw, client, _changed(GATEWAY, gen_ai__usage__prompt_tokens=11,
                                                             gen_ai__usage__completion_tokens=6,
                                                             gen_ai__usage__cache_creation__input_tokens=9)),
        "usage_unread_key": _span_request(gw, server, _changed(GATEWAY, gen_ai__usage__audio_tokens=3)),
        "usage_double": _span_request(gw, server, _changed(GATEWAY, gen_ai__usage__input_tokens=10.0)),
        "usage_string": _span_request(gw, server, _changed(GATEWAY, gen_ai__usage__input_tokens="10")),
        "spec_decode": _span_request(gw, server, _changed(GATEWAY, **{
            "vllm__metrics__speculative_decoding__num_spec_steps": 3})),
        "provider_empty_then_system": _span_request(gw, server, _changed(GATEWAY, gen_ai__provider__name="",
                                                                         gen_ai__system="openai")),
        "provider_int": _span_request(gw, server, _changed(GATEWAY, gen_ai__provider__name=7)),
        "traceloop_type": _span_request("openai.chat", client, _changed(
            GATEWAY, gen_ai__operation__name=None, llm__request__type="completion")),
        "traceloop_unknown_type": _span_request("openai.chat", client, _changed(
            GATEWAY, gen_ai__operation__name=None, llm__request__type="rerank")),
        "response_model_only": _span_request(gw, server, {"gen_ai.response.model": "m"}),
        "double_port": _span_request(gw, server, _changed(GATEWAY, server__port=4000.0)),
        "bool_model": _span_request(gw, server, _changed(GATEWAY, gen_ai__request__model=False)),
        "array_model": _span_request(gw, server, _changed(GATEWAY, gen_ai__request__model=["a"])),
        "kept_key_array": _span_request(gw, server, _changed(GATEWAY, http__route=["a"])),
        "no_genai_keys": _span_request("GET /health", server, {"http.route": "/health", "url.path": "/health"}),
        "no_attributes": _span_request("GET", client, {}),
        "triton_name": _span_request("InferRequest", server, GATEWAY),
        "triton_model_key": _span_request(gw, server, _changed(GATEWAY, triton__model_name="m")),
        "module_array": _span_request(gw, server, _changed(GATEWAY, module=["sglang::request"])),
        "module_other": _span_request(gw, server, _changed(GATEWAY, module="auth")),
        "bad_trace_state": _span_request(gw, server, GATEWAY, trace_state="ot=th:zz"),
        "negative_ttft": _span_request(gw, server, _changed(GATEWAY, gen_ai__server__time_to_first_token=-1.0)),
        "absurd_tokens": _span_request(gw, client, _changed(GATEWAY, gen_ai__usage__output_tokens=10**9)),
        "negative_tokens": _span_request(gw, client, _changed(GATEWAY, gen_ai__usage__input_tokens=-1)),
        "absurd_ttft": _span_request(gw, server, _changed(GATEWAY, gen_ai__server__time_to_first_token=1e9)),
        "finish_json": _span_request(gw, server, _changed(GATEWAY, **{fr: '["length", "stop"]'})),
        "finish_json_spaced": _span_request(gw, server, _changed(GATEWAY, **{fr: '  [ "length" ,"stop" ]  '})),
        "finish_json_empty": _span_request(gw, server, _changed(GATEWAY, **{fr: "[]"})),
        "finish_json_broken": _span_request(gw, server, _changed(GATEWAY, **{fr: '["length"'})),
        "finish_json_number": _span_request(gw, server, _changed(GATEWAY, **{fr: "[1, \"stop\"]"})),
        "finish_json_escape": _span_request(gw, server, _changed(GATEWAY, **{fr: '["a\\"b"]'})),
        "finish_json_tab": _span_request(gw, server, _changed(GATEWAY, **{fr: '\t["stop"]'})),
        "finish_json_unicode": _span_request(gw, server, _changed(GATEWAY, **{fr: '["arrêt"]'})),
        "finish_json_trailing": _span_request(gw, server, _changed(GATEWAY, **{fr: '["stop"] x'})),
        "finish_bare": _span_request(gw, server, _changed(GATEWAY, **{fr: " stop "})),
        "finish_blank": _span_request(gw, server, _changed(GATEWAY, **{fr: "   "})),
        "finish_array": _span_request(gw, server, _changed(GATEWAY, **{fr: ["stop"]})),
    }
    sglang = {
        "plain": _span_request(" Req abc", internal, SGLANG_ROOT),
        "prefill_role": _span_request("prefill Req abc", internal, SGLANG_ROOT),
        "non_streaming": _span_request(" Req abc", internal, _changed(
            SGLANG_ROOT, gen_ai__latency__time_in_model_decode=0.0)),
        "non_streaming_one_token": _span_request(" Req abc", internal, _changed(
            SGLANG_ROOT, gen_ai__latency__time_in_model_decode=0.0, gen_ai__usage__completion_tokens=1)),
        "aborted": _span_request(" Req abc", internal, _changed(SGLANG_ROOT, **{fr: '["abort"]'}), status=error),
        "module_without_e2e": _span_request(" Req abc", internal, _changed(SGLANG_ROOT, gen_ai__latency__e2e=None)),
        "e2e_on_client": _span_request("call", client, _changed(SGLANG_ROOT, module=None)),
        "e2e_on_server_without_inference": _span_request("POST", server, _changed(
            SGLANG_ROOT, gen_ai__latency__time_in_model_inference=None)),
        "unread_usage_key": _span_request(" Req abc", internal, _changed(
            SGLANG_ROOT, gen_ai__usage__cache_read__input_tokens=4)),
        "string_latency": _span_request(" Req abc", internal, _changed(SGLANG_ROOT, gen_ai__latency__e2e="1.5")),
        "negative_e2e": _span_request(" Req abc", internal, _changed(SGLANG_ROOT, gen_ai__latency__e2e=-1.5)),
        "ttft_after_e2e": _span_request(" Req abc", internal, _changed(SGLANG_ROOT,
                                                                       gen_ai__latency__time_to_first_token=1.6)),
        "ttft_within_tolerance": _span_request(" Req abc", internal, _changed(
            SGLANG_ROOT, gen_ai__latency__time_to_first_token=1.51)),
        "stage": _span_request("prefill_forward", internal, {"thread_label": "Scheduler"}),
        "stage_as_server": _span_request("prefill_forward", server, {}),
    }
    tgi = {
        "generate": _span_request("generate", internal, TGI_HANDLER),
        "chat": _span_request("chat_completions", internal, TGI_HANDLER),
        "completions_on_server": _span_request("completions", server, TGI_HANDLER),
        "inner_no_fields": _span_request("generate_stream", internal, {}),
        "units": _span_request("generate", internal, _changed(TGI_HANDLER, total_time="12ns", queue_time="7us",
                                                             validation_time="4μs", inference_time="0.5s")),
        "spaced_duration": _span_request("generate", internal, _changed(TGI_HANDLER, total_time=" 1.5 ms ")),
        "trailing_newline": _span_request("generate", internal, _changed(TGI_HANDLER, total_time="1.5ms\n")),
        "bad_duration": _span_request("generate", internal, _changed(TGI_HANDLER, queue_time="fast")),
        "two_dots": _span_request("generate", internal, _changed(TGI_HANDLER, queue_time="1.2.3ms")),
        "no_fraction_digits": _span_request("generate", internal, _changed(TGI_HANDLER, queue_time="1.ms")),
        "int_duration": _span_request("generate", internal, _changed(TGI_HANDLER, total_time=5)),
        "minutes": _span_request("generate", internal, _changed(TGI_HANDLER, total_time="1m")),
        "error_without_fields": _span_request("generate", internal, {}, status=error),
        "error_with_type": _span_request("generate", internal, {"error.type": "oom"}, status=error),
        "error_with_event": _span_request("generate", internal, {}, status=error, events=1),
        "with_e2e": _span_request("generate", internal, _changed(TGI_HANDLER, gen_ai__latency__e2e=1.0)),
        "absurd_duration": _span_request("generate", internal, _changed(TGI_HANDLER, total_time="5000s")),
    }
    return {**{f"edge:genai_{k}": v for k, v in genai.items()}, **{f"edge:sglang_{k}": v for k, v in sglang.items()},
            **{f"edge:tgi_{k}": v for k, v in tgi.items()}}


def _ld(field: int, payload: bytes) -> bytes:
    return _varint((field << 3) | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


REQUESTS = {**_fixture_requests(), **_capture_requests(), **_edge_requests()}
SETTINGS = [
    DigestSettings(AttributeLimits(256, 16 * 1024), 3600.0,
                   ("gen_ai.request.model", "gen_ai.response.model", "http.route", "url.path", "error.type"),
                   frozenset({"first_token"})),
    DigestSettings(AttributeLimits(8, 64), 3600.0, ("gen_ai.request.model", "error.type"), frozenset()),
]


def test_the_inputs_cover_what_the_brief_names() -> None:
    kinds = {name.split(":", 1)[0] for name in REQUESTS}
    assert kinds == {"fixture", "capture", "edge"}
    with implementation("native"):  # the core reads the plain vLLM V1 span itself, not the Python adapter
        rows = extension.scan(REQUESTS["edge:vllm_plain"], ("gen_ai.request.model",))[1]
    assert rows[0][-1] == ("vllm_v1",
                           (0.25, 1.5, 0.05, 0.2, 1.2, 1.4, 120, 40, 512, "llama", None, None, None, "8000", None, None),
                           ("gen_ai.request.model", "llama"), False)  # no bounds given: not checked
    assert sum(name.startswith("capture:") for name in REQUESTS) == sum(map(_is_traces, CAPTURE_FILES)) >= 60
    assert sum(name.startswith("fixture:") for name in REQUESTS) == len(F.BUILDERS) + 2 + 9  # trtllm_serve_disaggregated is a builder already


def test_the_cores_schema_is_the_installed_protos() -> None:
    """The core knows each field by number; a proto upgrade adding one must fail here, not drift."""
    expected = {
        "ExportTraceServiceRequest": {1}, "ResourceSpans": {1, 2, 3}, "Resource": {1, 2, 3}, "EntityRef": {1, 2, 3, 4},
        "ScopeSpans": {1, 2, 3}, "InstrumentationScope": {1, 2, 3, 4}, "Span": set(range(1, 17)),
        "AttributesEntry": {1, 2}, "Event": {1, 2, 3, 4}, "Link": {1, 2, 3, 4, 5, 6}, "Status": {2, 3},
        "KeyValue": {1, 2, 3}, "AnyValue": set(range(1, 9)), "ArrayValue": {1}, "KeyValueList": {1},
    }  # rust/src/lib.rs field_of(), spelled out
    seen: dict[str, set[int]] = {}

    def walk(message: Any) -> None:
        if message.name in seen:
            return
        seen[message.name] = {f.number for f in message.fields}
        for f in message.fields:
            if f.message_type is not None:
                walk(f.message_type)

    walk(VIEW_DESCRIPTOR.message_types_by_name["ExportTraceServiceRequest"])
    assert seen == expected


# --- the adapter stage, both paths ----------------------------------------------------------------

def _span_row(span: Any) -> tuple[Any, ...]:
    parsed = Span.FromString(span.payload)
    attributes = {kv.key: any_value_to_python(kv.value) for kv in parsed.attributes}
    del parsed.attributes[:]
    origin = span.origin
    return (span.trace_id, span.span_id, span.parent_span_id, span.kind, span.status_code, span.start_unix_ns,
            span.end_unix_ns, span.trace_state, parsed.SerializeToString(deterministic=True),
            json.dumps(attributes, sort_keys=True, default=repr), origin.resource.SerializeToString(deterministic=True),
            origin.scope.SerializeToString(deterministic=True), origin.service_name, origin.resource_strings,
            span.attrs, span.observation)


def _digest(data: bytes, settings: DigestSettings, validated: bool = False) -> tuple[Any, Any]:
    try:
        spans, counts = digest_module.digest_in_process(data, settings, validated)
    except DecodeError:
        return "refused", None
    return [_span_row(s) for s in spans], counts


# What the core reads itself (its shape name) and what it hands to the Python adapters (None): each
# variant's verdict, set by reading engines.py's rules, so a core that read nothing, or read past a
# value it cannot reproduce, fails here while the differential test alone would still pass.
CORE_READS = {
    **{f"genai_{name}": "genai" for name in (
        "plain", "client", "internal_named", "logfire_name", "int_ttft", "chunk_ttft_first", "error",
        "error_empty_type", "error_no_type", "error_int_type", "usage_all", "usage_old_keys",
        "provider_empty_then_system", "provider_int", "traceloop_type", "traceloop_unknown_type",
        "response_model_only", "bool_model", "module_other", "bad_trace_state", "negative_ttft", "absurd_tokens",
        "negative_tokens", "absurd_ttft", "finish_json",
        "finish_json_spaced", "finish_json_empty", "finish_bare", "finish_blank")},
    "genai_no_genai_keys": "none", "genai_no_attributes": "none",
    **{f"genai_{name}": None for name in (
        "internal_unnamed", "string_ttft", "text_ttft", "error_exception_event", "error_double_type",
        "usage_unread_key", "usage_double", "usage_string", "spec_decode", "double_port", "array_model",
        "kept_key_array", "triton_name", "triton_model_key", "module_array", "finish_json_broken",
        "finish_json_number", "finish_json_escape", "finish_json_tab", "finish_json_unicode", "finish_json_trailing",
        "finish_array")},
    **{f"sglang_{name}": "sglang" for name in (
        "plain", "prefill_role", "non_streaming", "non_streaming_one_token", "aborted", "module_without_e2e",
        "e2e_on_client", "negative_e2e", "ttft_after_e2e", "ttft_within_tolerance")},
    **{f"sglang_{name}": None for name in (
        "e2e_on_server_without_inference", "unread_usage_key", "string_latency", "stage")},
    "sglang_stage_as_server": "none",
    **{f"tgi_{name}": "tgi" for name in (
        "generate", "chat", "completions_on_server", "units", "error_without_fields", "error_with_type",
        "absurd_duration")},
    "tgi_inner_no_fields": "none", "tgi_with_e2e": "sglang",
    **{f"tgi_{name}": None for name in (
        "spaced_duration", "trailing_newline", "bad_duration", "two_dots", "no_fraction_digits", "int_duration",
        "minutes", "error_with_event")},
}


BOUNDS = (3600.0, 100_000_000, 1e-3, 0.01)  # segments.py's: max latency, max tokens, TTFT's tolerance over e2e


def _read_by_core(name: str, bounds: tuple[float, int, float, float] = BOUNDS) -> Any:
    return extension.scan(REQUESTS[f"edge:{name}"], SETTINGS[0].kept_attribute_keys, bounds)[1][0][-1]


def test_the_core_reads_stage_twos_shapes_itself_and_hands_the_rest_to_python() -> None:
    assert set(CORE_READS) == {name.removeprefix("edge:") for name in REQUESTS
                               if name.startswith(("edge:genai_", "edge:sglang_", "edge:tgi_"))}
    verdicts = {name: (_read_by_core(name) or (None,))[0] for name in CORE_READS}
    assert verdicts == CORE_READS
    # The values, computed from the attributes the variants were built with.
    route = "/v1/chat/completions"
    assert _read_by_core("genai_plain")[1:] == (
        (0.3, None, None, None, "llama", None, None, "chat", None, "llm-gateway", "4000", False, None, None, None, None),
        ("gen_ai.request.model", "llama", "http.route", route, "url.path", route), True)
    assert _read_by_core("genai_usage_all")[1][1:4] == (10, 5, 64)
    assert _read_by_core("genai_usage_all")[1][13:] == (4, 3, 2)
    assert _read_by_core("genai_error_empty_type")[1][11:13] == (True, "_OTHER")
    assert _read_by_core("genai_finish_json_spaced")[1][6] == "length"
    assert _read_by_core("genai_finish_bare")[1][6] == "stop"
    assert _read_by_core("genai_traceloop_type")[1][7] == "text_completion"
    assert _read_by_core("genai_provider_empty_then_system")[1][8] == "openai"
    assert _read_by_core("sglang_plain")[1] == (0.2, 1.5, None, 1.1, 120, 40, 16, 0.25, 256, None, "deepseek", "stop",
                                                False, None)
    assert _read_by_core("sglang_non_streaming")[1][:4] == (None, 1.5, None, None)
    assert _read_by_core("sglang_aborted")[1][11:] == ("abort", True, "_OTHER")
    total, validation, queue, inference, operation, is_error, error_type = _read_by_core("tgi_generate")[1]
    assert (total, validation, queue, inference) == pytest.approx((1.502345e-3, 120.5e-6, 3e-3, 1.2), rel=1e-12)
    assert (operation, is_error, error_type) == ("text_completion", False, None)
    assert _read_by_core("tgi_chat")[1][4] == "chat"
    assert _read_by_core("tgi_units")[1][:4] == pytest.approx((12e-9, 4e-6, 7e-6, 0.5), rel=1e-12)
    assert _read_by_core("tgi_error_without_fields")[1] == (None, None, None, None, "text_completion", True, "_OTHER")


def test_the_cores_bounds_check_says_what_derive_timings_says() -> None:
    """The core's ``valid`` lets the adapter stage skip ``derive_timings``: it must be true exactly
    where the reference's ``derive_timings`` accepts the observation."""
    outcomes: dict[bool, int] = {True: 0, False: 0}
    for name in REQUESTS:
        if not name.startswith("edge:"):
            continue
        for row in extension.scan(REQUESTS[name], SETTINGS[0].kept_attribute_keys, BOUNDS)[1]:
            read = row[-1]
            if read is None or read[0] == "none":
                continue
            observation = digest_module._NATIVE_READINGS[read[0]](*read[1])
            try:
                digest_module.derive_timings(observation, BOUNDS[0])
                accepted = True
            except digest_module.MalformedSpan:
                accepted = False
            assert read[3] is accepted, name
            outcomes[accepted] += 1
    assert outcomes[True] >= 40 and outcomes[False] >= 10, outcomes


def test_a_request_of_shapes_the_core_reads_is_never_parsed_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage two's point: the bench's requests (vLLM, SGLang, TGI, gateways) never build the view."""
    parses: list[int] = []

    def counting_view() -> ViewRequest:
        parses.append(1)
        return ViewRequest()

    monkeypatch.setattr(digest_module, "ViewRequest", counting_view)
    bench = _bench_requests()
    with implementation("native"):
        for data in bench.values():
            spans, counts = digest_module.digest_in_process(data, SETTINGS[0])
            assert len(spans) >= 200 and counts.matched
        assert parses == []
        digest_module.digest_in_process(REQUESTS["fixture:triton_request"], SETTINGS[0])  # Python's adapters
    assert parses == [1]
    with implementation("python"):  # the reference parses every request
        digest_module.digest_in_process(next(iter(bench.values())), SETTINGS[0])
    assert parses == [1, 1]


def test_the_core_hands_back_the_bench_spans_ready_to_buffer() -> None:
    """Stage three: a span the core reads, skips or files by name comes back as a ``BufferedSpan``
    the core made, no Python step per span; a span over a limit still takes the Python steps. The
    objects it makes (the compact ``BufferedSpan`` and ``EngineObservation`` of ``rust/src/lib.rs``)
    equal the reference's field by field, each value of the same type."""
    assert extension is not None
    bench = _bench_requests()
    origins_made: list[int] = []

    def make_origins(rows: list[Any]) -> tuple[list[Any], None]:
        origins_made.append(len(rows))
        return digest_module._origins(rows, SETTINGS[0].limits)[1], None

    with implementation("native"):
        digester = digest_module._digester(extension, SETTINGS[0])
        for data in bench.values():
            _, spans, slow, matched, passed_through = digester.rows(data, False, make_origins)
            assert slow == [] and len(spans) >= 200
            assert all(type(span) is extension.BufferedSpan for span in spans)  # the compact row (lib.rs Row)
            assert sum(matched.values()) + passed_through == len(spans)
            with implementation("python"):
                reference, counts = digest_module.digest_in_process(data, SETTINGS[0])
            assert matched == counts.matched and passed_through == counts.passed_through
            for made, expected in zip(spans, reference, strict=True):
                assert _span_row(made) == _span_row(expected)  # the payload: attributes in the order sent
                if expected.observation is not None:  # the core's compact observation (lib.rs Observation)
                    assert type(made.observation) in (extension.EngineObservation, type(expected.observation))
                    made_fields, expected_fields = made.observation.as_tuple(), expected.observation.as_tuple()
                    assert made_fields == expected_fields
                    assert [type(value) for value in made_fields] == [type(value) for value in expected_fields]
        assert len(origins_made) == len(bench)
        tight = digest_module._digester(extension, SETTINGS[1])
        slow_spans = tight.rows(REQUESTS["edge:over_limits"], False, make_origins)[2]
        assert slow_spans == [0]  # over 8 attributes: the Python path's trim


@pytest.mark.parametrize("settings", SETTINGS, ids=["default_limits", "tight_limits"])
def test_every_fixture_and_capture_digests_the_same_on_both_paths(settings: DigestSettings) -> None:
    compared = spans = 0
    for name, data in {**REQUESTS, **_bench_requests()}.items():
        with implementation("python"):
            reference = _digest(data, settings)
        with implementation("native"):
            native = _digest(data, settings)
            # As the pipeline reads bytes the receiver process's core validated: no second walk.
            unwalked = _digest(data, settings, validated=True) if reference[0] != "refused" else native
        assert native[0] == reference[0], name
        assert native[1] == reference[1], name
        assert unwalked == native, name
        compared += 1
        spans += len(reference[0]) if reference[0] != "refused" else 0
    assert compared == len(REQUESTS) + 2 and spans > 500


def test_a_memoryview_digests_the_same_on_both_paths() -> None:
    compared = 0
    for name, data in REQUESTS.items():
        results = []
        for path in ("python", "native"):
            with implementation(path):
                try:
                    # A memoryview (``RequestData``): the core reads it as bytes.
                    spans, counts = digest_module.digest_in_process(memoryview(data), SETTINGS[0],
                                                                    validated=path == "native")
                except DecodeError:
                    results.append("refused")
                else:
                    results.append(([_span_row(s) for s in spans], counts))
        assert results[0] == results[1], name
        compared += results[0] != "refused"
    assert compared == len(REQUESTS)  # every one of them is a valid trace request


def test_a_limit_trims_the_same_attributes_on_both_paths() -> None:
    data = REQUESTS["edge:over_limits"]
    with implementation("native"):
        spans, counts = digest_module.digest_in_process(data, SETTINGS[1])
    assert counts.truncated >= 1
    kept = Span.FromString(spans[0].payload)
    # The first 8 attributes in the order received (the Python path's rule), independently listed.
    received = ExportTraceServiceRequest.FromString(data).resource_spans[0].scope_spans[0].spans[0]
    assert sorted(kv.key for kv in kept.attributes) == sorted(kv.key for kv in received.attributes[:8])
    assert all(len(event.attributes) <= 8 for event in kept.events) and len(kept.events[-1].attributes) == 8
    assert [len(link.attributes) for link in kept.links] == [8]


def test_a_span_no_adapter_can_claim_is_buffered_as_received() -> None:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add(
        trace_id=b"\x11" * 16, span_id=b"\x22" * 8, name="SELECT users", kind=Span.SPAN_KIND_INTERNAL)
    for key in ("z", "a", "m"):
        span.attributes.add(key=key, value=AnyValue(string_value=key))
    data = request.SerializeToString()
    with implementation("native"):
        spans, counts = digest_module.digest_in_process(data, SETTINGS[0])
    assert counts.passed_through == 1 and spans[0].observation is None
    assert spans[0].payload == span.SerializeToString()  # the bytes received, attribute order kept


def _one_resource_request(service: str, labels: int) -> bytes:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="service.name", value=AnyValue(string_value=service))
    for i in range(labels):
        resource_spans.resource.attributes.add(key=f"k8s.pod.label.{i}", value=AnyValue(string_value=f"v{i}"))
    resource_spans.scope_spans.add().spans.add(
        trace_id=b"\x11" * 16, span_id=b"\x22" * 8, name="SELECT users", kind=Span.SPAN_KIND_INTERNAL)
    return request.SerializeToString()


def test_a_resources_strings_read_once_are_not_a_trimmed_resources() -> None:
    """The native path reads a resource's string attributes once per distinct bytes, but a resource
    the limits trim is read as trimmed, whatever was read of the same bytes before."""
    data = _one_resource_request("checkout", labels=12)
    with implementation("native"):
        generous, _ = digest_module.digest_in_process(data, SETTINGS[0])
        tight, counts = digest_module.digest_in_process(data, SETTINGS[1])
        again, _ = digest_module.digest_in_process(data, SETTINGS[0])
    with implementation("python"):
        reference, _ = digest_module.digest_in_process(data, SETTINGS[1])
    assert len(generous[0].origin.resource_strings) == 13 == len(again[0].origin.resource_strings)
    assert counts.truncated == 1
    assert len(tight[0].origin.resource_strings) == 8  # AttributeLimits(8, 64): the first 8 kept
    assert tight[0].origin.resource_strings == reference[0].origin.resource_strings


def test_the_resources_read_once_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digest_module, "RESOURCE_STRINGS_LIMIT", 4)
    monkeypatch.setattr(digest_module, "_resource_strings", {})
    services = [f"tenant-{i}" for i in range(10)]
    with implementation("native"):
        for service in services + services[:3]:
            spans, _ = digest_module.digest_in_process(_one_resource_request(service, labels=2), SETTINGS[0])
            assert spans[0].origin.service_name == service
            assert spans[0].origin.resource_strings["service.name"] == service
            assert len(digest_module._resource_strings) <= 4


# --- hostile input: the same verdict ------------------------------------------------------------

def _python_verdict(data: bytes) -> bool:
    try:
        ViewRequest.FromString(data)
    except DecodeError:
        return False
    return True


def _native_verdict(data: bytes) -> bool:
    assert extension is not None
    try:
        extension.validate(data)
    except ValueError:
        validated = False
    else:
        validated = True
    try:
        extension.scan(data)
    except ValueError:
        scanned = False
    else:
        scanned = True
    assert scanned == validated, data.hex()
    return validated


def _nested_value(depth: int) -> bytes:
    value = _ld(1, b"x")
    for _ in range(depth):
        value = _ld(5, _ld(1, value))  # AnyValue{array_value{values: [value]}}
    return _ld(1, _ld(2, _ld(2, _ld(5, b"d") + _ld(9, _ld(1, b"k") + _ld(2, value)))))


def _mixed_nesting(arrays: int, kvlists: int) -> bytes:
    """Values nested through arrays (two messages a level) and key-value lists (three a level)."""
    value = _ld(1, b"x")
    for _ in range(kvlists):
        value = _ld(6, _ld(1, _ld(1, b"k") + _ld(2, value)))
    for _ in range(arrays):
        value = _ld(5, _ld(1, value))
    return _ld(1, _ld(2, _ld(2, _ld(5, b"d") + _ld(9, _ld(1, b"k") + _ld(2, value)))))


def _group(depth: int, field: int = 9, close: int | None = None) -> bytes:
    """A group (wire type 3) on a Span field number: unknown there, so skipped, its nesting counted."""
    body = b""
    for _ in range(depth):
        body = _varint((field << 3) | 3) + body + _varint(((close or field) << 3) | 4)
    return _ld(1, _ld(2, _ld(2, _ld(5, b"d") + body)))


def _hostile() -> dict[str, bytes]:
    valid = REQUESTS["fixture:vllm_request_span"]
    out = {f"truncated_at_{cut}": valid[:cut] for cut in range(1, len(valid), 7)}
    out["length_past_end"] = _varint(0x0A) + _varint(1 << 40) + b"abc"
    out["length_overflows"] = b"\x0a" + b"\xff" * 9 + b"\x01"
    out["varint_11_bytes"] = _ld(1, _ld(2, _ld(2, b"\x30" + b"\x80" * 10 + b"\x01")))
    out["tag_over_32_bits"] = b"\x80\x80\x80\x80\x10\x00"
    out["field_number_0"] = b"\x02\x00"
    out["wire_type_6"] = b"\x0e"
    out["wire_type_7"] = b"\x0f"
    out["end_group_alone"] = b"\x0c"
    out["wrong_wire_type_resource_spans"] = b"\x08\x01"  # field 1 as a varint: unknown, accepted
    out["wrong_wire_type_span_name"] = _ld(1, _ld(2, _ld(2, b"\x28\x05")))
    out["invalid_utf8_name"] = _ld(1, _ld(2, _ld(2, _ld(5, b"\xff\xfe"))))
    out["invalid_utf8_attribute_key"] = _ld(1, _ld(2, _ld(2, _ld(9, _ld(1, b"\xc3\x28")))))
    out["invalid_utf8_in_bytes_field"] = _ld(1, _ld(2, _ld(2, _ld(1, b"\xff" * 16))))
    out["invalid_utf8_in_unknown_field"] = _ld(1, _ld(2, _ld(2, _ld(17, b"\xff"))))
    out["invalid_utf8_deep_value"] = _ld(1, _ld(2, _ld(2, _ld(9, _ld(2, _ld(6, _ld(1, _ld(1, b"\xff"))))))))
    out["invalid_utf8_resource"] = _ld(1, _ld(1, _ld(1, _ld(1, b"\xff"))))
    out["invalid_utf8_scope_name"] = _ld(1, _ld(2, _ld(1, _ld(1, b"\xff"))))
    for path in CAPTURE_FILES:  # a metrics or logs request sent to the traces endpoint
        if not _is_traces(path):
            out[f"not_traces:{path.name}"] = path.read_bytes()
    out["truncated_fixed64"] = _ld(1, _ld(2, _ld(2, b"\x39\x01\x02")))
    for depth in (10, 40, 47, 48, 49, 60, 200):
        out[f"nested_values_{depth}"] = _nested_value(depth)
    for depth in (1, 2, 50, 94, 95, 96, 97, 98, 120):
        out[f"nested_groups_{depth}"] = _group(depth)
    for arrays, kvlists in ((46, 1), (45, 2), (44, 1)):  # one level past, at and below upb's limit
        out[f"nested_mixed_{arrays}_{kvlists}"] = _mixed_nesting(arrays, kvlists)
    out["group_mismatched_end"] = _group(1, field=9, close=10)
    out["group_unterminated"] = _ld(1, _ld(2, _ld(2, b"\x4b")))
    return out


HOSTILE = _hostile()


def test_hostile_inputs_get_the_python_paths_verdict() -> None:
    refused = 0
    for name, data in HOSTILE.items():
        reference = _python_verdict(data)
        assert _native_verdict(data) == reference, name
        refused += not reference
    # What upb is known to do with these, stated independently of both implementations.
    assert _python_verdict(HOSTILE["wrong_wire_type_resource_spans"])
    assert _python_verdict(HOSTILE["invalid_utf8_in_bytes_field"])
    assert not _python_verdict(HOSTILE["invalid_utf8_deep_value"])
    assert _python_verdict(HOSTILE["nested_values_47"]) and not _python_verdict(HOSTILE["nested_values_48"])
    assert _python_verdict(HOSTILE["nested_mixed_46_1"]) and not _python_verdict(HOSTILE["nested_mixed_45_2"])
    assert _python_verdict(HOSTILE["nested_groups_97"]) and not _python_verdict(HOSTILE["nested_groups_98"])
    assert refused >= len(HOSTILE) // 2


def test_a_refused_request_is_refused_by_the_adapter_stage_on_both_paths() -> None:
    for name in ("length_past_end", "invalid_utf8_name", "nested_values_60", "truncated_at_8"):
        for path in ("python", "native"):
            with implementation(path):
                with pytest.raises(DecodeError):
                    digest_module.digest_in_process(HOSTILE[name], SETTINGS[0])


def test_bytes_the_receivers_validated_are_not_walked_again() -> None:
    """A ``VALIDATED`` request (bytes the receiver process's core accepted, unchanged:
    test_receiver_process) is read without the validation walk, the reading's largest part after the
    reading itself. What only that walk refuses, values nested past upb's depth, shows it is skipped."""
    with implementation("native"):
        for name in ("nested_values_48", "nested_mixed_45_2"):
            assert _digest(HOSTILE[name], SETTINGS[0])[0] == "refused", name
            assert _digest(HOSTILE[name], SETTINGS[0], validated=True)[0] != "refused", name


# --- fuzz: seeded mutations, bounded ----------------------------------------------------------------

FUZZ_INPUTS = 20_000  # ~1 s here; the digest on both paths for a quarter of the accepted ones


def _mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(1 if rng.random() < 0.7 else rng.randint(2, 4)):
        op = rng.randrange(6)
        if not buf:
            buf.extend(rng.randbytes(rng.randint(1, 8)))
            continue
        at = rng.randrange(len(buf))
        if op == 0:
            buf[at] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[at] = rng.choice((0x00, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x0B, 0x0C, 0x0E, 0xC3))
        elif op == 2:
            del buf[at:at + rng.randint(1, 16)]
        elif op == 3:
            buf[at:at] = rng.randbytes(rng.randint(1, 8))
        elif op == 4:
            del buf[at:]
        else:
            start = rng.randrange(len(buf))
            buf[at:at] = buf[start:start + rng.randint(1, 64)]
    return bytes(buf)


def test_fuzz_the_decoder_against_upb() -> None:
    rng = random.Random(25)
    seeds = [data for name, data in REQUESTS.items() if len(data) < 20_000]
    seeds += [data for name, data in HOSTILE.items() if not name.startswith("truncated_at_")]
    accepted = refused = digested = 0
    started = time.monotonic()
    for index in range(FUZZ_INPUTS):
        data = _mutate(rng, rng.choice(seeds))
        verdict = _python_verdict(data)
        assert _native_verdict(data) == verdict, f"input {index}: {data.hex()}"
        if not verdict:
            refused += 1
            continue
        accepted += 1
        if index % 4 == 0:  # the whole stage on a quarter of the accepted ones: same spans or same failure
            results = []
            # The native path also as it reads bytes the receivers' check validated (accepted ones are).
            for path, validated in (("python", False), ("native", False), ("native", True)):
                with implementation(path):
                    try:
                        results.append(_digest(data, SETTINGS[index % 2], validated))
                    except Exception as exc:  # noqa: BLE001 - compared, not hidden
                        results.append(type(exc).__name__)
            assert results[0] == results[1] == results[2], f"input {index}: {data.hex()}"
            digested += 1
    elapsed = time.monotonic() - started
    print(f"fuzz: {FUZZ_INPUTS} inputs ({accepted} accepted, {refused} refused, {digested} digested on both paths) "
          f"in {elapsed:.1f} s")
    assert accepted > FUZZ_INPUTS // 20 and refused > FUZZ_INPUTS // 10


def _with_unusable_ids() -> bytes:
    """A request whose spans have each kind of id the receivers refuse, beside usable ones."""
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    usable = dict(trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    for ids in (usable, dict(usable, parent_span_id=b"\x03" * 8), dict(usable, trace_id=bytes(16)),
                dict(usable, trace_id=b"\x01" * 15), dict(usable, span_id=bytes(8)), dict(usable, span_id=b"\x02" * 9),
                dict(usable, parent_span_id=b"\x03" * 7), dict(trace_id=b"\x01" * 16), {}):
        spans.add(name="s", **ids)
    return request.SerializeToString()


def test_the_receivers_id_check_on_bytes_is_upbs_parse_and_check_ids() -> None:
    """``admission.usable_ids`` lets the receivers skip their parse: the core's ``span_ids`` must
    refuse what upb's parse of the standard request refuses and count what ``check_ids`` counts on
    the parsed request, on the fixtures, captures and seeded mutations of them (bad ids included)."""
    from otel_llm.receiver.otlp.admission import check_ids

    assert extension is not None
    rng = random.Random(26)
    seeds = [data for data in REQUESTS.values() if len(data) < 20_000] + [_with_unusable_ids()]
    seeds += [data for name, data in HOSTILE.items() if not name.startswith("truncated_at_")]
    assert extension.span_ids(_with_unusable_ids()) == (9, 7)  # counted by hand: 2 usable of 9
    compared = refused = with_rejected = 0
    for index in range(FUZZ_INPUTS):
        data = _mutate(rng, rng.choice(seeds)) if index >= len(seeds) else seeds[index]
        try:
            parsed = check_ids(ExportTraceServiceRequest.FromString(data))
        except DecodeError:
            with pytest.raises(ValueError, match="malformed ExportTraceServiceRequest"):
                extension.span_ids(data)
            refused += 1
            continue
        assert extension.span_ids(data) == (parsed.spans, parsed.rejected), f"input {index}: {data.hex()}"
        compared += 1
        with_rejected += parsed.rejected > 0
    print(f"span ids: {FUZZ_INPUTS} inputs, {compared} counted alike ({with_rejected} with unusable ids), "
          f"{refused} refused by both")
    assert compared > FUZZ_INPUTS // 20 and refused > FUZZ_INPUTS // 10 and with_rejected > 50


# --- start-up: which path runs ------------------------------------------------------------------------

def test_the_choice_of_path_is_explicit() -> None:
    assert native_core.select("python") == (None, "OTEL_LLM_CORE=python")
    assert native_core.select("native")[0] is extension
    with pytest.raises(native_core.CoreUnavailable, match="expected one of"):
        native_core.select("fast")


# --- end to end: /metrics and the store's rows ------------------------------------------------------

_CREATED = re.compile(r"^[^ {]*_created[ {]")


class _CountingWriter:
    """The core's ``KeptTraceWriter``, counting the kept traces it wrote."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.written = 0

    def build(self, *args: Any) -> Any:
        built = self.writer.build(*args)
        self.written += built is not None
        return built


class _CountingBuilder:
    """The core's ``RecordBuilder``, counting the records it built (so the comparison is known to
    have compared the core's records, not Python's twice)."""

    def __init__(self, builder: Any) -> None:
        self.builder = builder
        self.built = 0

    def build(self, spans: Any) -> Any:
        record = self.builder.build(spans)
        self.built += record is not None
        return record

    def build_many(self, traces: list[Any]) -> list[Any]:
        records = self.builder.build_many(traces)
        self.built += sum(type(record).__name__ == "RequestRecord" for record in records)
        return records


def _run_pipeline(path: str, requests: list[bytes], workdir: Path,
                  built: list[int] | None = None) -> tuple[list[str], dict[str, list[Any]]]:
    """A real ``Service`` (the bench's config: the real loader, factories, ``Pipeline``, the SQLite
    store) fed ``requests`` as the receivers' worker does, every trace completed, then read back.
    ``built`` gets how many request records the core's ``RecordBuilder`` built, how many kept traces its
    ``KeptTraceWriter`` wrote and how many traces its completion lane completed (none on the Python path)."""
    from prometheus_client import generate_latest

    from bench.hotpath import build

    workdir.mkdir(parents=True)
    with implementation(path):
        service, clock = build(workdir)
        pipeline = service.pipeline
        counting = None
        if pipeline.metrics.native_records is not None:
            counting = pipeline.metrics.native_records = _CountingBuilder(pipeline.metrics.native_records)
        writing = None
        if pipeline.redaction.native_writer is not None:
            writing = pipeline.redaction.native_writer = _CountingWriter(pipeline.redaction.native_writer)
        try:
            for data in requests:
                pipeline.buffer(data, False)
            for _ in range(3):  # past the grace, then past the decision wait: every trace is completed
                clock.now += 60.0
                pipeline.assembler.tick()
            for consumer in pipeline.consumers:
                wait = getattr(consumer, "wait_written", None)
                if wait is not None:
                    assert wait(), "the store did not write in time"
            # Every series but the two that differ by design: which core runs, and when a counter
            # was created (prometheus_client's ``_created``: the wall clock).
            metrics = [line for line in generate_latest(service.registry).decode().splitlines()
                       if "otel_llm_core_info" not in line and not _CREATED.match(line)]
        finally:
            store = service.components.get("exporters.store")
            if store is not None:
                store.shutdown(5.0)
    rows = store_rows(workdir)
    if built is not None:
        # The completion lane's traces are the core's records too, built there (service/lane.py).
        lane = pipeline.assembler.lane
        completed_in_lane = lane.completed if lane is not None else 0
        built.append((counting.built if counting is not None else 0) + completed_in_lane)
        built.append(writing.written if writing is not None else 0)
        built.append(completed_in_lane)
    return metrics, rows


def test_metrics_and_store_rows_are_identical_end_to_end() -> None:
    requests = [data for name, data in {**REQUESTS, **_bench_requests()}.items() if _python_verdict(data)]
    with tempfile.TemporaryDirectory(prefix="otel-llm-native-") as tmp:
        built: list[int] = []
        reference_metrics, reference_rows = _run_pipeline("python", requests, Path(tmp) / "python", built)
        native_metrics, native_rows = _run_pipeline("native", requests, Path(tmp) / "native", built)
    assert native_metrics == reference_metrics
    assert native_rows == reference_rows
    # The native run's records of the common shapes were the core's (RecordBuilder), its kept traces
    # the core's (KeptTraceWriter), most of its traces completed by the lane; the reference's were Python's.
    assert built[:3] == [0, 0, 0] and built[3] > 100 and built[4] > 10 and built[5] > 100, built
    # The comparison compared something: requests measured, spans and request records stored.
    assert any(line.startswith("vllm:e2e_request_latency_seconds_bucket") for line in reference_metrics)
    assert len(reference_rows.get("spans", [])) > 100 and len(reference_rows.get("requests", [])) > 10
    samples = [line for line in reference_metrics if not line.startswith("#")]
    print(f"end to end: {len(requests)} requests, {len(samples)} /metrics samples, "
          + ", ".join(f"{len(rows)} {table} rows" for table, rows in sorted(reference_rows.items()))
          + f", {built[3]} request records built, {built[4]} kept traces written and {built[5]} traces completed"
          + " in its lane by the core: 0 differences")


@pytest.mark.parametrize("path", ["python", "native"])
def test_start_up_says_which_path_runs(path: str, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """One line once the service has started (a start that fails says only why), and the metric."""
    from tests.support.otelllm import start_server

    caplog.set_level("INFO", logger="otel_llm.service.service")
    with implementation(path):
        running_server = start_server(str(tmp_path / "store"))
    try:
        running = {sample.labels["implementation"]: sample.value
                   for metric in running_server.service.registry.collect() if metric.name == "otel_llm_core_info"
                   for sample in metric.samples}
        assert running == {path: 1.0}
        lines = [r.getMessage() for r in caplog.records if "per-span hot path" in r.getMessage()]
        assert len(lines) == 1
        assert ("compiled core" in lines[0]) == (path == "native")
        assert path != "python" or "OTEL_LLM_CORE=python" in lines[0]
    finally:
        running_server.stop()


def test_a_required_core_that_does_not_import_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_core, "_import_extension", lambda: (None, "No module named 'otel_llm._core'"))
    with pytest.raises(native_core.CoreUnavailable, match="OTEL_LLM_CORE=native but the compiled core does not import"):
        native_core.select("native")
    monkeypatch.setenv(native_core.REQUIRE_ENV, "1")
    with pytest.raises(native_core.CoreUnavailable, match="OTEL_LLM_REQUIRE_NATIVE=1"):
        native_core.select("auto")
    monkeypatch.delenv(native_core.REQUIRE_ENV)
    assert native_core.select("auto") == (None, "the compiled core is not installed (No module named 'otel_llm._core')")


# --- what a buffered span holds on the native path (issue 25's memory: the core's compact classes) ---

def _span_bytes() -> dict[str, bytes]:
    """A span's bytes in each way the compact row holds them: as serializers write them (ids, name,
    kind and times in field order), orders none writes, a trace state, and the values at the edges."""
    trace_id, span_id, parent = bytes(range(1, 17)), b"\x05" * 8, b"\x09" * 8
    start, end = 1_700_000_000_000_000_000, 1_700_000_001_500_000_000
    full = Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name="llm_request",
                kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=start, end_time_unix_nano=end)
    full.attributes.extend(F.kv({"gen_ai.request.model": "m", "gen_ai.usage.prompt_tokens": 12}))
    full.status.code = Status.STATUS_CODE_ERROR
    root = Span()
    root.CopyFrom(full)
    root.parent_span_id = b""
    ids_only = Span(trace_id=trace_id, span_id=span_id).SerializeToString()
    return {
        "serialized": full.SerializeToString(),
        "root": root.SerializeToString(),
        "no_kind_no_times": Span(trace_id=trace_id, span_id=span_id, name="x").SerializeToString(),
        "only_end": Span(trace_id=trace_id, span_id=span_id, name="x", end_time_unix_nano=end).SerializeToString(),
        "negative_kind": Span(trace_id=trace_id, span_id=span_id, name="x", kind=-1,  # type: ignore[arg-type]
                              start_time_unix_nano=start).SerializeToString(),
        "trace_state": Span(trace_id=trace_id, span_id=span_id, trace_state="ot=th:8", name="x", kind=2,
                            start_time_unix_nano=start, end_time_unix_nano=end).SerializeToString(),
        "name_first": Span(name="x").SerializeToString() + Span(
            trace_id=trace_id, span_id=span_id, kind=2, start_time_unix_nano=start).SerializeToString(),
        "attributes_before_times": ids_only + Span(name="x", attributes=full.attributes).SerializeToString()
        + Span(kind=2, start_time_unix_nano=start, end_time_unix_nano=end).SerializeToString(),
        "times_before_name": ids_only + Span(kind=2, start_time_unix_nano=start).SerializeToString()
        + Span(name="x").SerializeToString(),
        "id_repeated": full.SerializeToString() + Span(span_id=b"\x06" * 8).SerializeToString(),
        "long_length_varint": ids_only + b"\x2a\x81\x00x" + Span(kind=2).SerializeToString(),
    }


def _compact(data: bytes, origin: Any = None, attrs: tuple[Any, ...] = (), observation: Any = None) -> Any:
    span = Span.FromString(data)
    return extension.BufferedSpan(span.trace_id, span.span_id, span.parent_span_id, span.kind, span.status.code,
                                  span.start_time_unix_nano, span.end_time_unix_nano, span.trace_state, data, origin,
                                  attrs, observation)


# Bytes each leaves out of what it holds, from the encoding: trace id 2+16, span id 2+8, parent id
# 2+8; kind 2 (11 when negative: a 10-byte varint), start 1+8, end 1+8; nothing where the order is
# not the serializers' (the ids must lead, and kind and times follow the name) or a value differs.
OMITTED = {"serialized": 58, "root": 48, "no_kind_no_times": 28, "only_end": 37, "negative_kind": 48,
           "trace_state": 0, "name_first": 0, "attributes_before_times": 28, "times_before_name": 28,
           "id_repeated": 0, "long_length_varint": 30}


@pytest.mark.parametrize("name", sorted(_span_bytes()))
def test_the_compact_span_gives_back_its_bytes_exactly_and_every_field(name: str) -> None:
    data = _span_bytes()[name]
    parsed = Span.FromString(data)
    row = _compact(data)
    assert row.payload == data  # byte for byte: what the store and the exporters get
    # A bytes object of one layout byte and the bytes less what the row rebuilds from its own fields.
    assert sys.getsizeof(row) == type(row).__basicsize__ + sys.getsizeof(b"") + 1 + len(data) - OMITTED[name]
    assert (row.trace_id, row.span_id, row.parent_span_id, row.kind, row.status_code, row.start_unix_ns,
            row.end_unix_ns, row.trace_state) == (
        parsed.trace_id, parsed.span_id, parsed.parent_span_id, parsed.kind, parsed.status.code,
        parsed.start_time_unix_nano, parsed.end_time_unix_nano, parsed.trace_state)
    assert row == _compact(data) and row != _compact(data + Span(name="y").SerializeToString())
    assert not gc.is_tracked(row)  # what it refers to never refers back: no cycle to collect
    with pytest.raises(TypeError):
        hash(row)  # as the dataclass (eq without frozen)
    row.trace_id, row.parent_span_id = bytes(parsed.trace_id), bytes(parsed.parent_span_id)  # the assembler's sharing
    with pytest.raises(ValueError):
        row.trace_id = b"\x07" * 16
    with pytest.raises(ValueError):
        row.parent_span_id = b"\x07" * 8
    assert row.payload == data


def test_the_compact_span_reads_as_the_dataclass_and_refuses_ids_the_receivers_refuse() -> None:
    from otel_llm.pdata.observation import EngineObservation
    from otel_llm.pdata.spans import BufferedSpan, Origin
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    origin = Origin(Resource(), InstrumentationScope(name="s"), "svc", {"service.name": "svc"})
    attrs = ("gen_ai.request.model", "m", "http.route", "/v1/chat")
    data = _span_bytes()["serialized"]
    for observation, engine in ((None, False), (EngineObservation("vllm", "vllm_v1"), True),
                                (EngineObservation("genai", "genai", may_be_gateway=True), False),
                                (EngineObservation("sglang", "sglang_stage", part="sglang_stage"), False)):
        row = _compact(data, origin, attrs, observation)
        reference = BufferedSpan(*(getattr(row, name) for name in (
            "trace_id", "span_id", "parent_span_id", "kind", "status_code", "start_unix_ns", "end_unix_ns",
            "trace_state", "payload", "origin", "attrs", "observation")))
        assert (row.is_engine, reference.is_engine) == (engine, engine)
        assert row.observation is observation and row.origin is origin and row.attrs is attrs
        assert (row.resource, row.scope, row.service_name) == (origin.resource, origin.scope, "svc")
        assert [row.attr(key) for key in ("http.route", "gen_ai.request.model", "absent")] == ["/v1/chat", "m", None]
        assert repr(row) == repr(reference)
    span = Span.FromString(data)
    fields = (span.trace_id, span.span_id, span.parent_span_id, 2, 0, 1, 2, "", data, origin, ())
    for bad in ({0: b"\x01" * 15}, {1: b"\x01" * 7}, {2: b"\x01" * 4}):
        changed = tuple(bad.get(index, value) for index, value in enumerate(fields))
        with pytest.raises(ValueError):
            extension.BufferedSpan(*changed, None)
        assert type(digest_module._compact_span(extension, changed, None)) is BufferedSpan  # held as before


def test_the_compact_observation_reads_as_the_python_class() -> None:
    from otel_llm.pdata.observation import OBSERVATION_FIELDS, EngineObservation

    compact: list[Any] = []
    with implementation("native"):
        for data in _bench_requests().values():
            spans, _ = digest_module.digest_in_process(data, SETTINGS[0])
            compact += [span.observation for span in spans if type(span.observation) is extension.EngineObservation]
    adapters = {observation.adapter for observation in compact}
    assert {"vllm_v1", "genai", "sglang", "tgi"} <= adapters, adapters
    assert any(observation.marks for observation in compact)  # a rare field set (SGLang's dispatch mark)
    for observation in compact:
        values = observation.as_tuple()
        assert values == tuple(getattr(observation, name) for name in OBSERVATION_FIELDS)
        python = EngineObservation(*values)
        assert [type(value) for value in python.as_tuple()] == [type(value) for value in values]
        assert observation == python and python == observation and observation != EngineObservation("tgi", "tgi")
        assert repr(observation) == repr(python)
        assert observation.mark("dispatch_to_first_token_s") == python.mark("dispatch_to_first_token_s")
        assert not gc.is_tracked(observation)
        with pytest.raises(TypeError):
            hash(observation)


# --- a request's timings and segments ---------------------------------------------------------------

def _random_observation_values(rng: random.Random) -> tuple[Any, ...]:
    """``EngineObservation``'s 32 fields with latencies and token counts drawn where the checks
    and the arithmetic turn: None, signed zeros, tolerance edges, NaN, infinities, absurd values."""
    from otel_llm.processor.llm_metrics.segments import ABS_TOLERANCE_S, REL_TOLERANCE

    wild = rng.random() < 0.25  # else only values a live engine sends
    absurd = [1e9, 1e300, 5e18, math.inf, math.nan, -1.0, -0.001] if wild else []
    e2e = rng.choice([None, 0.0, -0.0, 1e-9, 0.35, 1.0, 7.25, 3600.0] + absurd)

    def latency() -> float | None:
        if e2e is not None and isinstance(e2e, float) and math.isfinite(e2e) and rng.random() < 0.35:
            # near e2e, and near e2e + the tolerance (TTFT's limit, the derived intervals' sign)
            edge = e2e + (ABS_TOLERANCE_S + REL_TOLERANCE * e2e) * rng.choice([0, 1, -1])
            return max(0.0, math.nextafter(edge, rng.choice([math.inf, -math.inf]))) * rng.choice([1, 1, 0.5, 0.25])
        # 2.5e-09, 1.0000000005, 0.2500000005: half a nanosecond exactly (round() ties to even)
        return rng.choice([None, None, 0.0, -0.0, 1e-6, 0.012, 0.1, 0.25, 0.5, 2.0, 2.5e-09, 1.0000000005,
                           0.2500000005] + absurd)

    def tokens() -> int | None:
        return rng.choice([None, 0, 1, 2, 3, 17, 4096, 100_000_000] + ([100_000_001, -1] if wild else []))

    ttft, queue, prefill, decode, inference = latency(), latency(), latency(), latency(), latency()
    preprocess = rng.choice([None, None, None, 0.0, 0.004, latency(), 3])  # 3: an int (the core declines it)
    tpot = rng.choice([None, None, None, 0.02, latency()])
    derived = rng.choice([(), (), (), (), (), ("prefill",), ("decode",), ("prefill", "decode")])
    values: list[Any] = [None] * 32
    values[0:2] = ["vllm", "vllm_v1"]
    values[2:9] = [ttft, e2e, queue, prefill, decode, inference, preprocess]
    values[9:12] = [tokens(), tokens(), None]
    values[12:19] = ["m", "m", None, "chat", "vllm", None, None]
    values[19], values[20], values[21] = False, None, False
    values[22:27] = [None] * 5
    values[27], values[28], values[29], values[30], values[31] = tpot, (), None, (), derived
    return tuple(values)


def _exactly(value: Any) -> Any:
    """A value compared by type and repr as well (``-0.0 == 0.0``; ``1 == 1.0``)."""
    if isinstance(value, tuple):
        return (type(value).__name__ if type(value) is not tuple else "", tuple(_exactly(v) for v in value))
    return type(value).__name__, repr(value)


def test_the_cores_timings_and_segments_are_the_python_functions() -> None:
    """Every observation the core takes gets Python's ``derive_timings`` and ``build_segments``
    exactly (values, types, signs, not_measurable, segment order and bounds); every one it declines
    is one Python refuses or reads itself (an adapter-derived interval, a value not a float)."""
    from otel_llm.pdata.observation import EngineObservation, MalformedSpan
    from otel_llm.pdata.records import Segment
    from otel_llm.processor.llm_metrics.segments import build_segments, derive_timings, timings_and_segments

    rng = random.Random(25)
    taken = declined = refused = 0
    starts = [0, 1, 1_764_000_000_123_456_789, 2**63 - 1, 2**64 - 1]
    for _ in range(20_000):
        values = _random_observation_values(rng)
        start = rng.choice(starts)
        python = EngineObservation(*values)
        try:
            timings = derive_timings(python, math.inf)
            expected: Any = (tuple(timings), build_segments(start, timings))
        except MalformedSpan as exc:
            expected = exc.reason
        except OverflowError:  # an interval past any float's nanoseconds (intake's max_latency_s stops it first)
            expected = "overflow"
        compact = extension.EngineObservation(*values)
        assert _exactly(compact.as_tuple()) == _exactly(python.as_tuple())  # (== fails on NaN)
        both = extension.timings_and_segments(compact, start, True, Segment)
        if both is None:
            declined += 1
            if isinstance(expected, str):
                refused += 1
            else:  # Python answers it: the core leaves it to Python only by design
                past_its_ints = start >= 2**62 or any(isinstance(v, float) and v * 1e9 > 2**62 for v in values[2:9])
                not_a_float = isinstance(values[8], int)  # a rare value (preprocess) the core does not read
                assert values[31] or past_its_ints or not_a_float, (values, start)  # or an adapter-derived interval
            continue
        taken += 1
        assert not isinstance(expected, str), (values, start, expected)
        assert all(type(segment) is Segment for segment in both[1])
        assert _exactly(both) == _exactly(expected), (values, start)
        assert extension.timings_and_segments(compact, start, False, Segment) == (both[0], ())
        for path in ("native", "python"):  # the function completion calls, on either path
            with implementation(path):
                timings, segments = timings_and_segments(compact, start, True)
            assert _exactly((tuple(timings), segments)) == _exactly(expected), path
    # The core took the common cases and declined exactly where Python has more to say.
    assert taken > 3_000 and refused > 3_000 and declined > refused, (taken, declined, refused)
    assert extension.timings_and_segments(EngineObservation("vllm", "vllm_v1", ttft_s=0.1), 0, True, Segment) is None


def test_the_cores_rolling_quantile_is_the_python_one() -> None:
    """The ``slowest`` policy's windows: the same operations, values and clock on both classes give the
    same thresholds bit for bit, the same totals, and the same errors (NaN, infinity) with nothing
    changed by them. The clock moves in steps within a slice, across slices, past the whole window
    and back to idle gaps; values sit on bin edges, below the first bin and past the last."""
    from otel_llm.processor.tail_sampling.quantiles import RollingQuantile

    rng = random.Random(25)
    checked = errors = cached_answers = 0
    for window_s, slices in ((10.0, 10), (3.0, 3), (60.0, 7), (0.5, 1)):
        now = [1000.0 + rng.random()]
        python = RollingQuantile(window_s, slices, clock=lambda: now[0])
        native = extension.RollingQuantile(window_s, slices, clock=lambda: now[0])
        for _ in range(6000):
            step = rng.random()  # mostly calm (a window fills past the cached-answer size), now and then a jump
            if step < 0.993:
                now[0] += rng.random() * window_s / slices / 500
            elif step < 0.999:
                now[0] += rng.random() * window_s / slices * 2
            else:
                now[0] += window_s * rng.choice([1.0, 1.5, 3.0])
            kind = rng.random()
            value: Any = rng.choice([
                rng.lognormvariate(-1, 2), 1e-4, 1e-4 * 1.1 ** rng.randrange(0, 220), 0.0, -1.0, 1e300,
                rng.randrange(0, 5), rng.random() * 1e-5])
            if rng.random() < 0.01:
                value = rng.choice([math.nan, math.inf, -math.inf])
            q = rng.choice([0.5, 0.9, 0.99, 0.999, 1.0])
            results = []
            for window in (python, native):
                try:
                    if kind < 0.7:
                        slice_id, position = window.slice_at(now[0])
                        results.append(window.quantile_then_add(q, value, now[0], slice_id, position))
                    elif kind < 0.85:
                        results.append(window.add(value))
                    else:
                        results.append(window.quantile(q))
                except (ValueError, OverflowError) as exc:
                    results.append(type(exc))
            assert _exactly(results[0]) == _exactly(results[1]), (window_s, slices, kind, value, q, now[0])
            assert python.total == native.total
            checked += 1
            errors += isinstance(results[0], type)
            cached_answers += python.total >= 200 and kind < 0.7
    assert errors > 50 and cached_answers > 5000, (errors, cached_answers)
    assert checked == 24_000

    # A cached threshold lives 0.5 s, and a new slice drops it: two extremes added after a threshold
    # was cached show in it only once either happens (both paths, checked every 10 ms).
    for start, crosses_slice in ((1.0, False), (9.8, True)):
        now = [start]
        python = RollingQuantile(100.0, 10, clock=lambda: now[0])
        native = extension.RollingQuantile(100.0, 10, clock=lambda: now[0])
        answers = []
        for window in (python, native):
            now[0] = start
            for _ in range(300):
                window.add(0.01)
            cached = window.quantile(0.999)
            window.add(50.0)
            window.add(50.0)
            seen = []
            for step in range(1, 61):
                now[0] = start + step * 0.01
                seen.append(window.quantile(0.999))
            answers.append(seen)
            assert seen[0] == cached and seen[-1] > cached
            # Without a slice boundary the cached answer is kept for 0.5 s; across one it is dropped at once.
            assert (seen.index(seen[-1]) < 25) == crosses_slice
        assert answers[0] == answers[1]
