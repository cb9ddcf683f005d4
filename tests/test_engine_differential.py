"""The native engine (``otel_llm._core.Engine``, built from ``service/declarations.py``'s
declaration) against the Python reference's ``Pipeline`` of the same processors, on what users see
of them: the ``llm_metrics`` families as ``/metrics`` serves them (text format, every bucket) and
the decisions. The streams: vLLM's fixture, every emitter capture of a client or gateway, the
bench's fleet workload, seeded random fleets (``bench.workload.generate`` with fresh seeds:
vLLM, SGLang and TGI engines, gateways, clients, errors), and requests the engine leaves to Python
(read by the reference digest and handed to it, ``service/handoff.py``); the configurations: the embedded
defaults and one with everything the engine runs (tenants, cost, SLO objectives, a rate limit,
dimensions, LoRA adapters, model lengths per model). The live vLLM run does the same on what a
real vLLM sent (``tests/live/test_vllm_live.py``, phase 4)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from bench.workload import generate
from otel_llm.component import Kind, Signal
from otel_llm.config import config_from_dict
from tests.support import engine_fixtures as F
from tests.support.engine_run import EVERYTHING, Run, engine_run, reference_run

ROOT = Path(__file__).resolve().parents[1]


def _processors(config: dict[str, Any]) -> dict[str, object]:
    cfg = config_from_dict(config)
    return {name: getattr(cfg.processors, name) for name in cfg.running(Kind.PROCESSOR, Signal.TRACES)}


def _python_read() -> list[bytes]:
    """Requests the engine leaves to Python, read by the reference digest and supplied: vLLM's token
    events, a repeated attribute key, a span over the attribute limit (256 by default)."""
    events = F.vllm_request_span(seed="events")
    repeated = F.vllm_request_span(seed="repeated", token_events=False)
    span = repeated.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.append(KeyValue(key="gen_ai.request.model", value=AnyValue(string_value="again")))
    many = F.vllm_request_span(seed="many", token_events=False)
    span = many.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.extend(KeyValue(key=f"extra.{i}", value=AnyValue(string_value="x")) for i in range(300))
    return [events.SerializeToString(), repeated.SerializeToString(), many.SerializeToString()]


def _streams() -> dict[str, list[bytes]]:
    captures = [p.read_bytes() for p in sorted((ROOT / "tests" / "testdata" / "emitters").glob("*.binpb"))
                if ".metrics." not in p.name and ".logs." not in p.name]
    return {
        "fixtures and captures": [F.vllm_request_span(token_events=False).SerializeToString(), *captures],
        "bench workload": [batch.payload for batch in generate(4, seed=1)],
        "random fleets": [batch.payload for seed in (1049, 2049, 3049) for batch in generate(2, seed=seed)],
        "read by Python and supplied": [*_python_read(), *[batch.payload for batch in generate(1, seed=4049)]],
    }


def _same(engine: Run, reference: Run, what: str) -> None:
    assert engine.declined_traces == 0, what
    assert engine.python_requests == (3 if what == "read by Python and supplied" else 0), what
    missing = sorted(set(reference.samples) - set(engine.samples))
    extra = sorted(set(engine.samples) - set(reference.samples))
    assert not missing and not extra, f"{what}: missing {missing[:8]}, extra {extra[:8]}"
    assert engine.samples == reference.samples, what


@pytest.mark.parametrize("config", [{}, EVERYTHING], ids=["defaults", "everything"])
@pytest.mark.parametrize("stream", list(_streams()))
def test_the_engine_exposes_and_decides_what_the_reference_does(config: dict[str, Any], stream: str) -> None:
    requests = _streams()[stream]
    processors = _processors(config)
    engine, reference = engine_run(processors, requests), reference_run(processors, requests)
    assert len(reference.samples) > 500, f"{stream}: the reference measured {len(reference.samples)} samples"
    _same(engine, reference, stream)
    assert (engine.kept, engine.dropped, engine.rate_limited) == \
        (reference.kept, reference.dropped, reference.rate_limited), stream


def _by_series(samples: list[str]) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in samples}


def test_two_shards_measure_what_one_does() -> None:
    """Shards split the buffer by trace id; what is measured does not depend on them: the same
    series, every count and bucket equal. A histogram's sum is the same up to its last bits: the
    records reach it in another order, and float addition is not associative. (The sampler's order
    across shards may change a decision, so decisions are compared as a total only.)"""
    requests = _streams()["bench workload"]
    processors = _processors(EVERYTHING)
    one, two = engine_run(processors, requests, shards=1), engine_run(processors, requests, shards=2)
    ones, twos = _by_series(one.samples), _by_series(two.samples)
    assert ones.keys() == twos.keys() and len(ones) > 500
    for series, value in ones.items():
        if "_sum{" in series or series.endswith("_sum"):
            assert math.isclose(twos[series], value, rel_tol=1e-12), series
        else:
            assert twos[series] == value, series
    assert one.kept + one.dropped + one.rate_limited == two.kept + two.dropped + two.rate_limited
