"""The engine's end-to-end corpus: configurations as ``engine_declaration`` writes them (the JSON the
binding hands the engine at start-up), export requests, and what the Python reference's pipeline
(``service/graph.py`` ``Pipeline``, ``OTEL_LLM_CORE=python``) exposes for them: its metric
families' text exposition (every bucket; the ``llm_metrics`` recorder as ``/metrics`` serves it)
and its decisions. ``rust/engine/tests/engine_declared.rs`` builds the engine from each
declaration, sends it the same requests, drains it and compares.

Regenerate from the repository's root (``make .venv/.installed-test`` first):

    .venv/bin/python rust/engine/tests/data/engine/generate.py

The scenarios: the embedded default configuration; one with everything the engine runs on (tenant,
cost and SLO accounting, a rate limit, dimensions, LoRA adapters, model-length buckets per
model); both fed every engine fixture of the shapes the engine reads natively and the bench's
fleet workload. Requests are drained (``Pipeline.shutdown``: every pending trace decided), so no
clock decides what is measured.
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

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from bench.workload import generate as bench_generate  # noqa: E402
from otel_llm.component import Kind, Signal  # noqa: E402
from otel_llm.config import config_from_dict  # noqa: E402
from otel_llm.internal import core  # noqa: E402
from otel_llm.processor.llm_metrics.metrics.exposition import RecorderCollector  # noqa: E402
from otel_llm.receiver.otlp.process import IntakeState, ReceiverCounters, spawn_context  # noqa: E402
from otel_llm.service.declarations import engine_declaration  # noqa: E402
from otel_llm.service.graph import Pipeline  # noqa: E402
from otel_llm.service.telemetry import SelfTelemetry  # noqa: E402
from tests.support import engine_fixtures as F  # noqa: E402
from tests.support.engine_run import EVERYTHING  # noqa: E402

assert core.active()[0] is None, "the reference runs without the compiled core"
OUT = Path(__file__).resolve().parent

# The embedded defaults, and everything the engine runs (tests/support/engine_run.py).
SCENARIOS = {"defaults": {}, "everything": EVERYTHING}


def requests() -> list[tuple[str, bytes]]:
    """vLLM's fixture without token events (the events are read by Python), the captures of the
    emitters' clients and gateways, and the bench's fleet workload (vLLM, SGLang, TGI, gateways,
    clients). Triton, Dynamo, llm-d, trtllm and SGLang P/D traces are Python's (the engine declines
    them and the binding hands them to Python), so they are not here."""
    out = [("fixture:vllm_request_span", F.vllm_request_span(token_events=False).SerializeToString())]
    for path in sorted((ROOT / "tests" / "testdata" / "emitters").glob("*.binpb")):
        if ".metrics." not in path.name and ".logs." not in path.name:
            out.append((f"capture:{path.name}", path.read_bytes()))
    out += [(f"bench:{i}", batch.payload) for i, batch in enumerate(bench_generate(3, seed=49))]
    return out


def run(config: dict[str, Any], data: list[tuple[str, bytes]]) -> dict[str, Any]:
    cfg = config_from_dict(config)
    processors = {name: getattr(cfg.processors, name) for name in cfg.running(Kind.PROCESSOR, Signal.TRACES)}
    declaration = engine_declaration(processors, write_kept=False)
    context = spawn_context()
    telemetry = SelfTelemetry(CollectorRegistry(), ReceiverCounters(context))
    pipeline = Pipeline(processors, [], telemetry, IntakeState(context, 10_000_000, 1 << 34))
    for _, payload in data:
        pipeline.buffer(payload)
    pipeline.shutdown(timeout_s=30)
    assert pipeline.metrics is not None
    registry = CollectorRegistry()
    registry.register(RecorderCollector(pipeline.metrics.recorder))
    decisions = {key: int(child._value.get()) for key, child in  # noqa: SLF001 - the counter's own value
                 ((labels, c) for labels, c in telemetry.sampling_decisions._metrics.items())}  # noqa: SLF001
    return {"config": config, "declaration": declaration, "exposition": generate_latest(registry).decode(),
            "decisions": {"/".join(k): v for k, v in sorted(decisions.items())}}


def main() -> None:
    data = requests()
    body = {"generated_by": "rust/engine/tests/data/engine/generate.py",
            "requests": [[label, payload.hex()] for label, payload in data],
            "scenarios": {name: run(config, data) for name, config in SCENARIOS.items()}}
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False) + "\n"
    path = OUT / "corpus.json.gz"
    path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    for name, scenario in body["scenarios"].items():
        samples = sum(1 for line in scenario["exposition"].splitlines() if line and not line.startswith("#"))
        print(f"{name}: {len(data)} requests, {samples} samples, decisions {scenario['decisions']}")
    print(f"{path.name}: {path.stat().st_size // 1024} KiB compressed")


if __name__ == "__main__":
    main()
