"""The compiled core's kept-trace writer (``rust/src/kept.rs`` ``KeptTraceWriter``) against
``synthesis.kept_trace``, the Python reference it stands in for.

For every trace it writes, the export request (compared as deterministic protobuf bytes), the span
count, the store rows (attributes' JSON included, byte for byte) and the redaction counts must be the
Python path's; what it declines (None) the Python path writes, and where Python raises the core must
have declined. Three sources:

- the bench's workload through the real pipeline up to the decision (vLLM, SGLang, TGI, gateways,
  clients; the core's compact spans), under five redaction settings and four trace-state thresholds:
  nothing may be declined there;
- every engine fixture and capture under ``tests/testdata``, their records made by ``records_of_trace``;
- 4 000 random traces of hostile spans (every attribute value type, nested arrays and maps with
  repeated keys, non-ASCII and astral text, URLs with userinfo, the float notations, events and links,
  trace states, status messages with and without an ``error.type`` to reduce them to, resources and
  scopes with attributes of any key, unknown and repeated fields, records with values Python converts
  or refuses), as the Python ``BufferedSpan`` and as the core's: each rule, each decline and each JSON
  notation is met.
"""

from __future__ import annotations

import json
import math
import random
import struct
from decimal import Decimal
import tempfile
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.internal import core as native_core
from otel_llm.pdata.records import RequestRecord, Segment
from otel_llm.pdata.spans import BufferedSpan, Origin
from otel_llm.processor.redaction.config import RedactionProcessor
from otel_llm.processor.redaction.stage import redaction_of
from otel_llm.processor.redaction.synthesis import (
    NO_REDACTION, Redaction, RedactionCounts, kept_trace, native_kept_trace_writer)
from tests.unit.redaction.test_kept_trace_rows import _completed_traces

EXTENSION = native_core.active()[0]
pytestmark = pytest.mark.skipif(EXTENSION is None, reason="the compiled core is not built: nothing to compare")

REDACTIONS: dict[str, Redaction] = {
    "default": redaction_of(RedactionProcessor()),
    "allow_content": NO_REDACTION,
    "tight": redaction_of(RedactionProcessor(max_free_text_bytes=16, additional_blocked_keys=["custom.*", "x.secret"],
                                             allowed_keys=["exception.stacktrace", "note.*", "gen_ai.prompt.0"])),
    "no_free_text_rule": redaction_of(RedactionProcessor(max_free_text_bytes=0)),
    "content_events": redaction_of(RedactionProcessor(blocked_event_names=["gen_ai.content.prompt", "event"])),
    # The block lists without the allowlist (a Redaction the config does not make): links are then kept whole.
    "block_lists_only": Redaction(key_prefixes=("gen_ai.prompt", "x."), key_patterns=("custom.*",),
                                  event_names=frozenset({"event"}), max_free_text_bytes=16),
}
THRESHOLDS = ("", "0", "c", "8")


def _compare(redaction: Redaction, writer: Any, spans: list[Any], records: list[RequestRecord], policy: str,
             threshold: str) -> bool:
    """True when the core wrote the trace (and it is Python's), False when it declined."""
    counts = RedactionCounts()
    try:
        expected = kept_trace(spans, records, policy, threshold, redaction, counts)
    except (ValueError, OverflowError, TypeError, UnicodeError, struct.error, DecodeError) as exc:
        assert writer.build(spans, records, policy, threshold) is None, f"Python raised {exc!r}, the core wrote it"
        return False
    built = writer.build(spans, records, policy, threshold)
    if built is None:
        return False
    payload, count, rows, by_reason = built
    request, expected_count, expected_rows = expected
    written = ExportTraceServiceRequest.FromString(payload)
    assert written.SerializeToString(deterministic=True) == request.SerializeToString(deterministic=True)
    assert count == expected_count
    assert rows == expected_rows
    assert [type(v) for row in rows for v in row] == [type(v) for row in expected_rows for v in row]
    assert tuple(by_reason) == tuple(n for _, n in counts.by_reason())
    return True


@pytest.fixture(scope="module")
def completed_traces() -> list[Any]:
    return _completed_traces()


@pytest.mark.parametrize("redaction_name", sorted(REDACTIONS))
def test_the_bench_workloads_traces_are_written_as_python_writes_them(completed_traces: list[Any],
                                                                      redaction_name: str) -> None:
    redaction = REDACTIONS[redaction_name]
    writer = native_kept_trace_writer(redaction, EXTENSION)
    assert len(completed_traces) > 500
    assert type(completed_traces[0].spans[0]).__module__ == "otel_llm._core"  # the core's compact spans
    segments = 0
    for threshold in THRESHOLDS:
        for index, completed in enumerate(completed_traces):
            policy = ("", "errors", "slowest")[index % 3]
            assert _compare(redaction, writer, completed.spans, completed.records, policy, threshold), \
                completed.trace.trace_id.hex()
            segments += sum(len(r.segments) for r in completed.records)
    assert segments > 4000


def test_every_fixture_and_capture_is_written_as_python_writes_it() -> None:
    from tests.unit.llm_metrics.test_records_fast_path import CORPUS, SETTINGS
    from otel_llm.processor.llm_metrics.requests import records_of_trace

    written = declined = 0
    for name, traces in CORPUS.items():
        for trace in traces:
            records = records_of_trace(trace, SETTINGS["bench"], [])
            spans = list(trace.spans.values())
            for redaction_name in ("default", "tight"):
                redaction = REDACTIONS[redaction_name]
                writer = native_kept_trace_writer(redaction, EXTENSION)
                if _compare(redaction, writer, spans, records, "errors", "8"):
                    written += 1
                else:
                    declined += 1
    print(f"fixtures and captures: {written} written by the core, {declined} declined")
    assert written > 1000
    assert declined < written // 20  # only the hostile captures' repeated keys and odd encodings


# --- random hostile traces ------------------------------------------------------------------------

KEYS = [
    "gen_ai.request.model", "gen_ai.response.model", "gen_ai.operation.name", "gen_ai.usage.input_tokens",
    "gen_ai.prompt", "gen_ai.prompt.0", "gen_ai.completion.0.content", "llm.input_messages", "input.value",
    "url.full", "http.url", "url.path", "http.route", "server.address", "exception.stacktrace",
    "custom.note", "custom.count", "note.text", "x.secret", "", "ключ", "🔑.key", "otel_llm.outcome",
    "gen_ai.usage.output_tokens", "otel_llm.time_per_output_token", "traceloop.entity.input", "error.type",
    "service.name", "host.name", "process.command_line",
]
STATUS_MESSAGES = ["", "boom", "é", "Error code: 400 - {'messages': [{'content': 'a prompt, quoted'}]}"]
FLOATS = [0.0, -0.0, 1.0, 1.5, 1e16, 1e15, 123456789012345678.0, 1e-4, 1e-5, 0.00012345, 5e-324,
          1.7976931348623157e308, -2.5e-7, 0.1, 100.0, math.nan, math.inf, -math.inf, 1e22, 9.999999999999999e15]
TEXTS = ["", "m", "Qwen/Qwen2-7B", "é", "日本語", "🦙 emoji", 'quote " and \\ back', "tab\tnew\nline\r\x00\x1f\x7f",
         "\u2028\u2029", "x" * 15, "y" * 16, "z" * 17, "é" * 9, "long " * 40,
         "https://user:pw@host.example/v1/chat?key=secret#frag", "https://host/v1/chat", "http://a@b@c/d?e",
         "no-scheme/path?q=1", "https://host?x", "ftp://host#f"]


def _value(rng: random.Random, depth: int = 0) -> AnyValue:
    value = AnyValue()
    kind = rng.randrange(9 if depth < 2 else 6)
    if kind == 0:
        value.string_value = rng.choice(TEXTS)
    elif kind == 1:
        value.int_value = rng.choice([0, 1, -1, 7, 2**31, -2**63, 2**63 - 1, rng.randrange(-10**12, 10**12)])
    elif kind == 2:
        value.double_value = rng.choice(FLOATS) if rng.random() < 0.7 else rng.uniform(-1e6, 1e6) * 10 ** rng.randrange(-12, 20)
    elif kind == 3:
        value.bool_value = rng.random() < 0.5
    elif kind == 4:
        value.bytes_value = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 24)))
    elif kind == 5:
        pass  # an empty value
    elif kind in (6, 7):
        value.array_value.values.extend(_value(rng, depth + 1) for _ in range(rng.randrange(0, 4)))
    else:
        for _ in range(rng.randrange(0, 4)):
            kv = value.kvlist_value.values.add(key=rng.choice(["a", "b", "", "é"]))
            if rng.random() < 0.8:
                kv.value.CopyFrom(_value(rng, depth + 1))
    return value


URLS = [t for t in TEXTS if "/" in t or "?" in t or "#" in t]


def _key_value(rng: random.Random, key: str) -> KeyValue:
    kv = KeyValue(key=key)
    if key in ("url.full", "http.url") and rng.random() < 0.6:
        kv.value.string_value = rng.choice(URLS)
    elif rng.random() < 0.95:
        kv.value.CopyFrom(_value(rng))
    return kv


def _span(rng: random.Random, trace_id: bytes, span_id: bytes) -> Span:
    span = Span(trace_id=trace_id, span_id=span_id, name=rng.choice(["chat", "llm_request", "é", ""]),
                kind=rng.choice([0, 1, 2, 3, -1, 5]),
                start_time_unix_nano=rng.choice([0, 1_700_000_000_000_000_000, 2**64 - 1]),
                end_time_unix_nano=rng.choice([0, 1_700_000_001_000_000_000, 2**63 + 5]),
                trace_state=rng.choice(["", "ot=th:8", "vendor=1,ot=th:c", "a=b,,ot=x;y,c=d", ",", "x=1"]))
    if rng.random() < 0.3:
        span.parent_span_id = rng.randbytes(8)
    if rng.random() < 0.5:
        span.status.code = rng.choice([0, 1, 2, -3])
        span.status.message = rng.choice(STATUS_MESSAGES)
    for key in rng.sample(KEYS, rng.randrange(0, 12)):
        span.attributes.append(_key_value(rng, key))
    for _ in range(rng.choice([0, 0, 1, 3])):
        event = span.events.add(name=rng.choice(["gen_ai.content.prompt", "event", "exception", ""]),
                                time_unix_nano=rng.randrange(2**40))
        for key in rng.sample(KEYS, rng.randrange(0, 4)):
            event.attributes.append(_key_value(rng, key))
    for _ in range(rng.choice([0, 0, 1, 2])):
        link = span.links.add(trace_id=rng.randbytes(16), span_id=rng.randbytes(8), trace_state="l=1")
        for key in rng.sample(KEYS, rng.randrange(0, 4)):
            link.attributes.append(_key_value(rng, key))
    span.dropped_attributes_count = rng.choice([0, 0, 3])
    return span


def _field(tag: int, data: bytes) -> bytes:
    length, size = bytearray(), len(data)
    while size > 0x7F:
        length.append(size & 0x7F | 0x80)
        size >>= 7
    length.append(size)
    return bytes([tag]) + bytes(length) + data


def _payload(rng: random.Random, span: Span) -> tuple[bytes, str]:
    """The span's bytes, sometimes sent as no serializer writes them; which way, for the tally."""
    payload = span.SerializeToString()
    way = rng.randrange(10)
    if way == 0 and span.attributes:  # a repeated key
        return payload + _field(0x4A, span.attributes[0].SerializeToString()), "repeated key"
    if way == 1:  # a singular field twice (a second trace id: upb keeps the last)
        return payload + _field(0x0A, b"\x07" * 16), "field twice"
    if way == 2:  # an unknown field, kept as received
        return payload + b"\xa8\x06\x07", "unknown field"
    if way == 3 and span.attributes:  # a value with a field beyond its one value
        kv = span.attributes[0]
        bad = KeyValue(key=kv.key).SerializeToString() + b"\x12\x04\x18\x01\x10\x01"
        return payload + _field(0x4A, bad), "two value fields"
    return payload, "plain"


def _record(rng: random.Random, trace_id: bytes, span_id: bytes) -> RequestRecord:
    record = RequestRecord(trace_id, span_id, "vllm", "vllm", "svc", "m", rng.choice(["span:x", "none", "é"]),
                           rng.choice(["", "req-model"]), "", rng.choice(["chat", "text_completion"]),
                           rng.choice(["", "vllm"]), rng.choice(["stop", "error", "abort"]),
                           side=rng.choice(["server", "server", "client"]),
                           operation_source=rng.choice(["default", "span"]))
    record.prompt_tokens = rng.choice([None, 0, 12, 2**40])
    record.completion_tokens = rng.choice([None, 5])
    record.tpot_s = rng.choice([None, 0.0125, 1e-5, 3.0])
    record.gateway_overhead_s = rng.choice([None, 0.002])
    record.client_overhead_s = rng.choice([None, 1e-7])
    record.segments_missing = rng.choice([(), ("queue",), ("queue", "prefill")])
    record.segments_derived = rng.choice([(), ("decode",)])
    record.not_measurable = rng.choice([(), ("queue",)])
    start = rng.choice([1_700_000_000_000_000_000, 0, 2**63 + 1])
    record.segments = tuple(Segment(name, start + i, start + i + rng.randrange(10**9))
                            for i, name in enumerate(rng.sample(["queue", "prefill", "decode", "inference", "é"],
                                                                rng.randrange(0, 5))))
    odd = rng.randrange(14)
    if odd == 0:
        record.prompt_tokens = 2**70  # past int64: Python raises, the core declines
    elif odd == 1:
        record.tpot_s = 3  # an int where a float is usual: written as an int, as Python does
    elif odd == 2:
        record.outcome = True  # type: ignore[assignment]  # a bool: str() of it, as Python does
    elif odd == 3:
        record.segments = (Segment("queue", -1, 5),)  # out of uint64: Python raises
    elif odd == 4:
        record.provider_name = 5  # type: ignore[assignment]  # not a str: Python's to write
    elif odd == 5:
        record.segments_missing = ["queue"]  # type: ignore[assignment]  # a list, not a tuple
    return record


def _buffered(cls: Any, span: Span, payload: bytes, origin: Origin) -> Any:
    return cls(span.trace_id, span.span_id, span.parent_span_id, span.kind, 0, span.start_time_unix_nano,
               span.end_time_unix_nano, span.trace_state, payload, origin, ())


def test_random_hostile_traces_are_written_as_python_writes_them_or_declined() -> None:
    rng = random.Random(25)
    writers = {name: native_kept_trace_writer(r, EXTENSION) for name, r in REDACTIONS.items()}
    origins = [Origin(Resource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value=name))]),
                      InstrumentationScope(name=scope), name, {})
               for name, scope in (("vllm", "a"), ("gateway", "b"), ("é", "a"))]
    origins.append(Origin(Resource(attributes=[KeyValue(key="service.name", value=AnyValue(int_value=3))]),
                          InstrumentationScope(), "", {}))
    for _ in range(6):  # resources and scopes with attributes of any key and value, a repeated key at times
        resource = Resource(attributes=[_key_value(rng, key) for key in rng.sample(KEYS, rng.randrange(1, 6))])
        scope = InstrumentationScope(name="s", version=rng.choice(["", "1.0"]),
                                     attributes=[_key_value(rng, key) for key in rng.sample(KEYS, rng.randrange(0, 4))])
        if rng.random() < 0.5:
            resource.attributes.append(_key_value(rng, resource.attributes[0].key))
        origins.append(Origin(resource, scope, "", {}))
    tally: dict[str, list[int]] = {}  # way -> [written, declined]
    reasons = [0] * 5
    notations: set[str] = set()
    for _ in range(4000):
        trace_id = rng.randbytes(16)
        spans, records, ways = [], [], []
        for _ in range(rng.randrange(1, 4)):
            span_id = rng.randbytes(8)
            span = _span(rng, trace_id, span_id)
            payload, way = _payload(rng, span)
            ways.append(way)
            cls = BufferedSpan if rng.random() < 0.3 else EXTENSION.BufferedSpan
            spans.append(_buffered(cls, span, payload, rng.choice(origins)))
            if rng.random() < 0.6:
                records.append(_record(rng, trace_id, span_id))
        if records and rng.random() < 0.1:
            records.append(_record(rng, trace_id, records[0].span_id))  # a second record of a span: the last counts
        name = rng.choice(sorted(REDACTIONS))
        written = _compare(REDACTIONS[name], writers[name], spans, records, rng.choice(["", "errors"]),
                           rng.choice(THRESHOLDS))
        way = max(ways, key=["plain", "unknown field", "repeated key", "field twice", "two value fields"].index)
        tally.setdefault(way, [0, 0])[0 if written else 1] += 1
        if written:
            built = writers[name].build(spans, records, "", "")
            reasons = [a + b for a, b in zip(reasons, built[3])]
            notations.update(row[10] for row in built[2])
    print("random traces (written, declined) by the oddest span:", tally, "redactions by reason:", reasons)
    # What is declined among plain spans: records with values Python refuses or converts (above).
    assert tally["plain"][0] > 1200 and tally["unknown field"][0] > 250
    for declined_way in ("repeated key", "field twice", "two value fields"):
        assert tally[declined_way][0] == 0 and tally[declined_way][1] > 50, declined_way
    assert all(count > 20 for count in reasons), reasons  # every rule fired in what the core wrote
    text = " ".join(notations)
    for notation in ("NaN", "Infinity", "-Infinity", "1e+16", "1e-05", "5e-324", "-0.0", "\\u00e9", "\\ud83e\\udd99"):
        assert notation in text, notation


def test_float_notation_is_json_dumps_or_declined_where_two_shortest_strings_read_back() -> None:
    """Where a double lies halfway between two shortest strings, Python writes the even last digit;
    the core declines those (Python writes the trace) and must write every other one as Python does."""
    rng = random.Random(7)
    numbers = FLOATS + [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(20000)]
    numbers += [float(f"1e{e}") for e in range(-330, 310)] + [float(f"-1.25e{e}") for e in range(-20, 20)]
    # Halfway cases: doubles with few significant bits past 2**49 (their ulp a power of two below 1).
    numbers += [rng.randrange(2**49, 2**53) / 8 for _ in range(3000)] + [767159875298070.25, 5e-324 * 3]
    # Integers, which are never halfway (rust/src/kept.rs, ambiguous_shortest), small and large.
    integers = [float(n) for n in range(-50, 1001)] + [float(rng.randrange(2**bits)) for bits in (60, 1000)
                                                       for _ in range(2000)]
    numbers += integers
    declined = []
    for number in numbers:
        written = EXTENSION.json_float_text(number)
        if written is None:
            declined.append(number)
            # exactly halfway: the exact expansion is one digit longer than the shortest, that digit a 5
            shortest = Decimal(repr(abs(number))).normalize().as_tuple().digits
            exact = Decimal(abs(number)).normalize().as_tuple().digits
            assert len(exact) == len(shortest) + 1 and exact[-1] == 5, repr(number)
        else:
            assert written == json.dumps(number), repr(number)
    assert 767159875298070.25 in declined  # .2 and .3 both read back; Python writes .2
    assert not set(integers) & set(declined)
    assert 0 < len(declined) < len(numbers) // 10


def test_the_stage_hands_the_cores_bytes_on_and_the_store_never_parses_them() -> None:
    """Through the real pipeline: kept traces written by the core reach the store as rows, their
    request as bytes that a consumer reading ``request`` parses into the Python path's message."""
    from bench.hotpath import build
    from bench.workload import generate, stamp
    from otel_llm.exporter.store.sqlite import StoreReader
    from otel_llm.pdata.records import KeptTrace
    from otel_llm.processor.llm_metrics.digest import digest_in_process

    with tempfile.TemporaryDirectory() as tmp:
        service, clock = build(Path(tmp))
        pipeline = service.pipeline
        seen: list[KeptTrace] = []
        consumers = pipeline.redaction._consumers
        store = consumers[0]
        consume = store.consume

        def watched(kept: KeptTrace) -> bool:
            seen.append(kept)
            return consume(kept)

        store.consume = watched
        try:
            for batch in generate(2, seed=5):
                pipeline.buffer(stamp(batch, 3), False)
            clock.now += 60.0
            pipeline.assembler.tick()
            assert store.wait_written()
            assert len(seen) > 10
            assert all(k._request is None and k._serialized is not None for k in seen)  # never parsed
            reader = StoreReader(store.store.path)
            for kept in seen[:20]:
                stored = reader.get_trace(kept.trace_id.hex())
                assert stored is not None and stored["span_count"] == kept.spans == len(kept.span_rows or [])
            for kept in seen:  # a consumer that reads the request (an OTLP exporter, debug) gets the message
                assert sum(len(s.spans) for r in kept.request.resource_spans for s in r.scope_spans) == kept.spans
        finally:
            service.components["exporters.store"].shutdown(2.0)


def test_mutated_span_bytes_are_declined_or_written_as_python_writes_them(completed_traces: list[Any]) -> None:
    """A fuzz of the writer's reading: 20 000 byte-level mutations of the bench's spans (bits flipped,
    bytes dropped, inserted, cut short) as the Python ``BufferedSpan``: the core never raises, declines
    what Python refuses, and what it writes is Python's."""
    rng = random.Random(2025)
    redaction = REDACTIONS["tight"]
    writer = native_kept_trace_writer(redaction, EXTENSION)
    spans = [s for c in completed_traces for s in c.spans]
    origin = spans[0].origin
    written = declined = 0
    for _ in range(20_000):
        original = rng.choice(spans)
        data = bytearray(original.payload)
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(data))
            how = rng.randrange(4)
            if how == 0:
                data[at] ^= 1 << rng.randrange(8)
            elif how == 1:
                del data[at]
            elif how == 2:
                data.insert(at, rng.randrange(256))
            else:
                del data[at:]
            if not data:
                data = bytearray(b"\x0a")
        span = BufferedSpan(original.trace_id, original.span_id, original.parent_span_id, original.kind, 0,
                            original.start_unix_ns, original.end_unix_ns, original.trace_state, bytes(data), origin, ())
        if _compare(redaction, writer, [span], [], "errors", rng.choice(THRESHOLDS)):
            written += 1
        else:
            declined += 1
    print(f"mutated spans: {written} written by the core, {declined} declined")
    assert written > 1500 and declined > 1500


def test_the_core_refuses_key_classes_it_does_not_number_as_python_does() -> None:
    with pytest.raises(ValueError, match="key classes"):
        EXTENSION.KeptTraceWriter(lambda key: 0, (0, 1, 2, 3, 7, 8), [], 0, True, "client", "default",
                                  "otel.status_description", "error.type")
