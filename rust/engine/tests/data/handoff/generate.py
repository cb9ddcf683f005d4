"""The hand-off corpus: requests the native engine leaves to Python (``IngestSummary::Python``), what
the reference digest (``digest.py`` ``digest_in_process``) made of each, as the plain data the engine's
``Engine::supply`` takes (``rust/engine/src/handoff.rs`` ``SpansData``: the conversion the binding
makes of each ``BufferedSpan``, written out here as ``spans_data``), and what the reference's
``Pipeline`` exposed for all of them once drained. ``rust/engine/tests/engine_handoff.rs`` builds
the engine from the same declaration, ingests each request (natively where it can), supplies
Python's spans where it cannot, drains, and compares its exposition with the reference's.

Regenerate from the repository's root (``make .venv/.installed-test`` first):

    .venv/bin/python rust/engine/tests/data/handoff/generate.py

The requests: vLLM's request span with its token events (the shape table leaves ``itl_s`` to
Python), the same with a repeated attribute key, the same over the attribute-count limit (Python
trims it and buffers the re-serialized span), and a few native ones beside them (vLLM without
events, the bench's fleet) so that supplied and read traces share the series.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ["OTEL_LLM_CORE"] = "python"
ROOT = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import KeyValue  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from bench.workload import generate as bench_generate  # noqa: E402
from otel_llm.component import Kind, Signal  # noqa: E402
from otel_llm.config import config_from_dict  # noqa: E402
from otel_llm.internal import core  # noqa: E402
from otel_llm.pdata.spans import FIRST_TOKEN_EVENT, BufferedSpan  # noqa: E402
from otel_llm.processor.llm_metrics.adapters.shapes import FIELDS  # noqa: E402
from otel_llm.processor.llm_metrics.digest import digest_in_process  # noqa: E402
from otel_llm.processor.llm_metrics.metrics.exposition import RecorderCollector  # noqa: E402
from otel_llm.receiver.otlp.process import IntakeState, ReceiverCounters, spawn_context  # noqa: E402
from otel_llm.service.declarations import engine_declaration  # noqa: E402
from otel_llm.service.graph import Pipeline  # noqa: E402
from otel_llm.service.handoff import observation_fields  # noqa: E402
from otel_llm.service.telemetry import SelfTelemetry  # noqa: E402
from tests.support import engine_fixtures as F  # noqa: E402

assert core.active()[0] is None, "the reference runs without the compiled core"
OUT = Path(__file__).resolve().parent
# EngineObservation's spec_decode tuple, as the schema's three fields.
KINDS = {field.name: field.kind for field in FIELDS}


def vllm(seed: str, t0_ns: int, **kw: Any) -> ExportTraceServiceRequest:
    return F.vllm_request_span(seed=seed, t0_ns=t0_ns, request_id=f"chatcmpl-{seed}", **kw)


def requests() -> list[tuple[str, bytes]]:
    t0 = F.T0_NS
    events = vllm("events", t0)
    repeated = vllm("repeated", t0 + 10**9)
    span = repeated.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.append(KeyValue(key="gen_ai.request.model", value=span.attributes[0].value))
    span.attributes.append(KeyValue(key="gen_ai.request.model", value=span.attributes[0].value))
    many = vllm("many", t0 + 2 * 10**9, prefill_s=0.2)
    span = many.resource_spans[0].scope_spans[0].spans[0]
    for i in range(200):
        span.attributes.append(KeyValue(key=f"extra.{i}"))
        span.attributes[-1].value.string_value = "x"
    out = [("python:vllm_token_events", events.SerializeToString()),
           ("python:vllm_repeated_key", repeated.SerializeToString()),
           ("python:vllm_over_attribute_limit", many.SerializeToString()),
           ("native:vllm_without_events", vllm("plain", t0 + 3 * 10**9, token_events=False).SerializeToString())]
    out += [(f"native:bench:{i}", batch.payload) for i, batch in enumerate(bench_generate(1, seed=51))]
    return out


def observation_data(observation: Any) -> list[Any] | None:
    """``EngineObservation`` by names (``handoff::ObservationData``), as ``service/handoff.py`` hands
    it to the binding: [adapter, [[field, kind, value]]] of the present fields."""
    fields = observation_fields(observation)
    if fields is None:
        return None
    adapter, values = fields
    return [adapter, [[name, KINDS[name], value] for name, value in values]]


def spans_data(spans: list[BufferedSpan]) -> dict[str, Any]:
    """What the binding hands ``Engine::supply`` (``handoff::SpansData``), bytes as hex."""
    origins: list[Any] = []
    index: dict[int, int] = {}
    rows = []
    for span in spans:
        origin = span.origin
        if id(origin) not in index:
            index[id(origin)] = len(origins)
            origins.append([origin.resource.SerializeToString().hex(), origin.scope.SerializeToString().hex(),
                            origin.service_name])
        attrs_kept = any(key != FIRST_TOKEN_EVENT for key in span.attrs[::2])
        rows.append([span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(), span.kind,
                     span.status_code, span.start_unix_ns, span.end_unix_ns, span.trace_state, span.payload.hex(),
                     index[id(origin)], attrs_kept, observation_data(span.observation)])
    return {"origins": origins, "spans": rows}


def main() -> None:
    data = requests()
    cfg = config_from_dict({})
    processors = {name: getattr(cfg.processors, name) for name in cfg.running(Kind.PROCESSOR, Signal.TRACES)}
    declaration = engine_declaration(processors, write_kept=False)
    context = spawn_context()
    telemetry = SelfTelemetry(CollectorRegistry(), ReceiverCounters(context))
    pipeline = Pipeline(processors, [], telemetry, IntakeState(context, 10_000_000, 1 << 34))
    digested = []
    for _, payload in data:
        spans, _counts = digest_in_process(payload, pipeline.digest_settings)
        digested.append(spans_data(spans))
        pipeline.buffer(payload)
    pipeline.shutdown(timeout_s=30)
    assert pipeline.metrics is not None
    registry = CollectorRegistry()
    registry.register(RecorderCollector(pipeline.metrics.recorder))
    body = {"generated_by": "rust/engine/tests/data/handoff/generate.py", "declaration": declaration,
            "requests": [[label, payload.hex(), spans] for (label, payload), spans in zip(data, digested)],
            "exposition": generate_latest(registry).decode()}
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False) + "\n"
    path = OUT / "corpus.json.gz"
    path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    samples = sum(1 for line in body["exposition"].splitlines() if line and not line.startswith("#"))
    print(f"{len(data)} requests, {sum(len(d['spans']) for d in digested)} spans digested, {samples} samples")
    print(f"{path.name}: {path.stat().st_size // 1024} KiB compressed")


if __name__ == "__main__":
    main()
