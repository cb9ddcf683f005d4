"""The kept-trace writer's differential corpus: what the Python reference (``synthesis.kept_trace``)
writes for many kept traces, for ``rust/engine/tests/kept_differential.rs`` to compare the engine's
``KeptWriter`` with, byte for byte and row for row.

Regenerate from the repository's root, with a virtualenv that has otel-llm installed for tests
(``make .venv/.installed-test``); the script runs the Python reference (it sets ``OTEL_LLM_CORE=python``
itself: the compiled core is not used) and writes the same bytes each time it runs:

    .venv/bin/python rust/engine/tests/data/kept/generate.py

The traces, each kept under one or more of the redactions below (``stage.redaction_of`` of a
configuration, or a ``Redaction`` made directly), a policy and a threshold:

- every engine fixture (``tests/support/engine_fixtures.py``) and every emitter capture
  (``tests/testdata``), and the bench's fleet workload: the spans as the engine buffers them (each
  span's bytes as received, its resource's and scope's bytes), their records made by the reference
  (the records corpus's ``traces_of`` and ``records_of_trace``: ``../records/generate.py``);
- seeded random traces of hostile spans: every attribute value type, nested arrays and maps with
  repeated keys, non-ASCII and astral text, URLs with userinfo, the float notations (halfway cases
  included), events (content events among them) and links, trace states, status messages with and
  without an ``error.type`` to reduce them to, resources and scopes with attributes of any key and
  entity refs, and bytes no serializer writes (fields out of order or sent twice, defaults written,
  unknown fields, int32 varints past 32 bits, repeated keys, values with two fields), with records
  of every bridge attribute, segment names and times (negative ones: Python raises);
- byte-level mutations of the bench's spans (bits flipped, bytes dropped, inserted, cut short).

Each case says what the reference did: the request (``SerializeToString()``, hex), its span count,
its rows (``span_row``'s 11 values) and the redaction counts by reason, or the exception it raised.
``may_decline`` names what in its input the engine leaves to Python (the spans' oddities this
script put there, or found: a repeated key, an attribute value of an unusual shape; ``fuzz`` for a
mutation): a case without it must be written exactly; one where Python raised must be declined.

``units.json.gz`` holds the reference's answers for single rules: ``json.dumps`` of floats,
``fnmatch`` of globs, ``reduced_url`` of URLs.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import random
import re
import struct
import sys
import fnmatch
from pathlib import Path
from typing import Any, cast

os.environ["OTEL_LLM_CORE"] = "python"  # the reference: never the compiled core's fast paths
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[4]
sys.path.insert(0, str(ROOT))

# The traces and records of the records corpus (fixtures, captures, the bench with a fixed clock).
_spec = importlib.util.spec_from_file_location("records_corpus", HERE.parent / "records" / "generate.py")
assert _spec is not None and _spec.loader is not None
records_corpus = importlib.util.module_from_spec(_spec)
sys.modules["records_corpus"] = records_corpus  # its dataclasses look their module up
_spec.loader.exec_module(records_corpus)

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue  # noqa: E402
from opentelemetry.proto.resource.v1.resource_pb2 import Resource  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import Span  # noqa: E402

from otel_llm.internal.wire import decode_varint, encode_varint  # noqa: E402
from otel_llm.pdata.records import RequestRecord, Segment  # noqa: E402
from otel_llm.pdata.spans import BufferedSpan, Origin  # noqa: E402
from otel_llm.processor.llm_metrics.requests import records_of_trace  # noqa: E402
from otel_llm.processor.redaction.config import STATUS_MESSAGE_KEY, RedactionProcessor  # noqa: E402
from otel_llm.processor.redaction.stage import redaction_of  # noqa: E402
from otel_llm.processor.redaction.synthesis import (  # noqa: E402
    ERROR_TYPE_KEY, NO_REDACTION, Redaction, RedactionCounts, kept_trace, reduced_url)
from otel_llm.service.declarations import redaction_json  # noqa: E402

I64 = 2**63

REDACTIONS: dict[str, Redaction] = {
    "default": redaction_of(RedactionProcessor()),
    "allow_content": NO_REDACTION,
    "tight": redaction_of(RedactionProcessor(max_free_text_bytes=16, additional_blocked_keys=["custom.*", "x.secret"],
                                             allowed_keys=["exception.stacktrace", "note.*", "gen_ai.prompt.0"])),
    "no_free_text_rule": redaction_of(RedactionProcessor(max_free_text_bytes=0)),
    "content_events": redaction_of(RedactionProcessor(blocked_event_names=["gen_ai.content.prompt", "event"])),
    # Globs of `?` and runs of `*`, a status message allowed whatever it says.
    "globs": redaction_of(RedactionProcessor(additional_blocked_keys=["x.?ecret*", "*.note", "**.count", "ke?"],
                                             allowed_keys=["otel.status_description", "?rror.*", "url.*"])),
    # The block lists without the allowlist (a Redaction the config does not make): links kept whole.
    "block_lists_only": Redaction(key_prefixes=("gen_ai.prompt", "x."), key_patterns=("custom.*",),
                                  event_names=frozenset({"event"}), max_free_text_bytes=16),
    # The status message's key a metadata URL key: its reduction is counted, the message kept whole.
    "status_url": Redaction(key_prefixes=("gen_ai.prompt",), max_free_text_bytes=32,
                            metadata_keys=frozenset({"url.full", "http.url", STATUS_MESSAGE_KEY, "error.type",
                                                     "service.name"}),
                            url_keys=frozenset({"url.full", "http.url", STATUS_MESSAGE_KEY, "error.type"})),
}
THRESHOLDS = ("", "0", "c", "8")
POLICIES = ("", "errors", "slowest", "é policy")


# --- the request's bytes as the engine keeps them --------------------------------------------------------

def pieces(data: bytes) -> list[tuple[int, int, bytes, bytes]]:
    """(number, wire type, the field's bytes, a length-delimited field's value) of a message's fields."""
    out, at = [], 0
    while at < len(data):
        start = at
        tag, at = decode_varint(data, at)
        number, wire_type, value = tag >> 3, tag & 7, b""
        if wire_type == 2:
            length, at = decode_varint(data, at)
            value = data[at:at + length]
            at += length
        elif wire_type == 0:
            _, at = decode_varint(data, at)
        elif wire_type in (1, 5):
            at += 8 if wire_type == 1 else 4
        else:
            raise ValueError("a group: not in this corpus")
        out.append((number, wire_type, data[start:at], value))
    return out


def _fields(data: bytes) -> list[tuple[int, int, bytes]]:
    return [(number, wire_type, value) for number, wire_type, _, value in pieces(data)]


def received(data: bytes) -> dict[tuple[bytes, bytes], tuple[bytes, bytes, bytes]]:
    """Each span's bytes as received, with its resource's and scope's (each the concatenation of its
    field's occurrences, as ``wire::scan`` keeps them), by (trace id, span id): the last copy."""
    spans: dict[tuple[bytes, bytes], tuple[bytes, bytes, bytes]] = {}
    for number, _, resource_spans in _fields(data):
        if number != 1:
            continue
        fields = _fields(resource_spans)
        resource = b"".join(v for n, w, v in fields if (n, w) == (1, 2))
        for _, _, scope_spans in (f for f in fields if f[:2] == (2, 2)):
            inner = _fields(scope_spans)
            scope = b"".join(v for n, w, v in inner if (n, w) == (1, 2))
            for _, _, span_bytes in (f for f in inner if f[:2] == (2, 2)):
                span = Span.FromString(span_bytes)
                spans[(span.trace_id, span.span_id)] = (span_bytes, resource, scope)
    return spans


# --- cases ---------------------------------------------------------------------------------------------

class Unrepresentable(Exception):
    """A record the engine's `Record` cannot hold (the engine never hands such a one to the writer)."""


def _floats(value: Any) -> str | None:
    if value is None:
        return None
    if type(value) is not float:
        raise Unrepresentable(f"not a float: {value!r}")
    return repr(value)


def _int(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not -I64 <= value < I64:
        raise Unrepresentable(f"not an int64: {value!r}")
    return value


def _texts(values: Any) -> list[str]:
    if type(values) is not tuple or any(type(v) is not str for v in values):
        raise Unrepresentable(f"not a tuple of str: {values!r}")
    return list(values)


def record_json(record: RequestRecord) -> dict[str, Any]:
    """What the writer reads of a record, as the engine's `Record` holds it."""
    for name in ("outcome", "model_source", "side", "provider_name", "operation_source", "operation_name",
                 "request_model"):
        if type(getattr(record, name)) is not str:
            raise Unrepresentable(f"{name}: {getattr(record, name)!r}")
    segments = []
    for segment in record.segments:
        name, start, end = segment
        if type(name) is not str or not (-I64 <= start < I64 and -I64 <= end < I64):
            raise Unrepresentable(f"segment {segment!r}")
        segments.append([name, start, end])
    return {"span_id": record.span_id.hex(), "side": record.side, "outcome": record.outcome,
            "model_source": record.model_source, "provider_name": record.provider_name,
            "operation_source": record.operation_source, "operation_name": record.operation_name,
            "request_model": record.request_model, "prompt_tokens": _int(record.prompt_tokens),
            "completion_tokens": _int(record.completion_tokens), "tpot_s": _floats(record.tpot_s),
            "gateway_overhead_s": _floats(record.gateway_overhead_s),
            "client_overhead_s": _floats(record.client_overhead_s),
            "segments_missing": _texts(record.segments_missing), "segments_derived": _texts(record.segments_derived),
            "not_measurable": _texts(record.not_measurable), "segments": segments,
            "joined_span_id": record.joined_span_id.hex() if record.joined_span_id else None}


def repeated_key(payload: bytes) -> bool:
    try:
        keys = [kv.key for kv in Span.FromString(payload).attributes]
    except Exception:  # noqa: BLE001 - bytes Python refuses: its path raises, whatever the keys
        return False
    return len(keys) != len(set(keys))


class Trace:
    """A kept trace's inputs: its spans (bytes as received, resource and scope bytes) and records.
    Equal resource bytes are one ``Resource`` object and equal (resource, scope) bytes one ``Origin``,
    as the spans of one request's resource and scope share theirs."""

    def __init__(self, trace_id: bytes, spans: list[tuple[bytes, bytes, bytes]], records: list[RequestRecord],
                 oddities: set[str]) -> None:
        self.trace_id = trace_id
        self.spans = spans
        self.records = records
        self.oddities = set(oddities)
        if any(repeated_key(payload) for payload, _, _ in spans):
            self.oddities.add("repeated_key")

    def buffered(self) -> list[BufferedSpan]:
        resources: dict[bytes, Resource] = {}
        origins: dict[tuple[bytes, bytes], Origin] = {}
        out = []
        for payload, resource, scope in self.spans:
            origin = origins.get((resource, scope))
            if origin is None:
                message = resources.get(resource)
                if message is None:
                    message = resources[resource] = Resource.FromString(resource)
                origin = origins[(resource, scope)] = Origin(message, InstrumentationScope.FromString(scope), "", {})
            out.append(BufferedSpan(self.trace_id, b"", b"", 0, 0, 0, 0, "", payload, origin, ()))
        return out

    def json(self, origins: dict[tuple[bytes, bytes], int]) -> dict[str, Any]:
        spans = []
        seen: set[bytes] = set()
        for index, (payload, resource, scope) in enumerate(self.spans):
            try:
                span = Span.FromString(payload)
                ids = (span.span_id, span.parent_span_id, int(span.kind), span.start_time_unix_nano,
                       span.end_time_unix_nano, span.trace_state)
            except Exception:  # noqa: BLE001 - a mutated span: held as received under an id of its own
                ids = (b"", b"", 0, 0, 0, "")
            span_id, parent, kind, start, end, trace_state = ids
            if len(span_id) != 8 or span_id in seen:
                span_id = struct.pack(">Q", 0xFEED000000000000 + index)  # the engine's slot id: unique in the trace
            seen.add(span_id)
            spans.append({"payload": payload.hex(), "origin": origins.setdefault((resource, scope), len(origins)),
                          "span_id": span_id.hex(), "parent": parent.hex() if len(parent) == 8 else None,
                          "kind": kind, "start": start, "end": end, "trace_state": trace_state})
        return {"trace_id": self.trace_id.hex(), "spans": spans, "records": [record_json(r) for r in self.records]}


def expected(trace: Trace, redaction: Redaction, policy: str, threshold: str) -> dict[str, Any]:
    counts = RedactionCounts()
    try:
        request, count, rows = kept_trace(trace.buffered(), trace.records, policy, threshold, redaction, counts)
        data = request.SerializeToString()
    except Exception as exc:  # noqa: BLE001 - which exception Python's path raises: the engine must decline
        return {"raises": type(exc).__name__}
    for row in rows:
        assert [type(v) for v in row] == [str, str, str, str, int, str, int, int, int, str, str], row
    return {"request": data.hex(), "spans": count, "rows": [list(row) for row in rows],
            "counts": [n for _, n in counts.by_reason()]}


class Corpus:
    def __init__(self, name: str) -> None:
        self.name = name
        self.traces: list[dict[str, Any]] = []
        self.cases: list[dict[str, Any]] = []
        self.origins: dict[tuple[bytes, bytes], int] = {}
        self.skipped = 0

    def add(self, label: str, trace: Trace, settings: list[tuple[str, str, str]]) -> None:
        """The trace, kept under each (redaction, policy, threshold)."""
        try:
            inputs = trace.json(self.origins)
        except Unrepresentable:
            self.skipped += 1
            return
        self.traces.append(inputs)
        for redaction, policy, threshold in settings:
            self.cases.append({"name": label, "trace": len(self.traces) - 1, "redaction": redaction,
                               "policy": policy, "threshold": threshold, "may_decline": sorted(trace.oddities),
                               "expected": expected(trace, REDACTIONS[redaction], policy, threshold)})

    def write(self) -> None:
        raised = sum("raises" in c["expected"] for c in self.cases)
        body = {"generated_by": "rust/engine/tests/data/kept/generate.py",
                "redactions": {name: redaction_json(r) for name, r in REDACTIONS.items()},
                "origins": [[r.hex(), s.hex()] for r, s in self.origins], "traces": self.traces, "cases": self.cases}
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False) + "\n"
        path = HERE / f"{self.name}.json.gz"
        # No time in the gzip header: the same corpus, the same bytes.
        path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
        print(f"{path.name}: {len(self.traces)} traces, {len(self.cases)} cases, {raised} raised, "
              f"{self.skipped} unrepresentable, {len(text) // 1024} KiB, {path.stat().st_size // 1024} KiB compressed")


def settings_for(rng: random.Random, count: int) -> list[tuple[str, str, str]]:
    names = sorted(REDACTIONS)
    return [(rng.choice(names), rng.choice(POLICIES), rng.choice(THRESHOLDS)) for _ in range(count)]


def traces_of_request(data: bytes, settings_name: str) -> list[Trace]:
    """The request's traces as the engine buffers them, their records made by the reference."""
    by_id = received(data)
    traces = []
    for pending in records_corpus.traces_of(data, settings_name):
        try:
            records = records_of_trace(pending, records_corpus.SETTINGS[settings_name], [])
        except Exception:  # noqa: BLE001 - a trace whose records Python's path fails to make: kept without
            records = []
        spans = [by_id[(pending.trace_id, span_id)] for span_id in pending.spans]
        traces.append(Trace(pending.trace_id, spans, records, set()))
    return traces


def fixtures_and_captures() -> Corpus:
    corpus = Corpus("fixtures")
    rng = random.Random(1)
    requests_: dict[str, bytes] = {f"fixture:{name}": builder().SerializeToString()
                                   for name, builder in sorted(records_corpus.F.BUILDERS.items())}
    testdata = ROOT / "tests" / "testdata"
    for path in sorted(testdata.rglob("*.binpb")):
        if ".metrics." not in path.name and ".logs." not in path.name:
            requests_[f"capture:{path.parent.name}/{path.name}"] = path.read_bytes()
    for label, data in requests_.items():
        for index, trace in enumerate(traces_of_request(data, "bench")):
            settings = [("default", "errors", "8"), ("tight", "", "c")] + settings_for(rng, 2)
            corpus.add(f"{label}#{index}", trace, settings)
    return corpus


def bench_corpus() -> Corpus:
    corpus = Corpus("bench")
    rng = random.Random(2)
    for upstream in (False, True):
        for index, batch in enumerate(records_corpus.bench_generate(1, seed=21 + upstream, upstream_parent=upstream,
                                                                    min_spans=400, max_spans=500)):
            for number, trace in enumerate(traces_of_request(batch.payload, "bench")):
                corpus.add(f"bench:{upstream}:{index}#{number}", trace, settings_for(rng, 2))
    return corpus


# --- random hostile traces ------------------------------------------------------------------------------

KEYS = [
    "gen_ai.request.model", "gen_ai.response.model", "gen_ai.operation.name", "gen_ai.usage.input_tokens",
    "gen_ai.prompt", "gen_ai.prompt.0", "gen_ai.completion.0.content", "llm.input_messages", "input.value",
    "url.full", "http.url", "url.path", "http.route", "server.address", "exception.stacktrace",
    "custom.note", "custom.count", "note.text", "x.secret", "x.Secret2", "", "ключ", "🔑.key", "otel_llm.outcome",
    "gen_ai.usage.output_tokens", "otel_llm.time_per_output_token", "traceloop.entity.input", "error.type",
    "service.name", "host.name", "process.command_line", "llm.openai.messages.0", "key", "kéy",
    "otel.status_description", "gen_ai.provider.name", "otel_llm.sampling.policy",
]
STATUS_MESSAGES = ["", "boom", "é", "Error code: 400 - {'messages': [{'content': 'a prompt, quoted'}]}",
                   "https://user:pw@host/x?q=1", "x" * 40]
# Halfway doubles: two shortest strings read back, Python writes the even last digit.
HALFWAY = [767159875298070.25, 5e-324 * 3, 0.3125 + 2**40, 9007199254740.0625, 1125899906842624.5 / 8]
FLOATS = [0.0, -0.0, 1.0, 1.5, 1e16, 1e15, 123456789012345678.0, 1e-4, 1e-5, 0.00012345, 5e-324,
          1.7976931348623157e308, -2.5e-7, 0.1, 100.0, math.nan, math.inf, -math.inf, 1e22, 9.999999999999999e15,
          *HALFWAY]
TEXTS = ["", "m", "Qwen/Qwen2-7B", "é", "日本語", "🦙 emoji", 'quote " and \\ back', "tab\tnew\nline\r\x00\x1f\x7f",
         "\u2028\u2029", "\x08\x0c", "x" * 15, "y" * 16, "z" * 17, "é" * 9, "long " * 40,
         "https://user:pw@host.example/v1/chat?key=secret#frag", "https://host/v1/chat", "http://a@b@c/d?e",
         "no-scheme/path?q=1", "https://host?x", "ftp://host#f", "https://u@h", "//u@h/p"]
URLS = [t for t in TEXTS if "/" in t or "?" in t or "#" in t]


def value_of(rng: random.Random, depth: int = 0) -> AnyValue:
    value = AnyValue()
    kind = rng.randrange(9 if depth < 2 else 6)
    if kind == 0:
        value.string_value = rng.choice(TEXTS)
    elif kind == 1:
        value.int_value = rng.choice([0, 1, -1, 7, 2**31, -2**63, 2**63 - 1, rng.randrange(-10**12, 10**12)])
    elif kind == 2:
        value.double_value = (rng.choice(FLOATS) if rng.random() < 0.6
                              else rng.uniform(-1e6, 1e6) * 10 ** rng.randrange(-12, 20) if rng.random() < 0.7
                              else struct.unpack("<d", rng.randbytes(8))[0])
    elif kind == 3:
        value.bool_value = rng.random() < 0.5
    elif kind == 4:
        value.bytes_value = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 24)))
    elif kind == 5:
        pass  # an empty value
    elif kind in (6, 7):
        value.array_value.values.extend(value_of(rng, depth + 1) for _ in range(rng.randrange(0, 4)))
        if not value.array_value.values:
            value.array_value.SetInParent()
    else:
        for _ in range(rng.randrange(0, 4)):
            kv = value.kvlist_value.values.add(key=rng.choice(["a", "b", "", "é"]))
            if rng.random() < 0.8:
                kv.value.CopyFrom(value_of(rng, depth + 1))
        if not value.kvlist_value.values:
            value.kvlist_value.SetInParent()
    return value


def key_value(rng: random.Random, key: str) -> KeyValue:
    kv = KeyValue(key=key)
    if key in ("url.full", "http.url", "error.type") and rng.random() < 0.6:
        kv.value.string_value = rng.choice(URLS)
    elif rng.random() < 0.95:
        kv.value.CopyFrom(value_of(rng))
    return kv


def hostile_span(rng: random.Random, trace_id: bytes, span_id: bytes) -> Span:
    span = Span(trace_id=trace_id, span_id=span_id, name=rng.choice(["chat", "llm_request", "é", ""]),
                kind=cast(Any, rng.choice([0, 1, 2, 3, -1, 5])),  # -1 and 5: open enum values no SDK sends
                start_time_unix_nano=rng.choice([0, 1_700_000_000_000_000_000, 2**64 - 1]),
                end_time_unix_nano=rng.choice([0, 1_700_000_001_000_000_000, 2**63 + 5]),
                trace_state=rng.choice(["", "ot=th:8", "vendor=1,ot=th:c", "a=b,,ot=x;y,c=d", ",", "x=1"]))
    if rng.random() < 0.3:
        span.parent_span_id = rng.randbytes(8)
    if rng.random() < 0.6:
        span.status.code = cast(Any, rng.choice([0, 1, 2, -3]))
        span.status.message = rng.choice(STATUS_MESSAGES)
    for key in rng.sample(KEYS, rng.randrange(0, 12)):
        span.attributes.append(key_value(rng, key))
    for _ in range(rng.choice([0, 0, 1, 3])):
        event = span.events.add(name=rng.choice(["gen_ai.content.prompt", "event", "exception", ""]),
                                time_unix_nano=rng.choice([0, rng.randrange(2**40)]))
        for key in rng.sample(KEYS, rng.randrange(0, 4)):
            event.attributes.append(key_value(rng, key))
        event.dropped_attributes_count = rng.choice([0, 0, 2])
    for _ in range(rng.choice([0, 0, 1, 2])):
        link = span.links.add(trace_id=rng.randbytes(16), span_id=rng.randbytes(8), trace_state="l=1",
                              flags=rng.choice([0, 0x101]))
        for key in rng.sample(KEYS, rng.randrange(0, 4)):
            link.attributes.append(key_value(rng, key))
    span.dropped_attributes_count = rng.choice([0, 0, 3])
    span.dropped_events_count = rng.choice([0, 0, 1])
    span.flags = rng.choice([0, 0, 0x100, 0x301])
    return span


def field(tag: int, data: bytes) -> bytes:
    return bytes([tag]) + encode_varint(len(data)) + data


def reordered(data: bytes) -> bytes:
    """The message's top-level fields in reverse order of number (a repeated field's in its own order)."""
    fields = pieces(data)
    numbers = sorted({number for number, _, _, _ in fields}, reverse=True)
    return b"".join(raw for n in numbers for number, _, raw, _ in fields if number == n)


# How a span's bytes are sent: as upb writes them, or as no serializer does. The ways with an
# oddity are the engine's to decline (it may); one span in eight is sent one of those ways.
WRITTEN_WAYS = ["plain", "plain", "plain", "reordered", "defaults written", "field twice", "status twice",
                "unknown fields", "wide varints", "wrong wire type"]
DECLINED_WAYS = [("repeated key", "repeated_key"), ("two value fields", "value_shape"),
                 ("value with unknown field", "value_shape"), ("key twice", "field_twice"), ("strindex", "value_shape")]


def payload_of(rng: random.Random, span: Span) -> tuple[bytes, str, str | None]:
    """The span's bytes, sometimes sent as no serializer writes them; which way, and its oddity."""
    way, oddity = rng.choice(DECLINED_WAYS) if rng.random() < 1 / 8 else (rng.choice(WRITTEN_WAYS), None)
    payload = span.SerializeToString()
    if way == "reordered":
        return reordered(payload), way, None
    if way == "defaults written":  # kind, dropped count and flags 0, an empty status and name
        return payload + b"\x30\x00\x50\x00" + field(0x7A, b"") + field(0x2A, b"") + b"\x85\x01\x00\x00\x00\x00", way, None
    if way == "field twice":  # a second trace id, name and kind: upb keeps the last
        return payload + field(0x0A, b"\x07" * 16) + field(0x2A, "twice".encode()) + b"\x30\x02", way, None
    if way == "status twice":  # merged: the second message's fields over the first's
        return payload + field(0x7A, b"\x18\x01" + field(0x12, "merged".encode())), way, None
    if way == "unknown fields":  # kept as received, after the known fields: in the span, an event, the status
        extra = b"\xa8\x06\x07" + field(0xFA, b"\x01\x02")
        if span.events:
            extra += field(0x5A, b"\xf8\x01\x05" + field(0x12, b"unknown-in-event"))
        extra += field(0x7A, b"\x08\x02\xa0\x01\x01")  # the status's old field 1 and field 20
        return payload + extra, way, None
    if way == "wide varints":  # an int32 kind and a uint32 count past 32 bits: upb keeps the low 32 bits
        return payload + b"\x30" + encode_varint(2**32 + 3) + b"\x60" + encode_varint(2**35 + 9) + b"\x30" + encode_varint(2**64 - 2), way, None
    if way == "wrong wire type":  # a known field number with another wire type: an unknown field
        return payload + b"\x28\x05" + b"\x49" + b"\x00" * 8, way, None
    if way == "repeated key" and span.attributes:
        return payload + field(0x4A, span.attributes[0].SerializeToString()), way, oddity
    if way == "two value fields" and span.attributes:
        bad = KeyValue(key=span.attributes[0].key + "2").SerializeToString() + field(0x12, b"\x18\x01\x10\x01")
        return payload + field(0x4A, bad), way, oddity
    if way == "value with unknown field":
        bad = KeyValue(key="with.unknown").SerializeToString() + field(0x12, b"\x0a\x01x\xa0\x01\x01")
        return payload + field(0x4A, bad), way, oddity
    if way == "key twice":
        bad = field(0x0A, b"first") + field(0x0A, b"second") + field(0x12, b"\x18\x01")
        return payload + field(0x4A, bad), way, oddity
    if way == "strindex":
        bad = KeyValue(key="indexed").SerializeToString() + field(0x12, b"\x40\x03")
        return payload + field(0x4A, bad), way, oddity
    return payload, "plain", None


def hostile_record(rng: random.Random, trace_id: bytes, span_id: bytes) -> RequestRecord:
    record = RequestRecord(trace_id, span_id, "vllm", "vllm", "svc", "m", rng.choice(["span:x", "none", "é"]),
                           rng.choice(["", "req-model", "🦙"]), "", rng.choice(["chat", "text_completion", ""]),
                           rng.choice(["", "vllm"]), rng.choice(["stop", "error", "abort"]),
                           side=rng.choice(["server", "server", "client"]),
                           operation_source=rng.choice(["default", "span"]))
    record.prompt_tokens = rng.choice([None, 0, 12, 2**40, -(2**63), 2**63 - 1])
    record.completion_tokens = rng.choice([None, 5])
    record.tpot_s = rng.choice([None, 0.0125, 1e-5, 3.0, *HALFWAY, math.nan, -0.0])
    record.gateway_overhead_s = rng.choice([None, 0.002, 1e17])
    record.client_overhead_s = rng.choice([None, 1e-7])
    record.segments_missing = rng.choice([(), ("queue",), ("queue", "prefill")])
    record.segments_derived = rng.choice([(), ("decode",)])
    record.not_measurable = rng.choice([(), ("queue", "é")])
    start = rng.choice([1_700_000_000_000_000_000, 0, 2**63 - 2**40])
    record.segments = tuple(Segment(name, start + i, start + i + rng.randrange(10**9))
                            for i, name in enumerate(rng.sample(["queue", "prefill", "decode", "inference", "é", ""],
                                                                rng.randrange(0, 5))))
    if rng.random() < 0.04:
        record.segments = (Segment("queue", -1, 5),)  # out of uint64: Python raises, the engine declines
    if record.side == "client" and rng.random() < 0.5:
        record.joined_span_id = rng.randbytes(8)
    return record


def hostile_origins(rng: random.Random) -> list[tuple[bytes, bytes]]:
    origins = [(Resource(attributes=[KeyValue(key="service.name", value=AnyValue(string_value=name))])
                .SerializeToString(), InstrumentationScope(name=scope).SerializeToString())
               for name, scope in (("vllm", "a"), ("gateway", "b"), ("é", "a"), ("vllm", "b"))]
    origins.append((Resource(attributes=[KeyValue(key="service.name", value=AnyValue(int_value=3))]).SerializeToString(),
                    b""))
    origins.append((b"", b""))
    for index in range(10):  # resources and scopes with attributes of any key and value, a repeated key at times
        resource = Resource(attributes=[key_value(rng, key) for key in rng.sample(KEYS, rng.randrange(1, 6))])
        scope = InstrumentationScope(name="s", version=rng.choice(["", "1.0"]),
                                     attributes=[key_value(rng, key) for key in rng.sample(KEYS, rng.randrange(0, 4))])
        if rng.random() < 0.5:
            resource.attributes.append(key_value(rng, resource.attributes[0].key))
        if index % 3 == 0:
            ref = resource.entity_refs.add(type="service", id_keys=["service.name", ""], description_keys=["x"])
            ref.schema_url = rng.choice(["", "https://opentelemetry.io/schemas/1.30"])
            resource.dropped_attributes_count = 2
            scope.dropped_attributes_count = 1
        resource_bytes, scope_bytes = resource.SerializeToString(), scope.SerializeToString()
        if index % 4 == 1:  # as no serializer writes them: unknown fields, reversed
            resource_bytes = reordered(resource_bytes + b"\xa8\x06\x07")
            scope_bytes = reordered(scope_bytes) + field(0x2A, b"unknown")
        origins.append((resource_bytes, scope_bytes))
    # A resource sent as two occurrences of its field, kept as their bytes one after the other: upb
    # parses them as their merge (attributes of both, the second's dropped count).
    first = Resource(attributes=[key_value(rng, "service.name")], dropped_attributes_count=1).SerializeToString()
    second = Resource(attributes=[key_value(rng, "host.name"), key_value(rng, "custom.note")],
                      dropped_attributes_count=4).SerializeToString()
    origins.append((first + second, InstrumentationScope(name="merged").SerializeToString()))
    return origins


def nested(levels: int) -> bytes:
    """A span whose one attribute's value is arrays nested `levels` deep: upb refuses a message more
    than 100 levels below the one it parses (each array is two: its ArrayValue and its AnyValue).
    Written as bytes: upb would refuse to copy such a message too."""
    value = field(0x0A, b"deep")  # AnyValue.string_value
    for _ in range(levels):
        value = field(0x2A, field(0x0A, value))  # AnyValue.array_value: ArrayValue.values
    span = Span(trace_id=b"\x05" * 16, span_id=b"\x06" * 8, name="deep").SerializeToString()
    return span + field(0x4A, field(0x0A, b"gen_ai.request.model") + field(0x12, value))


def random_corpus(count: int) -> Corpus:
    corpus = Corpus("random")
    rng = random.Random(25)
    origins = hostile_origins(rng)
    names = sorted(REDACTIONS)
    for number in range(count):
        trace_id = rng.randbytes(16)
        spans, records, oddities = [], [], set()
        for _ in range(rng.randrange(1, 5)):
            span_id = rng.randbytes(8)
            payload, _, oddity = payload_of(rng, hostile_span(rng, trace_id, span_id))
            if oddity:
                oddities.add(oddity)
            resource, scope = rng.choice(origins)
            spans.append((payload, resource, scope))
            if rng.random() < 0.6:
                records.append(hostile_record(rng, trace_id, span_id))
        if records and rng.random() < 0.1:
            records.append(hostile_record(rng, trace_id, records[0].span_id))  # a second record of a span: the last counts
        trace = Trace(trace_id, spans, records, oddities)
        corpus.add(f"random#{number}", trace, [(names[number % len(names)], rng.choice(POLICIES),
                                                rng.choice(THRESHOLDS))])
    for levels in range(44, 52):  # around the depth Python's parse refuses
        trace = Trace(b"\x05" * 16, [(nested(levels), *origins[0])], [], set())
        corpus.add(f"nested#{levels}", trace, [("default", "", "")])
    return corpus


def mutations(count: int) -> Corpus:
    """Byte-level mutations of the bench's spans, one span a trace."""
    corpus = Corpus("mutations")
    rng = random.Random(2025)
    spans: list[tuple[bytes, bytes, bytes]] = []
    for batch in records_corpus.bench_generate(1, seed=31, min_spans=100, max_spans=150):
        spans = list(received(batch.payload).values())
    for number in range(count):
        payload, resource, scope = rng.choice(spans)
        data = bytearray(payload)
        for _ in range(rng.randrange(1, 3)):
            at = rng.randrange(len(data))
            how = rng.choice((0, 0, 0, 0, 1, 2, 3))  # mostly bits flipped: more of them still parse
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
        trace = Trace(Span.FromString(payload).trace_id, [(bytes(data), resource, scope)], [], {"fuzz"})
        corpus.add(f"mutation#{number}", trace, [("tight", "errors", rng.choice(THRESHOLDS))])
    return corpus


# --- single rules ------------------------------------------------------------------------------------------

def units() -> None:
    rng = random.Random(7)
    numbers = FLOATS + [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(20000)]
    numbers += [float(f"1e{e}") for e in range(-330, 310)] + [float(f"-1.25e{e}") for e in range(-20, 20)]
    # Halfway cases: doubles with few significant bits past 2**49 (their ulp a power of two below 1).
    numbers += [rng.randrange(2**49, 2**53) / 2 ** rng.randrange(1, 8) for _ in range(6000)]
    numbers += [rng.randrange(1, 2**53) / 2 ** rng.randrange(1, 27) for _ in range(6000)]
    numbers += [float(n) for n in range(-50, 1001)] + [float(rng.randrange(2**bits)) for bits in (60, 1000)
                                                       for _ in range(1000)]
    floats = [[struct.pack("<d", n).hex(), json.dumps(n)] for n in numbers]
    alphabet = "ab.?*xé🔑"
    patterns = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 7))) for _ in range(400)})
    patterns += ["llm.*.messages*", "llm.*.choices*", "custom.*", "*", "**", "?", "*a*b*a*", "a*?*b"]
    keys = sorted({"".join(rng.choice("ab.xé🔑\n") for _ in range(rng.randrange(0, 9))) for _ in range(600)})
    keys += ["llm.openai.messages", "llm.x.choices.0", "llm..messages", "llm.messages", "custom.", "custom",
             "a\nb", "ab"]
    globs = [[pattern, [key for key in keys if re.match(fnmatch.translate(pattern), key)]] for pattern in patterns]
    urls = TEXTS + ["https://a:b@c:8080/p/q?x#y", "https://h/p@q", "http://@h", "https://h#a?b", "x://y@", "://@/",
                    "https://é@ü/ß?ö", "s://a@b@c", "https://h?a#b@c", "a@b://c"]
    body = {"generated_by": "rust/engine/tests/data/kept/generate.py", "floats": floats,
            "globs": globs, "keys": keys, "urls": [[url, reduced_url(url)] for url in urls]}
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False) + "\n"
    path = HERE / "units.json.gz"
    path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    print(f"{path.name}: {len(floats)} floats, {len(globs)} globs x {len(keys)} keys, {len(urls)} URLs, "
          f"{path.stat().st_size // 1024} KiB compressed")


def main() -> None:
    units()
    for make in (fixtures_and_captures, bench_corpus, lambda: random_corpus(2000), lambda: mutations(3000)):
        make().write()


if __name__ == "__main__":
    main()
