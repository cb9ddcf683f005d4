"""The shape table's differential corpus: what Python's ``classify`` makes of many spans, for
``rust/engine/tests/shapes_differential.rs`` to compare the engine's compiled table with.

Regenerate from the repository's root, with a virtualenv that has otel-llm installed for tests
(``make .venv/.installed-test``); it writes the same bytes each time it runs:

    .venv/bin/python rust/engine/tests/data/shapes/generate.py

``table.json`` is ``adapters/shapes.declaration()``: the table both implementations read, the
only place an engine's attribute keys are written. ``spans.json.gz`` holds each span as a
one-span export request (its resource and scope as sent) and ``classify``'s verdict on it: not a
candidate, a candidate no rule claims, a refusal (its reason), a claimed shape with no
observation, or the observation's values by field name as the table's reading gave them (what
``engines.observation_of`` receives, ``None`` and empty lists removed), with the shape's adapter. The spans:
every span of every engine fixture (``tests/support/engine_fixtures.py``) and emitter capture
(``tests/testdata``), the bench's fleet workload, and seeded variants of the candidates among them
with one key the table reads given a hostile value (every AnyValue type, numeric strings, NaN,
huge and negative numbers, empty and nested lists, maps, bytes) or removed.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

os.environ["OTEL_LLM_CORE"] = "python"
ROOT = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span  # noqa: E402

from bench.workload import generate as bench_generate  # noqa: E402
from otel_llm.pdata.observation import MalformedSpan  # noqa: E402
from otel_llm.processor.llm_metrics.adapters import engines, shapes  # noqa: E402
from otel_llm.processor.llm_metrics.adapters.shapes import CANDIDATES, RULES, SHAPES  # noqa: E402
from tests.support import engine_fixtures as F  # noqa: E402

OUT = Path(__file__).resolve().parent

# What the table's reading handed to ``observation_of`` for the span being classified.
_SEEN: list[dict[str, Any]] = []
_observation_of = engines.observation_of


def _watching(shape: shapes.Shape, values: dict[str, Any]) -> Any:
    # None is absent, and so is an empty list (EngineObservation's default for itl_s and derived).
    _SEEN.append({name: value for name, value in values.items() if value is not None and value != ()})
    return _observation_of(shape, values)


engines.observation_of = _watching


def json_value(value: Any) -> Any:
    """A field's value as JSON: floats as their repr (exact), lists element by element."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return value if -2**63 <= value < 2**63 else {"int": str(value)}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    raise TypeError(f"{type(value).__name__}: {value!r}")


def verdict(span: Span) -> dict[str, Any]:
    """``classify``'s verdict, told apart as the engine's ``Reading`` tells it apart."""
    if not CANDIDATES.match(span.kind, span.name):
        return {"verdict": "not_candidate"}
    attrs = engines.attribute_map(span.attributes)
    rule = next((r for r in RULES if engines._matches(r, span, span.kind, span.name, attrs)), None)
    _SEEN.clear()
    try:
        observation, _ = engines.classify(span)
    except MalformedSpan as refusal:
        return {"verdict": "malformed", "reason": refusal.reason}
    except Exception as error:  # noqa: BLE001 - Python's adapter stage passes such a span through, counted
        return {"verdict": "python_error", "error": type(error).__name__}
    if rule is None:
        assert observation is None
        return {"verdict": "unclaimed"}
    assert rule.shape is not None
    shape = SHAPES[rule.shape]
    if observation is None:
        return {"verdict": "no_observation", "adapter": shape.adapter}
    if shape.python_reading:
        return {"verdict": "python_reading", "adapter": shape.adapter}
    if not shape.reads_attributes:
        return {"verdict": "observed", "adapter": shape.adapter, "values": {}}
    assert len(_SEEN) == 1, "one table reading per classified span"
    return {"verdict": "observed", "adapter": shape.adapter,
            "values": {name: json_value(value) for name, value in sorted(_SEEN[0].items())}}


def one_span_requests(data: bytes) -> Iterator[tuple[bytes, Span]]:
    """Each span of ``data`` alone in a request, with its resource and scope."""
    request = ExportTraceServiceRequest.FromString(data)
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                alone = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
                    resource=rs.resource, schema_url=rs.schema_url,
                    scope_spans=[ScopeSpans(scope=ss.scope, schema_url=ss.schema_url, spans=[span])])])
                yield alone.SerializeToString(), span


def requests() -> Iterator[tuple[str, bytes]]:
    builders = cast(dict[str, Any], F.BUILDERS)
    for name, builder in sorted(builders.items()):
        yield f"fixture:{name}", builder().SerializeToString()
    yield "fixture:vllm_old_tokens", F.vllm_request_span(
        token_keys="old", finish_reasons_as="array", span_name_style="llm_request").SerializeToString()
    yield "fixture:vllm_no_events", F.vllm_request_span(token_events=False, cached_tokens=None).SerializeToString()
    for path in sorted((ROOT / "tests" / "testdata").rglob("*.binpb")):
        if ".metrics." in path.name or ".logs." in path.name:
            continue
        yield f"capture:{path.parent.name}/{path.name}", path.read_bytes()
    for index, batch in enumerate(bench_generate(1, seed=5, min_spans=150, max_spans=200)):
        yield f"bench:{index}", batch.payload


# Values a key the table reads may hold.
HOSTILE: tuple[Any, ...] = (
    "", "x", "0.25", " 0.5", "1_0", "1e3", "inf", "-inf", "nan", "NaN", "12", "-3", "0x10", "\u0661\u0662", "٣.5",
    "true", "1.0", "2e400", "１２", 0.25, 0.0, -0.0, 2.0, 3.0, -1.0, 1e12, 1e300, 5e-324, float("nan"),
    float("inf"), float("-inf"), 7, 0, -3, 2**62, 2**63 - 1, -2**63, True, False, ["stop"], [], [["nested"]],
    [0.5], ["length", "stop"], '["stop"]', "[\"stop\"", {"a": 1}, b"\x12\x34", b"", "1.234567ms", "12s",
    "1m2s", "3µs", "4us", "5ns", "1.5h", "12.0s", "-1s")


def value_of(value: Any) -> AnyValue:
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, dict):
        return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=value_of(v)) for k, v in value.items()]))
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[value_of(v) for v in value]))
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(string_value=value)


def table_keys() -> list[str]:
    """Every attribute key the table reads or matches on."""
    keys: set[str] = set()
    for shape in SHAPES.values():
        for _, read in shape.reads:
            keys.update(read.keys)
    for rule in RULES:
        keys.update(rule.present + rule.absent + rule.any_of + rule.true + tuple(k for k, _ in rule.equals))
    keys.update(shapes.CACHE_READ_KEYS + shapes.CACHE_WRITE_KEYS + shapes.SPEC_DECODE_KEYS)
    keys.update(("error.type", "module"))
    return sorted(keys)


def variant(rng: random.Random, span: Span, keys: list[str]) -> Span:
    out = Span()
    out.CopyFrom(span)
    present = [a.key for a in out.attributes if a.key in keys]
    key = rng.choice(present) if present and rng.random() < 0.7 else rng.choice(keys)
    kept = [a for a in out.attributes if a.key != key]
    del out.attributes[:]
    out.attributes.extend(kept)
    if rng.random() < 0.9:
        out.attributes.append(KeyValue(key=key, value=value_of(rng.choice(HOSTILE))))
    if rng.random() < 0.1:
        out.status.code = rng.choice((0, 1, 2))
    return out


def main() -> None:
    (OUT / "table.json").write_text(json.dumps(shapes.declaration(), indent=1, ensure_ascii=False) + "\n")
    cases: list[dict[str, Any]] = []
    candidates: list[tuple[str, bytes, Span]] = []
    for label, data in requests():
        for index, (alone, span) in enumerate(one_span_requests(data)):
            cases.append({"name": f"{label}#{index}", "request": alone.hex(), **verdict(span)})
            if CANDIDATES.match(span.kind, span.name):
                candidates.append((f"{label}#{index}", alone, span))
    rng = random.Random(49)
    keys = table_keys()
    for number in range(6000):
        label, alone, span = rng.choice(candidates)
        changed = variant(rng, span, keys)
        request = ExportTraceServiceRequest.FromString(alone)
        request.resource_spans[0].scope_spans[0].spans[0].CopyFrom(changed)
        cases.append({"name": f"variant:{number}:{label}", "request": request.SerializeToString().hex(),
                      **verdict(changed)})
    text = json.dumps({"generated_by": "rust/engine/tests/data/shapes/generate.py", "cases": cases},
                      separators=(",", ":"), ensure_ascii=False) + "\n"
    path = OUT / "spans.json.gz"
    path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    counts: dict[str, int] = {}
    for case in cases:
        counts[case["verdict"]] = counts.get(case["verdict"], 0) + 1
    print(f"{path.name}: {len(cases)} spans {counts}, {path.stat().st_size // 1024} KiB compressed")


if __name__ == "__main__":
    main()
