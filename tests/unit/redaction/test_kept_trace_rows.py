"""The kept-trace path builds each span once: redaction reads every attribute once for both the
exported span and its store row, segment spans are written as bytes, and the store rows travel with
the kept trace. Each of these must give exactly what the protobuf path gives: the span parsed,
``Redaction.apply``, ``with_trace_state``, ``enrich``, ``add_segment_span``, each resource and scope
through ``Redaction.strip_attributes``, and the store's rows read back from the finished request
(``sqlite._span_rows``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span

from otel_llm.exporter.store.sqlite import _span_rows
from otel_llm.pdata.attributes import any_value_to_python
from otel_llm.pdata.spans import BufferedSpan, Origin
from otel_llm.processor.redaction.config import RedactionProcessor
from otel_llm.processor.redaction.stage import redaction_of
from otel_llm.processor.redaction.synthesis import (
    RedactionCounts, add_segment_span, enrich, kept_trace, with_trace_state)


def _kv(key: str, text: str | None = None, number: int | None = None) -> KeyValue:
    kv = KeyValue(key=key)
    if text is not None:
        kv.value.string_value = text
    if number is not None:
        kv.value.int_value = number
    return kv


def _completed_traces() -> list[Any]:
    """The bench's workload (vLLM, SGLang, TGI, gateways, clients) through the real pipeline, up to
    the decision: every completed trace, kept or not."""
    from bench.hotpath import build
    from bench.workload import generate, stamp
    from otel_llm.processor.llm_metrics.digest import digest_in_process

    with tempfile.TemporaryDirectory() as tmp:
        service, clock = build(Path(tmp))
        pipeline = service.pipeline
        captured: list[Any] = []
        entry = pipeline.assembler._next
        pipeline.assembler._next = type("Capture", (), {"consume_batch": staticmethod(captured.extend)})()
        pipeline.assembler.lane = None  # every trace to the chain's entry (the completion lane would take most)
        for batch in generate(4, seed=3):
            pipeline.assembler.add_batch(digest_in_process(stamp(batch, 1), pipeline.digest_settings)[0])
        clock.now += 1.5
        pipeline.assembler.tick()
        decided: list[Any] = []
        pipeline.redaction.consume_batch = decided.extend  # stop after the decision: this test runs redaction itself
        entry.consume_batch(captured)
        store = service.components.get("exporters.store")
        if store is not None and store.store is not None:
            store.shutdown(2.0)
    return decided


@pytest.fixture(scope="module")
def completed_traces() -> list[Any]:
    traces = _completed_traces()
    assert len(traces) > 500 and any(t.records and t.records[0].segments for t in traces)
    return traces


@pytest.mark.parametrize("threshold", ["", "c"])
def test_kept_trace_is_the_protobuf_path(completed_traces: list[Any], threshold: str) -> None:
    redaction = redaction_of(RedactionProcessor())
    compared_segments = 0
    for completed in completed_traces:
        counts = RedactionCounts()
        request, count, rows = kept_trace(completed.spans, completed.records, "probabilistic", threshold,
                                          redaction, counts)
        # the store's rows: what it reads back from the finished request itself
        assert rows == list(_span_rows(request))
        exported = [span for resource in request.resource_spans for scope in resource.scope_spans
                    for span in scope.spans]
        assert count == len(exported)
        # each engine span: parsed, redacted, stamped and enriched as protobuf messages
        by_span = {r.span_id: r for r in completed.records}
        expected_counts = RedactionCounts()
        origins: dict[int, Any] = {}
        for buffered in completed.spans:
            for message in (buffered.resource, buffered.scope):
                if id(message) not in origins:
                    origins[id(message)] = copy = type(message)()
                    copy.CopyFrom(message)
                    redaction.strip_attributes(copy.attributes, expected_counts)
        resources = {id(b.resource): b.resource for b in completed.spans}  # in the order first met
        assert [r.resource for r in request.resource_spans] == [origins[key] for key in resources]
        originals = []
        for buffered in completed.spans:
            span = Span.FromString(buffered.payload)
            expected_counts += redaction.apply(span)
            with_trace_state(span, threshold)
            record = by_span.get(span.span_id)
            if record is not None:
                enrich(span, record, "probabilistic")
            originals.append(span)
        assert counts == expected_counts
        assert [s for s in exported if s.span_id in {o.span_id for o in originals}] == originals
        # each segment span: as add_segment_span builds it
        reference = ScopeSpans()
        for original in originals:
            record = by_span.get(original.span_id)
            for segment in record.segments if record is not None else ():
                with_trace_state(add_segment_span(reference, original.trace_id, original.span_id, segment),
                                 threshold)
        synthesized = [s for s in exported if s.attributes and s.attributes[0].key == "otel_llm.segment"]
        assert synthesized == list(reference.spans)
        assert all(s.SerializeToString(deterministic=True) == r.SerializeToString(deterministic=True)
                   for s, r in zip(synthesized, reference.spans))
        compared_segments += len(synthesized)
    assert compared_segments > 1000


def _buffered(span: Span) -> BufferedSpan:
    origin = Origin(Resource(attributes=[_kv("service.name", "svc")]), InstrumentationScope(name="s"), "svc", {})
    return BufferedSpan(trace_id=span.trace_id, span_id=span.span_id, parent_span_id=b"", kind=span.kind,
                        status_code=0, start_unix_ns=span.start_time_unix_nano, end_unix_ns=span.end_time_unix_nano,
                        trace_state=span.trace_state, payload=span.SerializeToString(), origin=origin, attrs=())


def test_every_rule_and_a_repeated_key_give_the_same_span_and_row() -> None:
    redaction = redaction_of(RedactionProcessor())
    span = Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="chat", start_time_unix_nano=5,
                end_time_unix_nano=9, trace_state="vendor=1,ot=th:8")
    span.attributes.extend([
        _kv("gen_ai.request.model", "m"),  # metadata text on a GenAI span: kept
        _kv("gen_ai.prompt", "secret prompt"),  # a content key: removed
        _kv("url.full", "https://user:pw@host/v1/chat?key=secret#frag"),  # a URL: reduced
        _kv("custom.note", "free text nobody listed"),  # text under an unknown key: removed
        _kv("custom.count", number=7),  # a number under any key: kept
        _kv("gen_ai.response.model", "x" * 600),  # metadata, but longer than max_free_text_bytes: removed
    ])
    repeated = Span()
    repeated.CopyFrom(span)
    repeated.attributes.append(_kv("gen_ai.request.model", "second"))  # a repeated key
    for source in (span, repeated):
        request, _, rows = kept_trace([_buffered(source)], [], "", "8", redaction, counts := RedactionCounts())
        (exported,) = [s for r in request.resource_spans for sc in r.scope_spans for s in sc.spans]
        kept = {kv.key: any_value_to_python(kv.value) for kv in exported.attributes}
        expected = {"gen_ai.request.model": "second" if source is repeated else "m",
                    "url.full": "https://host/v1/chat", "custom.count": 7}
        assert kept == expected
        assert (counts.content_keys, counts.not_allowed, counts.url_reduced, counts.free_text) == (1, 1, 1, 1)
        assert exported.trace_state == "ot=th:8,vendor=1"
        assert rows == [("01" * 16, "02" * 8, "", "chat", 0, "svc", 5, 9, 0, "", json.dumps(expected))]
