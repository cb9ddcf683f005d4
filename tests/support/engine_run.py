"""The same export requests through the native engine (``otel_llm._core.Engine``, built from
``service/declarations.py``'s declaration of a pipeline's processors) and through the Python
reference's ``Pipeline`` of the same processors, each drained: what each exposes of the
``llm_metrics`` families (the text format, every bucket), and its decisions.

Both run with no clock deciding what is measured: every pending trace is completed by draining
(``Pipeline.shutdown``; the engine's ``drain`` and a tick), so the comparison is exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from prometheus_client import CollectorRegistry, generate_latest

from otel_llm.internal import core
from otel_llm.internal.engine_types import TICK_DECLINED, NativeEngine
from otel_llm.processor.llm_metrics.config import LlmMetricsProcessor
from otel_llm.processor.llm_metrics.digest import DigestSettings, digest_in_process, digest_settings
from otel_llm.processor.llm_metrics.metrics.exposition import RecorderCollector
from otel_llm.receiver.otlp.process import IntakeState, ReceiverCounters, spawn_context
from otel_llm.service.declarations import engine_declaration
from otel_llm.processor.redaction.config import RedactionProcessor
from otel_llm.service.graph import Pipeline
from otel_llm.service.handoff import supplied
from otel_llm.service.telemetry import SelfTelemetry
from tests.support.cores import implementation


# A configuration with everything the engine runs beside the defaults: tenants, cost and SLO
# accounting, a rate limit, dimensions, LoRA adapters, model lengths per model.
EVERYTHING: dict[str, Any] = {"processors": {
    "llm_metrics": {
        "tenant": {"attributes": ["tenant.id"], "values": ["team-a", "team-b"]},
        "cost": {"currency": "USD", "prices": {"Qwen/Qwen3-0.6B": {"input": 0.1, "output": 0.4}}},
        "slo": {"default": {"ttft": "500ms", "e2e": "10s", "target": 0.95}},
        "dimensions": [{"name": "route", "attribute": "http.route", "values": ["/v1/chat/completions"]}],
        "lora_adapters": {"sql-lora": "meta-llama/Llama-3.1-8B-Instruct"},
        "max_model_len_by_model": {"Qwen/Qwen3-0.6B": 2048},
    },
    "tail_sampling": {"rate_limit": {"traces_per_second": 5}},
}}


@dataclass
class Run:
    samples: list[str]  # the exposition's sample lines (no HELP/TYPE), sorted
    kept: int
    dropped: int
    rate_limited: int
    python_requests: int = 0  # requests the engine left to Python: read by the reference digest, supplied
    declined_traces: int = 0


def processors_of(service: Any) -> dict[str, object]:
    """A built ``Service``'s traces-pipeline processors, as ``Pipeline`` takes them."""
    return {path.partition(".")[2]: component.config for path, component in service.components.items()
            if path.startswith("processors.")}


def digest_settings_of(processors: dict[str, object]) -> DigestSettings:
    metrics, redaction = processors.get("llm_metrics"), processors.get("redaction")
    assert isinstance(metrics, LlmMetricsProcessor) and isinstance(redaction, RedactionProcessor)
    return digest_settings(metrics, redaction)


def _samples(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line and not line.startswith("#"))


def engine_run(processors: dict[str, object], requests: Iterable[bytes], shards: int = 1) -> Run:
    extension, why = core.active()
    if extension is None:
        raise RuntimeError(f"the native engine needs the compiled extension ({why})")
    engine = cast(NativeEngine, extension.Engine(
        json.dumps(engine_declaration(processors, write_kept=True, shards=shards))))
    python = 0
    settings = digest_settings_of(processors)
    for data in requests:
        if engine.ingest(data, False, 0.0) is None:
            # Read by the reference digest and handed over, as the pipeline will (service/handoff.py).
            python += 1
            with implementation("python"):  # the reference's BufferedSpans, as the pipeline's Python path makes them
                spans, _ = digest_in_process(data, settings)
            origins, rows = supplied(spans)
            engine.supply(origins, rows, 0.0)
    engine.drain()
    out = engine.tick(0.0)
    counters = engine.counters()
    return Run(_samples(engine.render(False)), counters["kept"], counters["dropped"], counters["rate_limited"],
               python, len(out[TICK_DECLINED]))


def reference_run(processors: dict[str, object], requests: Iterable[bytes]) -> Run:
    with implementation("python"):
        context = spawn_context()
        telemetry = SelfTelemetry(CollectorRegistry(), ReceiverCounters(context))
        pipeline = Pipeline(processors, [], telemetry, IntakeState(context, 10_000_000, 1 << 34))
        for data in requests:
            pipeline.buffer(data)
        pipeline.shutdown(timeout_s=30)
    assert pipeline.metrics is not None, "the engine runs pipelines with llm_metrics"
    registry = CollectorRegistry()
    registry.register(RecorderCollector(pipeline.metrics.recorder))
    outcomes = {"kept": 0, "dropped": 0, "rate_limited": 0}
    for labels, child in telemetry.sampling_decisions._metrics.items():  # noqa: SLF001 - the counter's children
        outcomes[labels[-1]] += int(child._value.get())  # noqa: SLF001
    return Run(_samples(generate_latest(registry).decode()), outcomes["kept"], outcomes["dropped"],
               outcomes["rate_limited"])
