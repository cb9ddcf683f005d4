"""A mixed fleet's requests, sent through the real SDK exporters, with the values each metric
must observe computed here from the inputs (not from otel-llm's code)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from otel_llm_simulate.emitters import (
    RequestTiming,
    SamplingParams,
    emit_gateway,
    emit_sglang,
    emit_tgi,
    emit_vllm_v0,
    emit_vllm_v1,
    engine_tracer_provider,
)
from tests.support.otelllm import RunningServer

# DESIGN.md §5, copied from the spec (not from the code under test).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0]
TOKEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000]
GENAI_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
GENAI_TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
GENAI_DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]


def le_label(bound: float) -> str:
    return repr(float(bound))


def expected_cumulative(values: list[float], bounds: list[float]) -> dict[str, float]:
    """What a Prometheus histogram with ``bounds`` must show after observing ``values``."""
    out = {le_label(b): float(sum(1 for v in values if v <= b)) for b in bounds}
    out["+Inf"] = float(len(values))
    return out


@dataclass
class Group:
    """Requests of one engine and model, with the value each metric must see per request."""

    name: str
    engine_kind: str
    provider: str
    model: str
    service_name: str
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    queue: list[float] = field(default_factory=list)
    prefill: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)
    inference: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    gateway_overhead: list[float] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.e2e)


GATEWAY_MAX_TOKENS = 512


def random_timing(rng: random.Random, now_ns: int) -> RequestTiming:
    completion = min(rng.randint(2, 900), GATEWAY_MAX_TOKENS)  # an engine stops at max_tokens
    decode = completion * rng.uniform(0.008, 0.06)
    return RequestTiming(
        arrival_unix_ns=now_ns - rng.randint(60, 120) * 10**9,
        preprocess_s=rng.uniform(0.001, 0.02),
        queue_s=rng.uniform(0.0005, 0.6) if rng.random() < 0.8 else rng.uniform(1.0, 30.0),
        prefill_s=rng.uniform(0.01, 0.4),
        decode_s=decode,
        postprocess_s=rng.uniform(0.0, 0.004),
        prompt_tokens=rng.randint(1, 60000),
        completion_tokens=completion,
    )


def send_mixed_fleet(server: RunningServer, seed: int = 7, scale: int = 1) -> dict[str, Group]:
    rng = random.Random(seed)
    now = time.time_ns()
    groups = {
        "vllm_gw": Group("vllm_gw", "vllm", "vllm", "llama-3-8b", "llama-3-8b"),
        "vllm_res": Group("vllm_res", "vllm", "vllm", "qwen2.5-7b", "vllm-qwen"),
        "vllm_v0": Group("vllm_v0", "vllm", "vllm", "mistral-7b", "vllm-mistral"),
        "sglang": Group("sglang", "sglang", "sglang", "deepseek-r1", "sglang"),
        "tgi": Group("tgi", "tgi", "tgi", "falcon-7b", "text-generation-inference.router"),
    }

    # vLLM V1 behind a gateway over gRPC, started as docs/engines/vllm.md says (OTEL_SERVICE_NAME = its
    # served model name): its service name is the model label, the gateway's gen_ai.request.model the
    # request model (the same name here).
    grpc_exporter = server.exporter("grpc")
    engine = engine_tracer_provider("vllm-v1", grpc_exporter, service_name="llama-3-8b")
    gateway = engine_tracer_provider("gateway", grpc_exporter)
    g = groups["vllm_gw"]
    for i in range(30 * scale):
        t = random_timing(rng, now)

        def call(headers: dict[str, str], t: RequestTiming = t, i: int = i) -> None:
            emit_vllm_v1(engine, t, request_id=f"gw-{i}", traceparent_headers=headers,
                         params=SamplingParams(max_tokens=GATEWAY_MAX_TOKENS))

        emit_gateway(gateway, start_unix_ns=t.arrival_unix_ns - 5_000_000, end_unix_ns=t.end_unix_ns + 7_000_000,
                     model=g.model, engine_call=call)
        _add_vllm_v1(g, t)
        # vLLM reports no finish reason; reaching max_tokens is the one that can be told from the span.
        g.outcomes[-1] = "length" if t.completion_tokens >= GATEWAY_MAX_TOKENS else "unknown"
        g.gateway_overhead.append(0.012)

    # vLLM V1 with no gateway over HTTP: the model comes from the resource mapping in the config.
    http_exporter = server.exporter("http")
    engine_q = engine_tracer_provider("vllm-v1", http_exporter, service_name="vllm-qwen")
    g = groups["vllm_res"]
    for i in range(20 * scale):
        t = random_timing(rng, now)
        emit_vllm_v1(engine_q, t, request_id=f"q-{i}", params=SamplingParams(max_tokens=None, temperature=0.0))
        _add_vllm_v1(g, t)

    # vLLM V0 (<= 0.10) over gRPC: model on the span; no prefill/decode/inference attributes.
    engine_v0 = engine_tracer_provider("vllm-v0", grpc_exporter, service_name="vllm-mistral")
    g = groups["vllm_v0"]
    for i in range(10 * scale):
        t = random_timing(rng, now)
        emit_vllm_v0(engine_v0, t, request_id=f"v0-{i}", model=g.model, params=SamplingParams(max_tokens=4096))
        g.ttft.append(t.ttft_s)
        g.e2e.append(t.e2e_s)
        g.queue.append(t.queue_s)
        g.prompt_tokens.append(t.prompt_tokens)
        g.completion_tokens.append(t.completion_tokens)
        g.outcomes.append("unknown")

    # SGLang over HTTP: model and finish reason on the span, no queue attribute.
    engine_sg = engine_tracer_provider("sglang", http_exporter)
    g = groups["sglang"]
    for i in range(10 * scale):
        t = random_timing(rng, now)
        reason = "length" if i % 3 == 0 else "stop"
        emit_sglang(engine_sg, t, rid=f"{i:08x}deadbeef", model=g.model, finish_reason=reason)
        # Read from SGLang's stage spans (issue 14): queue = prefill_waiting, prefill = prefill_forward,
        # decode = the decode stage; ttft and e2e from the root's attributes.
        decode = t.decode_s
        g.ttft.append(t.ttft_s)
        g.e2e.append(t.e2e_s)
        g.queue.append(t.queue_s)
        g.prefill.append(t.prefill_s)
        g.decode.append(decode)
        g.inference.append(t.prefill_s + decode)
        g.tpot.append(decode / (t.completion_tokens - 1))
        g.prompt_tokens.append(t.prompt_tokens)
        g.completion_tokens.append(t.completion_tokens)
        g.outcomes.append(reason)

    # TGI over gRPC (its only protocol): Rust Duration strings, no tokens, no TTFT.
    engine_tgi = engine_tracer_provider("tgi", grpc_exporter)
    g = groups["tgi"]
    for _ in range(10 * scale):
        t = random_timing(rng, now)
        emit_tgi(engine_tgi, t, handler="generate")
        g.e2e.append(t.e2e_s)
        g.queue.append(t.queue_s)
        g.inference.append(t.inference_s)
        g.outcomes.append("unknown")
    return groups


def _add_vllm_v1(g: Group, t: RequestTiming) -> None:
    g.ttft.append(t.ttft_s)
    g.e2e.append(t.e2e_s)
    g.queue.append(t.queue_s)
    g.prefill.append(t.prefill_s)
    g.decode.append(t.decode_s)
    g.inference.append(t.prefill_s + t.decode_s)
    g.tpot.append(t.decode_s / (t.completion_tokens - 1))
    g.prompt_tokens.append(t.prompt_tokens)
    g.completion_tokens.append(t.completion_tokens)
    g.outcomes.append("unknown")


FLEET_CONFIG = {
    "processors": {
        "llm_metrics": {
            "model_name": {"from_resource": [
                {"attribute": "service.name",
                 "values": {"vllm-qwen": "qwen2.5-7b", "text-generation-inference.router": "falcon-7b"}},
            ]},
        },
    },
}
