"""Pre-generated OTLP batches: a mixed LLM fleet's spans through the real SDK, as wire bytes.

Every batch is built by the emitters in ``otel_llm_simulate.emitters`` (the engines' exact span
shapes, resources and id generators), collected by an ``InMemorySpanExporter`` and encoded by the
SDK's own ``encode_spans``, so the bytes are what an OTLP exporter would put on the wire.

The mix per request (span counts in brackets):

- 82 % vLLM V1 ``llm_request`` under a gateway SERVER span ``POST /v1/chat/completions`` [2]
- 6 % SGLang request tree under a gateway [7 + 1]
- 4 % TGI ``generate`` tree under a gateway [9-11 + 1]
- 5 % vLLM V1 with no gateway (model from the resource mapping) [1]
- 3 % a gateway span alone (the client went away before an engine saw it) [1]

One batch holds several resources (the gateway, four vLLM replicas, SGLang, TGI), as a forwarding
agent or a gateway-side collector sends them; 500-1000 spans per batch.

With ``tenants=True`` (what ``python -m bench`` generates) every gateway span also carries the
request's tenant as the gateway records an ``x-tenant-id`` header (``TENANT_ATTRIBUTE``): 40 % / 30 %
/ 20 % ``TENANTS``, 10 % one off the allow-list; drawn from a generator of its own, so every other
draw, span and id is the same as without it. The production configuration's accounting reads it.

Trace ids must not repeat during a run (a repeated id would hit the decided-trace cache and be
counted as late), so every batch carries the offsets of every trace id in its bytes (span and
link ``trace_id`` fields) and the sender overwrites bytes 4..7 of each with a per-replay epoch
(``stamp``): a cheap copy plus ~1000 four-byte writes instead of re-encoding.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_llm_simulate.emitters import (
    RequestTiming,
    SamplingParams,
    emit_gateway,
    emit_sglang,
    emit_tgi,
    emit_vllm_v1,
    engine_tracer_provider,
)

EPOCH_OFFSET = 4  # which 4 bytes of each 16-byte trace id carry the replay epoch
GATEWAY_MAX_TOKENS = 512
VLLM_REPLICAS = ("vllm-llama-0", "vllm-llama-1", "vllm-llama-2", "vllm-qwen-0")
# The config the pipeline runs with maps these services to a model (the other replicas get theirs
# from the gateway's gen_ai.request.model).
RESOURCE_MODELS = {"vllm-qwen-0": "Qwen/Qwen2.5-7B-Instruct"}
# The tenant header a gateway records (OTel Python's HTTP server instrumentations name x-tenant-id so;
# semconv: a string array), the allow-listed tenants and one that is not on the list.
TENANT_ATTRIBUTE = "http.request.header.x_tenant_id"
TENANTS = ("team-search", "team-chat", "team-batch")
UNLISTED_TENANT = "team-intern"
_TENANT_WEIGHTS = (0.4, 0.3, 0.2, 0.1)


@dataclass(slots=True)
class Batch:
    payload: bytes  # a serialized ExportTraceServiceRequest
    spans: int
    traces: int
    offsets: tuple[int, ...]  # byte offset of every trace id occurrence in ``payload``


def stamp(batch: Batch, epoch: int) -> bytes:
    """``batch.payload`` with every trace id's bytes 4..7 set to ``epoch`` (a non-zero uint32)."""
    buf = bytearray(batch.payload)
    tag = epoch.to_bytes(4, "big")
    for off in batch.offsets:
        start = off + EPOCH_OFFSET
        buf[start:start + 4] = tag
    return bytes(buf)


def _timing(rng: random.Random, now_ns: int) -> RequestTiming:
    completion = min(rng.randint(2, 900), GATEWAY_MAX_TOKENS)
    return RequestTiming(
        arrival_unix_ns=now_ns - rng.randint(1, 60) * 10**9,
        preprocess_s=rng.uniform(0.001, 0.02),
        queue_s=rng.uniform(0.0005, 0.6) if rng.random() < 0.9 else rng.uniform(1.0, 20.0),
        prefill_s=rng.uniform(0.01, 0.4),
        decode_s=completion * rng.uniform(0.008, 0.06),
        postprocess_s=rng.uniform(0.0, 0.004),
        prompt_tokens=rng.randint(1, 30000),
        completion_tokens=completion,
    )


class FleetGenerator:
    """Providers built once (one resource each, seeded ids); ``batch()`` emits one export's worth."""

    def __init__(self, seed: int, tenants: bool = False) -> None:
        self.rng = random.Random(seed)
        self.tenants = random.Random(seed * 10 + 10) if tenants else None
        self.exporter = InMemorySpanExporter()
        self.gateway = engine_tracer_provider("gateway", self.exporter, seed=seed * 10 + 1)
        self.vllm = [
            engine_tracer_provider("vllm-v1", self.exporter, service_name=name, process_id=1000 + i,
                                   seed=seed * 10 + 2 + i)
            for i, name in enumerate(VLLM_REPLICAS)
        ]
        self.sglang = engine_tracer_provider("sglang", self.exporter, seed=seed * 10 + 7)
        self.tgi = engine_tracer_provider("tgi", self.exporter, seed=seed * 10 + 8)
        self.client = random.Random(seed * 10 + 9)  # upstream client span ids (never sent)
        self.requests = 0

    def _upstream(self, upstream_parent: bool) -> dict[str, str] | None:
        """A traceparent from a client whose span is never exported, so the trace never roots."""
        if not upstream_parent:
            return None
        trace_id = self.client.getrandbits(128) or 1
        span_id = self.client.getrandbits(64) or 1
        return {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-01"}

    def _request(self, now_ns: int, upstream_parent: bool) -> None:
        rng = self.rng
        self.requests += 1
        n = self.requests
        t = _timing(rng, now_ns)
        roll = rng.random()
        parent = self._upstream(upstream_parent)
        gw_start, gw_end = t.arrival_unix_ns - 4_000_000, t.end_unix_ns + 6_000_000
        model = rng.choice(("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"))
        tenant = None
        if self.tenants is not None:
            (name,) = self.tenants.choices(TENANTS + (UNLISTED_TENANT,), weights=_TENANT_WEIGHTS)
            tenant = {TENANT_ATTRIBUTE: (name,)}
        if roll < 0.82:
            engine = rng.choice(self.vllm[:3])

            def call(headers: dict[str, str]) -> None:
                emit_vllm_v1(engine, t, request_id=f"cmpl-{n:x}", traceparent_headers=headers,
                             params=SamplingParams(max_tokens=GATEWAY_MAX_TOKENS))

            emit_gateway(self.gateway, start_unix_ns=gw_start, end_unix_ns=gw_end, model=model, engine_call=call,
                         traceparent_headers=parent, attributes=tenant)
        elif roll < 0.88:
            def call(headers: dict[str, str]) -> None:
                emit_sglang(self.sglang, t, rid=f"{n:08x}{rng.getrandbits(96):024x}", model="deepseek-ai/DeepSeek-V3",
                            finish_reason="length" if rng.random() < 0.2 else "stop", traceparent_headers=headers)

            emit_gateway(self.gateway, start_unix_ns=gw_start, end_unix_ns=gw_end, model="deepseek-ai/DeepSeek-V3",
                         engine_call=call, traceparent_headers=parent, attributes=tenant)
        elif roll < 0.92:
            def call(headers: dict[str, str]) -> None:
                emit_tgi(self.tgi, t, handler=rng.choice(("generate", "generate_stream", "chat_completions")),
                         traceparent_headers=headers, decode_steps=rng.randint(1, 3))

            emit_gateway(self.gateway, start_unix_ns=gw_start, end_unix_ns=gw_end, model="tiiuae/falcon-7b",
                         route="/generate", engine_call=call, traceparent_headers=parent, attributes=tenant)
        elif roll < 0.97:
            emit_vllm_v1(self.vllm[3], t, request_id=f"cmpl-{n:x}", traceparent_headers=parent,
                         params=SamplingParams(max_tokens=None, temperature=0.0))
        else:
            emit_gateway(self.gateway, start_unix_ns=gw_start, end_unix_ns=gw_start + 2_000_000, model=model,
                         traceparent_headers=parent, attributes=tenant)

    def batch(self, target_spans: int, upstream_parent: bool = False) -> Batch:
        now_ns = time.time_ns()
        self.exporter.clear()
        while len(self.exporter.get_finished_spans()) < target_spans:
            self._request(now_ns, upstream_parent)
        spans = self.exporter.get_finished_spans()
        self.exporter.clear()
        payload = encode_spans(spans).SerializeToString()
        return _with_offsets(payload)


def _with_offsets(payload: bytes) -> Batch:
    request = ExportTraceServiceRequest()
    request.ParseFromString(payload)
    trace_ids: set[bytes] = set()
    spans = 0
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                spans += 1
                trace_ids.add(span.trace_id)
                for link in span.links:
                    trace_ids.add(link.trace_id)
    offsets: list[int] = []
    for trace_id in trace_ids:
        needle = b"\x0a\x10" + trace_id  # field 1 (trace_id), length 16: the same in Span and Span.Link
        pos = payload.find(needle)
        while pos >= 0:
            offsets.append(pos + 2)
            pos = payload.find(needle, pos + 18)
    offsets.sort()
    if len(offsets) < spans:
        raise AssertionError(f"found {len(offsets)} trace ids for {spans} spans")
    return Batch(payload, spans, len(trace_ids), tuple(offsets))


def generate(count: int, seed: int = 1, upstream_parent: bool = False,
             min_spans: int = 500, max_spans: int = 1000, tenants: bool = False) -> list[Batch]:
    gen = FleetGenerator(seed, tenants)
    sizes = random.Random(seed + 1000)
    return [gen.batch(sizes.randint(min_spans, max_spans), upstream_parent) for _ in range(count)]


def verify_stamp(batch: Batch, epoch: int) -> None:
    """The stamped bytes still parse, every span's trace id carries the epoch, and ids stay distinct."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(stamp(batch, epoch))
    tag = epoch.to_bytes(4, "big")
    seen: set[bytes] = set()
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                assert span.trace_id[EPOCH_OFFSET:EPOCH_OFFSET + 4] == tag, "trace id not stamped"
                seen.add(span.trace_id)
    assert len(seen) == batch.traces - _link_only_traces(batch), "stamping merged distinct traces"


def _link_only_traces(batch: Batch) -> int:
    request = ExportTraceServiceRequest()
    request.ParseFromString(batch.payload)
    span_traces = {s.trace_id for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans}
    return batch.traces - len(span_traces)
