"""A fleet workload with known outliers, errors and gateway-only aborts, for the tail sampler."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from opentelemetry.sdk.trace.export import SpanExporter

from otel_llm_simulate.emitters import (
    RequestTiming,
    SamplingParams,
    emit_gateway,
    emit_vllm_v1,
    engine_tracer_provider,
)

MODELS = ("llama-3-8b", "qwen2.5-7b", "mistral-7b")


@dataclass
class Sent:
    normal: list[str] = field(default_factory=list)
    outliers: list[str] = field(default_factory=list)  # TTFT 20x the model's median
    errors: list[str] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    by_model: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.normal) + len(self.outliers) + len(self.errors) + len(self.aborts)


def send_sampling_workload(exporter: SpanExporter, requests: int, seed: int = 11) -> Sent:
    """``requests`` gateway+vLLM requests over three models; 0.5 % outliers, 1 % errors, 1 % aborts."""
    rng = random.Random(seed)
    gateway = engine_tracer_provider("gateway", exporter, simple=False, seed=seed)
    # Each vLLM started as docs/engines/vllm.md says: its service name is the model it serves.
    engines = {m: engine_tracer_provider("vllm-v1", exporter, service_name=m, simple=False, seed=seed + i + 1)
               for i, m in enumerate(MODELS)}
    sent = Sent()
    now = time.time_ns()
    medians = {"llama-3-8b": 0.12, "qwen2.5-7b": 0.2, "mistral-7b": 0.3}
    for i in range(requests):
        model = MODELS[i % len(MODELS)]
        sent.by_model[model] = sent.by_model.get(model, 0) + 1
        kind = rng.random()
        # Outliers only after the first 100 requests of a model, so "slowest" has seen normal traffic.
        outlier = kind < 0.005 and i > 300
        ttft = medians[model] * (20 if outlier else rng.uniform(0.6, 1.4))
        queue, prefill = ttft * 0.5, ttft * 0.4
        timing = RequestTiming(now - rng.randint(1, 60) * 10**9, ttft - queue - prefill, queue, prefill,
                               decode_s=rng.uniform(0.5, 1.5), completion_tokens=rng.randint(20, 200))
        engine = engines[model]
        start, end = timing.arrival_unix_ns - 2_000_000, timing.end_unix_ns + 3_000_000
        if 0.005 <= kind < 0.015:  # a client abort: the gateway saw it, no engine span ever comes
            ctx = emit_gateway(gateway, start_unix_ns=start, end_unix_ns=start + 50_000_000, model=model)
            sent.aborts.append(format(ctx.trace_id, "032x"))
            continue
        error = 0.015 <= kind < 0.025

        def call(headers: dict[str, str], timing: RequestTiming = timing, engine=engine, i: int = i) -> None:
            emit_vllm_v1(engine, timing, request_id=f"r{i}", traceparent_headers=headers,
                         params=SamplingParams(max_tokens=4096))

        ctx = emit_gateway(gateway, start_unix_ns=start, end_unix_ns=end, model=model, engine_call=call,
                           status_error=error)
        trace_id = format(ctx.trace_id, "032x")
        (sent.errors if error else sent.outliers if outlier else sent.normal).append(trace_id)
    for provider in (gateway, *engines.values()):
        provider.force_flush()
    return sent
