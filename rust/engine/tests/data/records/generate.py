"""The request records' differential corpus: what the Python reference makes of many traces, for
``rust/engine/tests/records_differential.rs`` to compare the engine's ``RecordBuilder`` with.

Regenerate from the repository's root, with a virtualenv that has otel-llm installed for tests
(``make .venv/.installed-test``); the script runs the Python reference (it sets ``OTEL_LLM_CORE=python``
itself: the compiled core is not used) and writes the same bytes each time it runs:

    .venv/bin/python rust/engine/tests/data/records/generate.py

Each trace is sent through the real adapter stage (``digest.digest_in_process``: the adapters read
its spans, intake refuses what it refuses, only the configured attributes are kept) and then through
``requests.records_of_trace`` (or, for a late span, ``LlmMetricsStage._records``' reading of it).
The traces: every engine fixture (``tests/support/engine_fixtures.py``), every emitter capture
(``tests/testdata/emitters``, ``tests/testdata/engines/sglang``), the bench's fleet workload, and
seeded random traces composed from those engines' spans under gateways, clients, applications'
SERVER spans and LiteLLM's forwarded traceparent, with hostile attribute values, clocks, upstream
thresholds and statuses, some with their observations' numbers redrawn after intake. The settings
cover each rule naming an engine's model behind its callers: resource rules (mapped, as is, finding
nothing), the service name (and the SDK's ``unknown_service`` placeholders), the opt-out
(``from_service_name: false``) and the default.

The corpus is written as gzipped JSON (``*.json.gz``; the shape table in ``shapes.json``). A case
holds its spans as the engine buffers them (the span's bytes as kept, ids, kind, status, times,
trace state, its resource and scope bytes and service name, its observation by native field name
with its shape, whether the adapter stage kept its attributes for assembly, as the engine's ingest
sets ``SpanSlot::attrs_kept``) and either Python's records (every field) and malformed requests, or
``declined``: the reasons the engine's rules leave this trace to Python, observed while Python read
it (a text it rendered with ``repr``, a string ``float()`` read by its own rules, a finish reason
lowercased beyond ASCII, a non-ASCII upstream trace state, a disaggregated pair, a shape only Python
reads, a time past 64 bits, an exception it raised out of ``records_of_trace``), in the order met.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

os.environ["OTEL_LLM_CORE"] = "python"  # the reference: never the compiled core's fast paths
ROOT = Path(__file__).resolve().parents[5]
sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import (  # noqa: E402
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status  # noqa: E402

import bench.workload as bench_workload  # noqa: E402
from bench.workload import generate as bench_generate  # noqa: E402
from otel_llm.internal import core  # noqa: E402
from otel_llm.pdata.observation import OBSERVATION_FIELDS, EngineObservation, MalformedSpan  # noqa: E402
from otel_llm.pdata.records import RequestRecord, Side  # noqa: E402
from otel_llm.pdata.spans import BufferedSpan, PendingTrace  # noqa: E402
from otel_llm.processor.llm_metrics import digest, requests  # noqa: E402
from otel_llm.processor.llm_metrics.adapters.engines import _NO_ATTRS, SGLANG_STAGES  # noqa: E402
from otel_llm.processor.llm_metrics.digest import (  # noqa: E402
    AttributeLimits, DigestSettings, _strings_of, digest_in_process)
from otel_llm.processor.llm_metrics.requests import (  # noqa: E402
    Dimension, RecordSettings, ResourceModelRule, TenantRule, records_of_trace)
from otel_llm.processor.llm_metrics.stage import _is_client_call  # noqa: E402
from otel_llm.service.declarations import record_settings_json  # noqa: E402
from tests.support import engine_fixtures as F  # noqa: E402

assert core.active()[0] is None, "the reference must run without the compiled core"
# The bench's requests end now: a fixed now makes the same corpus each time (2026-12-07).
class _FixedClock:
    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def time_ns() -> int:
        return 1_796_601_600_000_000_000


setattr(bench_workload, "time", _FixedClock())  # its module's clock only

OUT = Path(__file__).resolve().parent
I64 = 2**63
FIRST_TOKEN_EVENTS = ("gen_ai.first_token", "first_token")
# The engine kinds whose requests only Python reads (composite engines, disaggregated pairs).
PYTHON_KINDS = frozenset({"triton", "trtllm", "dynamo", "llm-d"})

SETTINGS: dict[str, RecordSettings] = {
    "defaults": RecordSettings(),
    "bench": RecordSettings(resource_model_rules=(ResourceModelRule("service.name", {"vllm-qwen-0": "Qwen/Qwen2.5"}),),
                            model_from_service_name=True),
    "everything": RecordSettings(
        default_model="configured", default_operation="chat",
        dimensions=(Dimension("route", "http.route", frozenset({"/v1/chat/completions"})),
                    Dimension("tier", "tier", frozenset({"gold", "silver"}), "rest")),
        tenant=TenantRule(("tenant.id", "gen_ai.request.model"), frozenset({"team-a", "Qwen/Qwen3-0.6B"}), "other"),
        lora_adapters={"sql-lora": "meta-llama/Llama-3.1-8B-Instruct", "m-two": "base-two"}),
    "tight": RecordSettings(
        max_latency_s=0.5, resource_model_rules=(ResourceModelRule("model.id"),
                                                 ResourceModelRule("service.name", {"sglang": "sglang-model"})),
        edge_ttft_attributes=("x-edge-ttft", "gen_ai.server.time_to_first_token"), model_from_service_name=True,
        default_model="fallback"),
    # The opt-out (`model_name.from_service_name: false`) beside resource rules: an engine's record
    # named by neither its span nor a rule takes what its gateway or client named, then the default.
    "opt_out": RecordSettings(
        resource_model_rules=(ResourceModelRule("service.name", {"vllm-qwen-0": "Qwen/Qwen2.5", "sglang": "sg"}),
                              ResourceModelRule("model.id")),
        model_from_service_name=False, default_model="configured"),
}


def digest_settings(settings: RecordSettings) -> DigestSettings:
    """What ``digest.digest_settings`` makes of the configuration these record settings come from."""
    kept = tuple(dict.fromkeys((
        "gen_ai.request.model", "gen_ai.response.model", "http.route", "url.path", "error.type",
        *settings.edge_ttft_attributes, *(d.attribute for d in settings.dimensions),
        *(settings.tenant.attributes if settings.tenant else ()))))
    return DigestSettings(AttributeLimits(64, 2048), settings.max_latency_s, kept, frozenset(FIRST_TOKEN_EVENTS))


DIGEST = {name: digest_settings(settings) for name, settings in SETTINGS.items()}


# --- the observation as the engine holds it ------------------------------------------------------

FLOATS = ("ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "inference_s", "preprocess_s", "tpot_s")
INTS = ("prompt_tokens", "completion_tokens", "max_tokens", "cached_tokens", "cache_write_tokens", "reasoning_tokens")
TEXTS = ("request_model", "response_model", "finish_reason", "operation_name", "provider_name", "server_address",
         "server_port", "error_type", "spec_decode_rejected")
SPEC = ("spec_accepted_tokens", "spec_draft_tokens", "spec_steps")
# The native observation schema: OBSERVATION_FIELDS without what a shape says (engine kind, adapter,
# part, may-be-gateway), speculative decoding as three ints, the marks the records read as fields.
SCHEMA = ([(name, "float") for name in (*FLOATS, "dispatch_to_first_token_s")]
          + [(name, "int") for name in (*INTS, *SPEC)] + [(name, "text") for name in TEXTS]
          + [("is_error", "flag"), ("itl_s", "floats"), ("derived", "texts")])
assert {name for name, _ in SCHEMA} >= set(OBSERVATION_FIELDS) - {
    "engine_kind", "adapter", "part", "may_be_gateway", "spec_decode", "marks"}


class Unrepresentable(Exception):
    """An observation whose values the engine's fields cannot hold (its reader would not make it)."""


class Shapes:
    def __init__(self) -> None:
        self.table: list[dict[str, Any]] = []
        self.index: dict[tuple[str, str, str, bool], int] = {}

    def of(self, obs: EngineObservation) -> int:
        key = (obs.adapter, obs.engine_kind, obs.part, obs.may_be_gateway)
        if key not in self.index:
            self.index[key] = len(self.table)
            self.table.append({"adapter": obs.adapter, "engine_kind": obs.engine_kind, "part": obs.part,
                               "may_be_gateway": obs.may_be_gateway,
                               "python_records": obs.engine_kind in PYTHON_KINDS})
        return self.index[key]


SHAPES = Shapes()


def is_int(value: object) -> bool:
    return type(value) is int and -I64 <= value < I64


def native_observation(span: BufferedSpan) -> dict[str, Any] | None:
    obs = span.observation
    if obs is None:
        return None
    shape = SHAPES.of(obs)
    python_only = SHAPES.table[shape]["python_records"]
    values: dict[str, Any] = {}
    for name in FLOATS:
        value = getattr(obs, name)
        if value is not None:
            if type(value) is not float:
                raise Unrepresentable(f"{name}={value!r}")
            values[name] = repr(value)
    for name in INTS:
        value = getattr(obs, name)
        if value is not None:
            if not is_int(value):
                raise Unrepresentable(f"{name}={value!r}")
            values[name] = value
    for name in TEXTS:
        value = getattr(obs, name)
        if value is not None:
            if not isinstance(value, str):
                raise Unrepresentable(f"{name}={value!r}")
            values[name] = str(value)
    if type(obs.is_error) is not bool:
        raise Unrepresentable(f"is_error={obs.is_error!r}")
    values["is_error"] = obs.is_error
    if obs.spec_decode is not None:
        if not (isinstance(obs.spec_decode, tuple) and len(obs.spec_decode) == 3 and all(map(is_int, obs.spec_decode))):
            raise Unrepresentable(f"spec_decode={obs.spec_decode!r}")
        values.update(zip(SPEC, obs.spec_decode))
    if obs.itl_s:
        if not all(type(v) is float for v in obs.itl_s):
            raise Unrepresentable("itl_s")
        values["itl_s"] = [repr(v) for v in obs.itl_s]
    if obs.derived:
        values["derived"] = list(obs.derived)
    marks = obs.marks
    for key, value in zip(marks[::2], marks[1::2]):
        if key == "dispatch_to_first_token_s":
            if type(value) is float:  # composite.sglang reads only a float
                values["dispatch_to_first_token_s"] = repr(value)
        elif key == "stage":
            if value != Span.FromString(span.payload).name:
                raise Unrepresentable("a stage named otherwise than its span")
        elif not python_only:
            raise Unrepresentable(f"mark {key}")
    return {"shape": shape, "values": values}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def canonical(payload: bytes) -> bytes:
    """The span's bytes with its attributes by key: the adapter stage re-serializes a span from its
    attribute map in upb's hash order, which differs from run to run; every key is there once, so
    any order reads the same (and the corpus is the same bytes each time it is made)."""
    span = Span.FromString(payload)
    keys = [a.key for a in span.attributes]
    assert len(keys) == len(set(keys)), "a buffered span holds each attribute once"
    ordered = sorted(span.attributes, key=lambda a: a.key)
    out = Span()
    out.CopyFrom(span)
    del out.attributes[:]
    out.attributes.extend(ordered)
    return out.SerializeToString()


def case_inputs(trace: PendingTrace, origins: dict[tuple[bytes, bytes, str], int]) -> dict[str, Any]:
    """The trace's spans; their origins (resource, scope, service name) numbered in ``origins``."""
    spans = []
    for span in trace.spans.values():
        resource = span.origin.resource.SerializeToString()
        # The engine reads the resource's strings from its bytes: they must say what Python read.
        assert _strings_of(Resource.FromString(resource))[0] == span.origin.resource_strings
        origin = origins.setdefault((resource, span.origin.scope.SerializeToString(), span.service_name), len(origins))
        spans.append({
            "id": span.span_id.hex(), "parent": span.parent_span_id.hex() or None, "kind": span.kind,
            "status": span.status_code, "start": span.start_unix_ns, "end": span.end_unix_ns,
            "trace_state": span.trace_state, "origin": origin, "payload": b64(canonical(span.payload)),
            "obs": native_observation(span), "attrs_kept": ATTRS_KEPT[id(span)][1],
        })
    return {"trace_id": trace.trace_id.hex(), "spans": spans}


# --- watching the reference for what the engine declines --------------------------------------------

EVENTS: list[str] = []
_PLAIN_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_in_route = [0]
_original_text: Callable[[BufferedSpan, str], str | None] = requests._text
_original_route: Callable[[BufferedSpan], str | None] = requests._route
_original_number: Callable[[BufferedSpan, str], float | None] = requests._number
_original_adjusted: Callable[[str], float] = requests.adjusted_count
_original_build: Callable[..., RequestRecord] = requests.build_record
_Pairing = Callable[[list[BufferedSpan]], dict[bytes, BufferedSpan]]
_original_pair: _Pairing = requests._pair_disaggregated
_original_pair_pd: _Pairing = requests._pair_sglang_pd


def _text(span: BufferedSpan, key: str) -> str | None:
    value = _original_text(span, key)
    if value is not None and not _in_route[0]:
        raw = span.attr(key)
        if isinstance(raw, list):
            raw = raw[0] if raw else None
        if isinstance(raw, (float, list)):
            EVENTS.append("repr_text")  # str() of a double or a list: repr's digits
    return value


def _route(span: BufferedSpan) -> str | None:
    _in_route[0] += 1  # a route is only looked up: no repr of a double or a list is one
    try:
        return _original_route(span)
    finally:
        _in_route[0] -= 1


def _attribute_kind(span: BufferedSpan, key: str) -> str | None:
    kinds = [a.value.WhichOneof("value") for a in Span.FromString(span.payload).attributes if a.key == key]
    return kinds[-1] if kinds else None


def _number(span: BufferedSpan, key: str) -> float | None:
    raw = span.attr(key)
    if isinstance(raw, str) and raw and not _PLAIN_DECIMAL.fullmatch(raw) and \
            _attribute_kind(span, key) == "string_value":  # bytes are kept as their hex, decided either way
        EVENTS.append("number_text")
    return _original_number(span, key)


def _adjusted_count(trace_state: str) -> float:
    if "th:" in trace_state and not trace_state.isascii():
        EVENTS.append("trace_state")
    return _original_adjusted(trace_state)


def _build_record(*args: Any, **kwargs: Any) -> RequestRecord:
    record = _original_build(*args, **kwargs)
    bounds = [record.start_unix_ns] + [t for s in record.segments for t in (s.start_unix_ns, s.end_unix_ns)]
    if not all(-I64 <= t < I64 for t in bounds):
        EVENTS.append("time_range")
    return record


def _pair_disaggregated(engines: list[BufferedSpan]) -> dict[bytes, BufferedSpan]:
    found = _original_pair(engines)
    if found:
        EVENTS.append("disaggregated_pair")
    return found


def _pair_sglang_pd(engines: list[BufferedSpan]) -> dict[bytes, BufferedSpan]:
    found = _original_pair_pd(engines)
    if found:
        EVENTS.append("disaggregated_pair")
    return found


requests._text, requests._route, requests._number = _text, _route, _number
requests.adjusted_count, requests.build_record = _adjusted_count, _build_record
requests._pair_disaggregated, requests._pair_sglang_pd = _pair_disaggregated, _pair_sglang_pd


class Tracked(str):
    """A finish reason whose lowercasing beyond ASCII is noted (the engine declines those)."""

    def lower(self) -> str:
        if not self.isascii():
            EVENTS.append("unicode_case")
        return str.lower(self)


RECORD_FIELDS = [field.name for field in dataclasses.fields(RequestRecord)]


def record_json(record: RequestRecord) -> list[Any]:
    """Every field, in ``RECORD_FIELDS``' order: ids in hex, floats as ``repr``, segments as lists."""
    out: list[Any] = []
    for field in dataclasses.fields(RequestRecord):
        value = getattr(record, field.name)
        if isinstance(value, bytes):
            value = value.hex()
        elif field.name == "segments":
            value = [[s.name, s.start_unix_ns, s.end_unix_ns] for s in value]
        elif isinstance(value, float):
            value = repr(value)
        elif isinstance(value, tuple):
            value = [repr(v) if isinstance(v, float) else str(v) for v in value]
        elif isinstance(value, str):
            value = str(value)
        out.append(value)
    return out


def expected(trace: PendingTrace, settings: RecordSettings, late: bool) -> dict[str, Any]:
    """Python's reading of the trace: records and malformed requests, or what the engine declines."""
    for span in trace.spans.values():
        obs = span.observation
        if obs is not None and isinstance(obs.finish_reason, str) and not obs.finish_reason.isascii():
            obs.finish_reason = Tracked(obs.finish_reason)
    EVENTS.clear()

    def python_shapes() -> None:
        """Python reads the trace with a span of a shape only it reads: the engine declines it."""
        if any(s.observation is not None and SHAPES.table[SHAPES.of(s.observation)]["python_records"]
               for s in trace.spans.values()):
            EVENTS.append("python_shape")

    malformed: list[tuple[str, str]] = []
    try:
        if late:  # LlmMetricsStage._records for completed.late
            (span,) = trace.spans.values()
            client = not span.is_engine and _is_client_call(span)
            records = []
            if span.is_engine or client:
                python_shapes()
                records = records_of_trace(trace, settings, malformed)
            if client:
                records = [r for r in records if r.side == Side.CLIENT]
        else:
            python_shapes()
            records = records_of_trace(trace, settings, malformed)
    except MalformedSpan:
        EVENTS.append("uncaught")
    except (OverflowError, ValueError):  # round() of an infinite offset
        EVENTS.append("time_range")
    if EVENTS:
        return {"declined": list(EVENTS)}
    return {"records": [record_json(r) for r in records], "malformed": [list(m) for m in malformed]}


# --- traces --------------------------------------------------------------------------------------------

# Whether the adapter stage kept each span's attributes for assembly (the engine's ingest says so
# in ``SpanSlot::attrs_kept``): not of a span ``classify`` does not read (no candidate) or reads no
# attribute of (an SGLang stage), nor of one intake refuses (``MalformedSpan``). Noted as
# ``_digest`` reads each span, once and in order; by the buffered span, held so its id stays its own.
_KEPT: list[bool] = []
ATTRS_KEPT: dict[int, tuple[BufferedSpan, bool]] = {}
_original_read_checked: Callable[[Any, float], tuple[Any, Any]] = digest._read_checked


def _read_checked(span: Any, max_latency: float) -> tuple[Any, Any]:
    try:
        observation, attrs = _original_read_checked(span, max_latency)
    except MalformedSpan:
        _KEPT.append(False)
        raise
    _KEPT.append(attrs is not _NO_ATTRS)
    return observation, attrs


digest._read_checked = _read_checked


def traces_of(data: bytes, settings_name: str) -> list[PendingTrace]:
    """The request's spans filed by trace as the assembler files them (a later copy replaces in place)."""
    _KEPT.clear()
    spans, _ = digest_in_process(data, DIGEST[settings_name])
    assert len(spans) == len(_KEPT), "one reading per buffered span"
    for span, kept in zip(spans, _KEPT):
        ATTRS_KEPT[id(span)] = (span, kept)
    traces: dict[bytes, PendingTrace] = {}
    for span in spans:
        traces.setdefault(span.trace_id, PendingTrace(span.trace_id, 0.0)).spans[span.span_id] = span
    return list(traces.values())


class Corpus:
    def __init__(self, name: str) -> None:
        self.name = name
        self.cases: list[dict[str, Any]] = []
        self.origins: dict[tuple[bytes, bytes, str], int] = {}
        self.skipped = 0

    def add(self, label: str, trace: PendingTrace, settings_name: str, late: bool = False) -> None:
        try:
            inputs = case_inputs(trace, self.origins)
        except Unrepresentable:
            self.skipped += 1
            return
        self.cases.append({"name": label, "settings": settings_name, "late": late, **inputs,
                           "expected": expected(trace, SETTINGS[settings_name], late)})

    def add_request(self, label: str, data: bytes, settings_names: list[str]) -> None:
        for settings_name in settings_names:
            for index, trace in enumerate(traces_of(data, settings_name)):
                self.add(f"{label}#{index}", trace, settings_name)

    def write(self) -> None:
        declined = sum("declined" in c["expected"] for c in self.cases)
        records = sum(len(c["expected"].get("records", ())) for c in self.cases)
        body = {"generated_by": "rust/engine/tests/data/records/generate.py", "schema": SCHEMA,
                "settings": {name: record_settings_json(s, list(FIRST_TOKEN_EVENTS)) for name, s in SETTINGS.items()},
                "record_fields": RECORD_FIELDS, "origins": [[b64(r), b64(s), n] for r, s, n in self.origins],
                "cases": self.cases}
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False) + "\n"
        # Compressed (a tenth of the size), with no time in the header: the same corpus, the same bytes.
        path = OUT / f"{self.name}.json.gz"
        path.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
        print(f"{path.name}: {len(self.cases)} traces, {records} records, {declined} declined, "
              f"{self.skipped} unrepresentable, {len(text) // 1024} KiB, {path.stat().st_size // 1024} KiB compressed")


ALL = list(SETTINGS)


def fixtures() -> Corpus:
    corpus = Corpus("fixtures")
    builders = cast(dict[str, Callable[[], ExportTraceServiceRequest]], F.BUILDERS)
    requests_ = {name: builder().SerializeToString() for name, builder in builders.items()}
    requests_["dynamo_request_disagg"] = F.dynamo_request(disaggregated=True).SerializeToString()
    requests_["llmd_mooncake"] = F.llmd_disaggregated(connector="mooncake").SerializeToString()
    requests_["vllm_old_tokens"] = F.vllm_request_span(token_keys="old", finish_reasons_as="array",
                                                       span_name_style="llm_request").SerializeToString()
    requests_["vllm_no_events"] = F.vllm_request_span(token_events=False, cached_tokens=None).SerializeToString()
    requests_["vllm_under_parent"] = F.vllm_request_span(parent=(F.trace_id("p"), F.span_id("p"))).SerializeToString()
    for name, data in sorted(requests_.items()):
        corpus.add_request(f"fixture:{name}", data, ALL)
    return corpus


def captures() -> Corpus:
    corpus = Corpus("captures")
    testdata = ROOT / "tests" / "testdata"
    for path in sorted(testdata.rglob("*.binpb")):
        if ".metrics." in path.name or ".logs." in path.name:
            continue
        corpus.add_request(f"capture:{path.parent.name}/{path.name}", path.read_bytes(), ALL)
    return corpus


def bench_corpus() -> Corpus:
    corpus = Corpus("bench")
    for upstream in (False, True):
        for index, batch in enumerate(bench_generate(1, seed=11 + upstream, upstream_parent=upstream,
                                                     min_spans=150, max_spans=200)):
            for settings_name in ("bench", "tight") if upstream else ("bench", "everything"):
                corpus.add_request(f"bench:{upstream}:{index}", batch.payload, [settings_name])
    return corpus


# --- random traces ------------------------------------------------------------------------------------------

MODELS = ("Qwen/Qwen3-0.6B", "m-two", "sql-lora", "", "meta-llama/Llama-3.1-8B-Instruct")
OPERATIONS = ("chat", "text_completion", "embeddings", "acompletion", "", "completion")
ROUTES = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/generate", "/generate_stream",
          "/v1/embeddings", "/health", "", "/v1/models")
FINISH = ("stop", "STOP", "length", "Length", "abort", "cancelled", "eos", "end_turn", "max_tokens", "error", "weird",
          "\u017ftop", "\u0130", "max_to\u212aens", "")
TRACE_STATES = ("ot=th:8", "ot=th:0", "ot=th:fffff", "ot=th:ffffff", "ot=th:4", "vendor=a", "ot=th:zz", "ot=p:3",
                "ot=th:", "ot=th:123456789abcdef", " ot=th:c;rv:abcdef01234567 ", "x=y,ot=th:C", "ot=th:8\u2003",
                "ot=th:78e5107311d8a4", "ot=rv:ab;th:c0", "\x1cot=th:8")
SERVICES = ("gateway", "vllm-qwen-0", "vllm-llama-1", "sglang", "tgi", "unknown_service:python", "", "app",
            "unknown_service", "unknown_service:java")
# Values an attribute the records read may hold: texts, numbers of every type, lists, maps, bytes.
HOSTILE: tuple[Any, ...] = (
    "/v1/chat/completions", "/generate", "", "x", "Timeout", "team-a", "gold", "0.25", " 0.5", "1_0", "inf", "junk",
    0.25, 0.0, 2.0, -1.0, 1e12, float("nan"), float("inf"), 7, -3, 2**62, True, False, ["/v1/completions"], [],
    [["nested"]], [0.5], {"a": 1}, b"\x12\x34", b"\xab", b"")
HOSTILE_KEYS = ("http.route", "url.path", "error.type", "gen_ai.server.time_to_first_token", "x-edge-ttft", "tenant.id",
                "tier", "gen_ai.request.model")


def value_of(value: Any) -> AnyValue:
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, dict):
        return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=value_of(v)) for k, v in value.items()]))
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[value_of(v) for v in value]))
    return F.any_value(value)


def set_attribute(span: Span, key: str, value: Any) -> None:
    for kv in span.attributes:
        if kv.key == key:
            kv.value.CopyFrom(value_of(value))
            return
    span.attributes.add(key=key, value=value_of(value))


@dataclasses.dataclass
class Piece:
    """A span with the resource it is sent under."""

    span: Span
    resource: tuple[tuple[str, Any], ...]


def donors() -> list[list[Piece]]:
    """Engine requests to compose random traces of: each trace of the fixtures, the SGLang captures
    and a bench batch, as its spans with their resources."""
    found: list[list[Piece]] = []
    sources: list[bytes] = [F.vllm_request_span().SerializeToString(),
                            F.vllm_request_span(token_events=False, span_name_style="llm_request",
                                                cached_tokens=None).SerializeToString(),
                            F.trtllm_serve_span().SerializeToString(), F.triton_request().SerializeToString()]
    sources += [p.read_bytes() for p in sorted((ROOT / "tests/testdata/engines/sglang").glob("*.binpb"))
                if ".metrics." not in p.name]
    sources += [b.payload for b in bench_generate(1, seed=5, min_spans=120, max_spans=160)]
    for data in sources:
        request = ExportTraceServiceRequest.FromString(data)
        by_trace: dict[bytes, list[Piece]] = {}
        for rs in request.resource_spans:
            resource = tuple((kv.key, F.attr_value(kv.value)) for kv in rs.resource.attributes)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    by_trace.setdefault(bytes(span.trace_id), []).append(Piece(span, resource))
        found += by_trace.values()
    return found


class Composer:
    def __init__(self, rng: random.Random, pool: list[list[Piece]]) -> None:
        self.rng = rng
        self.pool = pool

    def ids(self) -> Iterator[bytes]:
        while True:
            yield self.rng.randbytes(8)

    def genai(self, sid: bytes, parent: bytes | None, kind: int, start: int, end: int) -> Span:
        rng = self.rng
        operation = rng.choice(OPERATIONS)
        model = rng.choice(MODELS)
        attrs: dict[str, Any] = {"gen_ai.operation.name": operation, "gen_ai.request.model": model}
        if rng.random() < 0.4:
            attrs["gen_ai.response.model"] = rng.choice(MODELS)
        if rng.random() < 0.5:
            attrs["gen_ai.response.finish_reasons"] = [rng.choice(FINISH)]
        if rng.random() < 0.5:
            attrs["gen_ai.usage.input_tokens"] = rng.choice((12, 400, 0))
            attrs["gen_ai.usage.output_tokens"] = rng.choice((1, 7, 300))
        if rng.random() < 0.2:
            attrs["gen_ai.usage.cache_read.input_tokens"] = rng.choice((4, 800))
        if rng.random() < 0.1:
            attrs["gen_ai.usage.cache_creation.input_tokens"] = rng.choice((2, -1))
        if rng.random() < 0.1:
            for key, value in zip(("num_accepted_draft_tokens", "num_draft_tokens", "num_spec_steps"),
                                  rng.choice(((3, 5, 2), (6, 5, 2), (1, 1, 1)))):
                attrs["vllm.metrics.speculative_decoding." + key] = value
        if rng.random() < 0.3:
            attrs["gen_ai.server.time_to_first_token"] = rng.choice((0.05, 0.3, 7.0, -0.1))
        if rng.random() < 0.2:
            attrs["gen_ai.provider.name"] = rng.choice(("openai", "litellm"))
        if rng.random() < 0.3 and kind == Span.SPAN_KIND_SERVER:
            attrs["http.route"] = rng.choice(ROUTES)
        events = []
        if rng.random() < 0.3:
            events.append(F.event(rng.choice(("first_token", "gen_ai.first_token", "other")),
                                  start + rng.randrange(-10**7, 5 * 10**8)))
        name = f"{operation} {model}".strip() or "chat"
        return F.make_span(name, trace=b"\0" * 16, sid=sid, parent=parent, kind=kind, start_ns=start, end_ns=end,
                           attrs=attrs, events=events, status_code=self.status())

    def status(self) -> int:
        return self.rng.choice((Status.STATUS_CODE_UNSET,) * 6 + (Status.STATUS_CODE_OK, Status.STATUS_CODE_ERROR))

    def app(self, sid: bytes, parent: bytes | None, start: int, end: int, kind: int = Span.SPAN_KIND_SERVER) -> Span:
        route = self.rng.choice(ROUTES)
        return F.make_span(f"POST {route}", trace=b"\0" * 16, sid=sid, parent=parent, kind=kind, start_ns=start,
                           end_ns=end, attrs={"http.route": route, "url.path": self.rng.choice(ROUTES)},
                           status_code=self.status())

    def resource(self) -> tuple[tuple[str, Any], ...]:
        rng = self.rng
        attrs: list[tuple[str, Any]] = [("service.name", rng.choice(SERVICES))]
        if rng.random() < 0.2:
            attrs.append(("model.id", rng.choice(("from-resource", "", 7))))
        if rng.random() < 0.2:
            attrs.append(("tier", rng.choice(("gold", "bronze", 3))))
        if rng.random() < 0.1:
            attrs.append(("tenant.id", rng.choice(("team-a", "team-z"))))
        if rng.random() < 0.05:
            attrs.append(("service.name", rng.choice(SERVICES)))  # twice: the last string wins
        return tuple(attrs)

    def around(self, start: int, end: int) -> tuple[int, int]:
        """An interval holding [start, end] give or take (a caller's clock, a short span)."""
        rng = self.rng
        # Either side of SIBLING_SKEW_NS (5 ms), and callers shorter than their callee.
        before = rng.choice((10**6, 10**7, 4 * 10**6, 0, -3 * 10**6, -10**8, -5 * 10**6, -5 * 10**6 - 1, -6 * 10**6))
        after = rng.choice((10**6, 10**7, 4 * 10**6, 0, -10**7, -5 * 10**6, -5 * 10**6 - 1))
        return start - before, end + after

    def compose(self) -> list[Piece]:
        rng = self.rng
        ids = self.ids()
        donor = [Piece(_copy(p.span), p.resource) for p in rng.choice(self.pool)]
        if rng.random() < 0.3:  # the engine's service named otherwise (its model's fallback)
            service = rng.choice(SERVICES)
            for p in donor:
                p.resource = tuple((k, service if k == "service.name" else v) for k, v in p.resource)
        if rng.random() < 0.15:  # the engine's resource names its model (a from_resource rule's)
            model_id = ("model.id", rng.choice(("served-by-resource", "", 7)))
            for p in donor:
                p.resource = (*p.resource, model_id)
        present = {bytes(p.span.span_id) for p in donor}
        tops = [p for p in donor if bytes(p.span.parent_span_id) not in present]
        start = min(p.span.start_time_unix_nano for p in tops)
        end = max(p.span.end_time_unix_nano for p in tops)
        pieces = list(donor)
        layout = rng.choice(("alone", "gateway", "client_gateway", "client", "app_client_gateway", "litellm",
                             "app", "gateway_alone", "client_alone", "nested_clients", "two", "upstream"))
        resource = self.resource()
        upstream = next(ids)

        def attach(parent: bytes | None) -> None:
            for top in tops:
                top.span.parent_span_id = parent or b""

        if layout in ("gateway", "client_gateway", "app_client_gateway"):
            gateway_id = next(ids)
            attach(gateway_id)
            g_start, g_end = self.around(start, end)
            parent = None
            if layout != "gateway":
                client_id = next(ids)
                c_start, c_end = self.around(g_start, g_end)
                parent_of_client = None
                if layout == "app_client_gateway":
                    app_id = next(ids)
                    a_start, a_end = self.around(c_start, c_end)
                    pieces.append(Piece(self.app(app_id, None, a_start, a_end), resource))
                    parent_of_client = app_id
                kind = rng.choice((Span.SPAN_KIND_CLIENT, Span.SPAN_KIND_INTERNAL))
                pieces.append(Piece(self.genai(client_id, parent_of_client, kind, c_start, c_end), resource))
                parent = client_id
            gateway = (self.genai(gateway_id, parent, Span.SPAN_KIND_SERVER, g_start, g_end) if rng.random() < 0.7
                       else self.app(gateway_id, parent, g_start, g_end))
            pieces.append(Piece(gateway, self.resource()))
        elif layout == "client":
            client_id = next(ids)
            attach(client_id)
            c_start, c_end = self.around(start, end)
            pieces.append(Piece(self.genai(client_id, None, Span.SPAN_KIND_CLIENT, c_start, c_end), resource))
        elif layout == "litellm":
            # LiteLLM forwards its caller's traceparent: its proxy span and the engine's are siblings.
            proxy_id, call_id = next(ids), next(ids)
            attach(upstream)
            p_start, p_end = self.around(start, end)
            pieces.append(Piece(self.app(proxy_id, upstream, p_start, p_end), resource))
            call = self.genai(call_id, proxy_id, Span.SPAN_KIND_INTERNAL, p_start + 10**5, p_end - 10**5)
            call.name = "litellm_request"
            pieces.append(Piece(call, resource))
            if rng.random() < 0.3:  # LiteLLM's proxy has two SERVER spans per call
                pieces.append(Piece(self.app(next(ids), upstream, p_start - 10**6, p_end + 10**6), resource))
        elif layout == "app":
            app_id = next(ids)
            attach(app_id)
            pieces.append(Piece(self.app(app_id, None, *self.around(start, end),
                                         kind=rng.choice((Span.SPAN_KIND_SERVER, Span.SPAN_KIND_INTERNAL))), resource))
        elif layout in ("gateway_alone", "client_alone", "nested_clients"):
            pieces = []
            outer = next(ids)
            kind = Span.SPAN_KIND_SERVER if layout == "gateway_alone" else Span.SPAN_KIND_CLIENT
            pieces.append(Piece(self.genai(outer, upstream if rng.random() < 0.3 else None, kind, start, end), resource))
            if layout != "client_alone":
                inner_kind = rng.choice((Span.SPAN_KIND_SERVER, Span.SPAN_KIND_CLIENT, Span.SPAN_KIND_INTERNAL))
                pieces.append(Piece(self.genai(next(ids), outer, inner_kind, start + 10**6, end - 10**6), resource))
        elif layout == "two":
            other = [Piece(_copy(p.span), p.resource) for p in rng.choice(self.pool)]
            shift = rng.randrange(-10**9, 10**9)
            for p in other:
                p.span.start_time_unix_nano = max(0, p.span.start_time_unix_nano + shift)
                p.span.end_time_unix_nano = max(0, p.span.end_time_unix_nano + shift)
            pieces += other
        elif layout == "upstream":
            attach(upstream)
        self.hostile(pieces)
        trace = rng.randbytes(16)
        for p in pieces:
            p.span.trace_id = trace
        return pieces

    def hostile(self, pieces: list[Piece]) -> None:
        rng = self.rng
        extra: list[Piece] = []
        lost: list[Piece] = []
        for piece in pieces:
            span = piece.span
            if rng.random() < 0.15:
                set_attribute(span, rng.choice(HOSTILE_KEYS), rng.choice(HOSTILE))
            if rng.random() < 0.04:
                span.start_time_unix_nano = rng.choice((0, span.end_time_unix_nano + 1))
            if rng.random() < 0.03:
                span.end_time_unix_nano = span.start_time_unix_nano + rng.choice((10**15, 2**63))
            if rng.random() < 0.06:
                span.trace_state = rng.choice(TRACE_STATES)
            if rng.random() < 0.04:
                span.status.code = Status.STATUS_CODE_ERROR
                if rng.random() < 0.5:
                    set_attribute(span, "error.type", rng.choice(("Timeout", 504, 1.5)))
            if rng.random() < 0.02:
                span.parent_span_id = span.span_id  # its own parent
            if rng.random() < 0.03:
                span.events.add(name="first_token", time_unix_nano=span.start_time_unix_nano + rng.randrange(10**9))
            if span.kind == Span.SPAN_KIND_INTERNAL and span.name in SGLANG_STAGES and rng.random() < 0.15:
                # A stage retracted and run again, sent twice, or lost; or renamed another stage.
                roll = rng.random()
                if roll < 0.5:
                    again = _copy(span)
                    again.span_id = rng.randbytes(8)
                    again.start_time_unix_nano = max(0, span.start_time_unix_nano
                                                     + rng.choice((0, rng.randrange(-10**7, 10**7))))
                    again.end_time_unix_nano = max(0, span.end_time_unix_nano + rng.choice((0, rng.randrange(-10**7, 10**7))))
                    extra.append(Piece(again, piece.resource))
                elif roll < 0.75:
                    lost.append(piece)
                else:
                    span.name = rng.choice(sorted(SGLANG_STAGES))
        for piece in pieces:
            if piece.span.name == "decode_forward" and rng.random() < 0.3:
                lost.append(piece)  # its decode_loops, moved up, are the decode (a sum of many)
                for child in pieces:
                    if child.span.parent_span_id == piece.span.span_id:
                        child.span.parent_span_id = piece.span.parent_span_id
        for piece in lost:
            if piece in pieces:
                pieces.remove(piece)
        pieces += extra
        if len(pieces) > 1 and rng.random() < 0.02:  # two spans each the other's parent
            a, b = rng.sample(pieces, 2)
            a.span.parent_span_id, b.span.parent_span_id = b.span.span_id, a.span.span_id


def _copy(span: Span) -> Span:
    out = Span()
    out.CopyFrom(span)
    return out


def request_of(pieces: list[Piece]) -> bytes:
    by_resource: dict[tuple[tuple[str, Any], ...], list[Span]] = {}
    for p in pieces:
        key = tuple((k, repr(v)) for k, v in p.resource)
        by_resource.setdefault(key, []).append(p.span)
    resources = {tuple((k, repr(v)) for k, v in p.resource): p.resource for p in pieces}
    request = ExportTraceServiceRequest()
    for key, spans in by_resource.items():
        rs = ResourceSpans(resource=Resource(attributes=[KeyValue(key=k, value=value_of(v)) for k, v in resources[key]]))
        rs.scope_spans.append(ScopeSpans(scope=InstrumentationScope(name="random"), spans=spans))
        request.resource_spans.append(rs)
    return request.SerializeToString()


def redraw(rng: random.Random, trace: PendingTrace) -> None:
    """New values in some observations' fields, of the types the adapters make (and hostile ones)."""
    def number() -> float | None:
        return rng.choice((None, 0.0, rng.uniform(0, 2), rng.uniform(0, 0.1), float("nan"), -0.5, float("inf"), 1e9,
                           rng.uniform(0, 1e-6)))

    for span in list(trace.spans.values()):
        obs = span.observation
        if obs is None or obs.part or rng.random() < 0.5:
            continue
        fields: dict[str, Any] = dict(zip(OBSERVATION_FIELDS, obs.as_tuple()))
        for name in FLOATS:
            if rng.random() < 0.12:
                fields[name] = number()
        for name in INTS:
            if rng.random() < 0.12:
                fields[name] = rng.choice((None, 0, 1, 2, rng.randrange(600), -1, 10**9))
        for name, pool in (("request_model", MODELS), ("response_model", MODELS), ("finish_reason", FINISH),
                           ("operation_name", OPERATIONS)):
            if rng.random() < 0.15:
                fields[name] = rng.choice((None, *pool))
        if rng.random() < 0.1 and fields["ttft_s"] is not None and fields["decode_s"] is not None:
            fields["e2e_s"] = fields["ttft_s"] + fields["decode_s"]  # no postprocess, or a zero-long one
        if rng.random() < 0.1 and fields["ttft_s"] is not None and fields["prefill_s"] is not None:
            fields["queue_s"] = max(fields["ttft_s"] - fields["prefill_s"], 0.0)  # no preprocess
        if rng.random() < 0.1:
            fields["spec_decode"] = rng.choice((None, (3, 5, 2), (0, 0, 0)))
        if rng.random() < 0.05:
            fields["spec_decode_rejected"] = "inconsistent_spec_decode"
        if rng.random() < 0.05:
            fields["derived"] = rng.choice(((), ("prefill", "decode"), ("decode",)))
        if rng.random() < 0.05:
            fields["is_error"] = not fields["is_error"]
        if rng.random() < 0.05 and obs.engine_kind == "sglang":
            fields["marks"] = ("dispatch_to_first_token_s", rng.choice((0.01, 0.0, -0.1, 7, 10.0)))
        span.observation = EngineObservation(*fields.values())


def random_corpus(count: int) -> Corpus:
    corpus = Corpus("random")
    rng = random.Random(20261207)
    composer = Composer(rng, donors())
    for number in range(count):
        settings_name = ALL[number % len(ALL)]
        pieces = composer.compose()
        for index, trace in enumerate(traces_of(request_of(pieces), settings_name)):
            if rng.random() < 0.35:
                redraw(rng, trace)
            corpus.add(f"random:{number}#{index}", trace, settings_name)
            if rng.random() < 0.08:  # one of its spans arriving late, alone
                span = rng.choice(list(trace.spans.values()))
                late = PendingTrace(trace.trace_id, 0.0, spans={span.span_id: span})
                corpus.add(f"random:{number}#{index}:late", late, settings_name, late=True)
    return corpus


def main() -> None:
    corpora: list[Callable[[], Corpus]] = [fixtures, captures, bench_corpus, lambda: random_corpus(2500)]
    for make in corpora:
        corpus = make()
        corpus.write()
    shapes = OUT / "shapes.json"
    shapes.write_text(json.dumps(SHAPES.table, indent=1) + "\n")


if __name__ == "__main__":
    main()
