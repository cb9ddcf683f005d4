"""Raw OTLP payloads built directly as protobuf: for volumes and values the SDK path is too slow
or too well-behaved to produce. Shapes follow vLLM V1's ``llm_request`` span."""

from __future__ import annotations

import os
import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

LATENCIES = {"time_to_first_token": 0.5, "time_in_queue": 0.1, "time_in_model_prefill": 0.3,
             "time_in_model_decode": 2.0, "e2e": 2.6, "time_in_model_inference": 2.3}


def vllm_batch(count: int, *, model: str | None = None, model_prefix: str | None = None, service: str = "raw",
               start_ns: int | None = None, parent: bool = False, extra: dict[str, str] | None = None,
               latencies: dict[str, float] | None = None) -> ExportTraceServiceRequest:
    """``count`` vLLM V1 spans, each its own trace (or waiting for a parent that never comes)."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    kv = resource_spans.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", service
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "vllm.tracing.otel"
    start = time.time_ns() if start_ns is None else start_ns
    values = latencies or LATENCIES
    for i in range(count):
        span = scope_spans.spans.add()
        span.trace_id = os.urandom(16)
        span.span_id = os.urandom(8)
        if parent:
            span.parent_span_id = os.urandom(8)
        span.name = "llm_request"
        span.kind = 2
        span.start_time_unix_nano = start
        span.end_time_unix_nano = start + int(values.get("e2e", 1.0) * 1e9)
        for key, value in values.items():
            attr = span.attributes.add()
            attr.key = "gen_ai.latency." + key
            attr.value.double_value = value
        for key, number in (("gen_ai.usage.prompt_tokens", 100), ("gen_ai.usage.completion_tokens", 51)):
            attr = span.attributes.add()
            attr.key = key
            attr.value.int_value = number
        if model or model_prefix:
            attr = span.attributes.add()
            attr.key = "gen_ai.response.model"
            attr.value.string_value = model if model else f"{model_prefix}{i}"
        for key, text in (extra or {}).items():
            attr = span.attributes.add()
            attr.key = key
            attr.value.string_value = text
    return request


def gateway_batch(*, gateway_end_ns: int | None = None, edge_ttft: str | None = None,
                  engine: bool = True, genai: bool = True) -> ExportTraceServiceRequest:
    """A gateway SERVER span (with GenAI attributes, or a plain HTTP server's) and vLLM V1's span below it."""
    request = vllm_batch(1, parent=True) if engine else vllm_batch(0)
    scope = request.resource_spans[0].scope_spans[0]
    gateway = scope.spans.add()
    gateway.trace_id = scope.spans[0].trace_id if engine else os.urandom(16)
    gateway.span_id = scope.spans[0].parent_span_id if engine else os.urandom(8)
    gateway.name = "POST /v1/chat/completions"
    gateway.kind = Span.SPAN_KIND_SERVER
    start = scope.spans[0].start_time_unix_nano - 10_000_000 if engine else time.time_ns()
    gateway.start_time_unix_nano = start
    gateway.end_time_unix_nano = gateway_end_ns if gateway_end_ns is not None else start + 3_000_000_000
    for key, value in (("gen_ai.request.model", "absurd-model"), ("http.route", "/v1/chat/completions")):
        if key.startswith("gen_ai.") and not genai:
            continue
        kv = gateway.attributes.add()
        kv.key, kv.value.string_value = key, value
    if edge_ttft is not None:
        kv = gateway.attributes.add()
        kv.key, kv.value.string_value = "gen_ai.server.time_to_first_token", edge_ttft
    return request
