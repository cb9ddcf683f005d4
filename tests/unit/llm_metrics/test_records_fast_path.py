"""The request records' fast path against the general code it stands in for.

``records_of_trace`` reads the shapes most traffic has (one engine span alone, or directly under its
gateway) without the general joining (``requests._records_of_any_trace``), and ``build_segments``
lays vLLM's full set of timings out in one step. Each must give exactly what the general code gives:

- every engine fixture, every capture under ``tests/testdata``, the bench's workload (with and without
  upstream parents) and hand-made shapes on both sides of the fast path's boundary go through both
  paths, under several record settings, and must give equal records and equal malformed reasons;
  each hand-made shape's verdict (fast or general) is stated from the shape's rules, so a fast path
  that took nothing, or took a shape the general joining reads otherwise, fails here;
- with the compiled core, its ``RecordBuilder`` (``rust/src/records.rs``, which builds the fast path's
  record from the core's own spans) goes through the same traces and shapes, and through 6 000 random
  traces drawing every value it reads from what adapters, hostile attributes and odd clocks give: each
  record it builds must be the general path's, field for field and type for type;
- ``build_segments`` is compared with the steps of DESIGN.md §4 written out below, one segment at a
  time, on seeded random timings and on the boundaries (no preprocess, no postprocess, zero lengths).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from bench.workload import generate
from otel_llm.internal import core as native_core
from otel_llm.pdata.records import RequestRecord, Segment
from otel_llm.pdata.observation import EngineObservation
from otel_llm.pdata.spans import FIRST_TOKEN_EVENT, BufferedSpan, PendingTrace
from otel_llm.processor.llm_metrics import requests
from otel_llm.processor.llm_metrics.digest import AttributeLimits, DigestSettings, digest_in_process
from otel_llm.processor.llm_metrics.requests import (
    Dimension, RecordSettings, ResourceModelRule, TenantRule, records_of_trace)
from otel_llm.processor.llm_metrics.segments import Timings, build_segments
from tests.support import engine_fixtures as F
from tests.support.records import as_core_record

TESTDATA = Path(__file__).parents[2] / "testdata"
DIMENSION = Dimension("route", "http.route", frozenset({"/v1/chat/completions"}))
TENANT = TenantRule(("tenant.id", "gen_ai.request.model"), frozenset({"meta-llama/Llama-3.1-8B-Instruct"}), "other")
DIGEST = DigestSettings(AttributeLimits(256, 16 * 1024), 3600.0,
                        ("gen_ai.request.model", "gen_ai.response.model", "http.route", "url.path", "error.type",
                         "gen_ai.server.time_to_first_token", "tenant.id"),
                        frozenset({"first_token"}))
SETTINGS = {
    "defaults": RecordSettings(),
    "bench": RecordSettings(resource_model_rules=(ResourceModelRule("service.name", {"vllm-qwen-0": "Qwen"}),),
                            model_from_service_name=True),
    "everything": RecordSettings(default_model="configured", default_operation="chat", dimensions=(DIMENSION,),
                                 tenant=TENANT, lora_adapters={"meta-llama/Llama-3.1-8B-Instruct": "base"}),
    "tight_bound": RecordSettings(max_latency_s=0.5, resource_model_rules=(ResourceModelRule("service.name"),)),
}


def _traces(data: bytes) -> list[PendingTrace]:
    """A request's spans filed by trace as the assembler files them (a later span with the same id replaces)."""
    spans, _ = digest_in_process(data, DIGEST)
    traces: dict[bytes, PendingTrace] = {}
    for span in spans:
        traces.setdefault(span.trace_id, PendingTrace(span.trace_id, 0.0)).spans[span.span_id] = span
    return list(traces.values())


def _corpus() -> dict[str, list[PendingTrace]]:
    requests_ = {f"fixture:{name}": builder().SerializeToString() for name, builder in F.BUILDERS.items()}
    requests_["fixture:dynamo_request_disagg"] = F.dynamo_request(disaggregated=True).SerializeToString()
    requests_["fixture:llmd_mooncake"] = F.llmd_disaggregated(connector="mooncake").SerializeToString()
    for path in sorted(TESTDATA.rglob("*.binpb")):
        if ".metrics." not in path.name and ".logs." not in path.name:
            requests_[f"capture:{path.parent.name}/{path.name}"] = path.read_bytes()
    for upstream in (False, True):
        for index, batch in enumerate(generate(2, seed=11, upstream_parent=upstream, min_spans=300, max_spans=400)):
            requests_[f"bench:{upstream}:{index}"] = batch.payload
    return {name: _traces(data) for name, data in requests_.items()}


CORPUS = _corpus()


def typed(record: RequestRecord) -> tuple[tuple[str, str, object], ...]:
    """A record's fields with their types (``==`` alone takes 1 for 1.0 and a str subclass for a str),
    a segment's too."""
    return tuple((f.name, type(getattr(record, f.name)).__name__,
                  tuple((type(s).__name__, *s) for s in record.segments) if f.name == "segments"
                  else getattr(record, f.name)) for f in dataclasses.fields(RequestRecord))


def _typed(result: tuple[list[RequestRecord], list[tuple[str, str]]]) -> object:
    records, malformed = result
    return [typed(record) for record in records], malformed


def _both_paths(trace: PendingTrace, settings: RecordSettings,
                taken: dict[str, int] | None = None) -> tuple[object, object]:
    """(the fast path's, the general path's) records and malformed reasons; with the compiled core, the
    fast path is first the core's ``RecordBuilder`` (``taken`` counts what it built and declined)."""
    fast_malformed: list[tuple[str, str]] = []
    general_malformed: list[tuple[str, str]] = []
    fast = records_of_trace(trace, settings, fast_malformed)
    general = requests._records_of_any_trace(trace, settings, general_malformed)
    builder = requests.native_record_builder(settings, native_core.active()[0])
    if builder is not None:
        built = builder.build(trace.spans)
        if taken is not None:
            taken["built" if built is not None else "declined"] += 1
        if built is not None:
            assert _typed(([built], [])) == _typed((general, general_malformed)), trace.trace_id.hex()
            # The core keeps a record's segments as numbers and makes the named tuples once, when read.
            assert built.segments is built.segments
        native_malformed: list[tuple[str, str]] = []
        native = records_of_trace(trace, settings, native_malformed, builder)
        assert _typed((native, native_malformed)) == _typed((general, general_malformed))
    return (fast, fast_malformed), (general, general_malformed)


@pytest.mark.parametrize("settings_name", sorted(SETTINGS))
def test_every_fixture_capture_and_bench_trace_gives_the_general_paths_records(settings_name: str) -> None:
    settings = SETTINGS[settings_name]
    fast_taken = general_taken = records = 0
    taken = {"built": 0, "declined": 0}
    for name, traces in CORPUS.items():
        for trace in traces:
            fast, general = _both_paths(trace, settings, taken)
            assert fast == general, f"{name}: trace {trace.trace_id.hex()}"
            records += len(fast[0])  # type: ignore[index]
            if requests._simple_request(trace) is None:
                general_taken += 1
            else:
                fast_taken += 1
    # Both sides of the comparison are exercised: the bench's gateway + vLLM traces take the fast path,
    # the fixtures' composite and disaggregated requests (several engine spans) the general one.
    assert fast_taken > 100 and general_taken > 10 and records > fast_taken
    if native_core.active()[0] is None:
        return
    if settings_name == "everything":  # dimensions, a tenant and LoRA adapters: Python's alone
        assert taken == {"built": 0, "declined": 0}
    else:
        # The core builds most of what the fast path takes (the bench's vLLM and TGI traces; not its
        # SGLang ones, composite) and declines the rest.
        assert taken["built"] > fast_taken // 2 and taken["declined"] >= general_taken, taken


# --- hand-made shapes at the boundary ---------------------------------------------------------------

def _gateway_and_engine() -> tuple[BufferedSpan, BufferedSpan]:
    """A bench trace's gateway SERVER span and the vLLM span directly under it."""
    for traces in CORPUS.values():
        for trace in traces:
            if len(trace.spans) != 2:
                continue
            gateway, engine = sorted(trace.spans.values(), key=lambda s: s.parent_span_id != b"")
            if (gateway.observation is not None and gateway.observation.may_be_gateway
                    and engine.observation is not None and engine.observation.engine_kind == "vllm"
                    and engine.parent_span_id == gateway.span_id and not gateway.parent_span_id):
                return gateway, engine
    raise AssertionError("the bench workload has no gateway + vLLM trace")


def replace(span: BufferedSpan, **changes: Any) -> BufferedSpan:
    """``dataclasses.replace`` for either class of buffered span (the dataclass, the core's compact row)."""
    fields = {field.name: getattr(span, field.name) for field in dataclasses.fields(BufferedSpan)}
    return type(span)(**{**fields, **changes})  # type: ignore[no-any-return]


def _unclaimed(like: BufferedSpan, span_id: bytes, parent: bytes, kind: int = Span.SPAN_KIND_SERVER) -> BufferedSpan:
    return replace(like, span_id=span_id, parent_span_id=parent, kind=kind, observation=None, attrs=())


def _trace(*spans: BufferedSpan) -> PendingTrace:
    trace = PendingTrace(spans[0].trace_id, 0.0)
    for span in spans:
        trace.spans[span.span_id] = span
    return trace


def _without_e2e(observation: Any) -> Any:
    fields = list(observation.as_tuple())
    fields[3] = None  # e2e_s (OBSERVATION_FIELDS)
    return type(observation)(*fields)


def _shapes() -> dict[str, tuple[PendingTrace, bool]]:
    """Each shape with whether the fast path may take it (from the rules in ``_simple_request``'s docstring)."""
    gw, eng = _gateway_and_engine()
    root_engine = replace(eng, parent_span_id=b"")
    upstream = b"\x77" * 8  # a parent the trace does not hold
    orphan = replace(eng, parent_span_id=upstream)
    other_id, third_id = b"\x42" * 8, b"\x43" * 8
    return {
        "engine_under_gateway": (_trace(gw, eng), True),
        "engine_listed_before_gateway": (_trace(eng, gw), True),
        "engine_alone_as_root": (_trace(root_engine), True),
        "engine_alone_parent_upstream": (_trace(orphan), True),
        "engine_root_with_unclaimed_children": (
            _trace(root_engine, _unclaimed(gw, other_id, eng.span_id, Span.SPAN_KIND_INTERNAL)), True),
        "gateway_failed": (_trace(replace(gw, status_code=Status.STATUS_CODE_ERROR), eng), True),
        # The engine's e2e is its span's duration, the gateway's the same: an overhead of exactly 0.
        "gateway_as_long_as_engine": (_trace(replace(gw, start_unix_ns=eng.start_unix_ns, end_unix_ns=eng.end_unix_ns),
                                             replace(eng, observation=_without_e2e(eng.observation))), True),
        "engine_sampled_upstream": (_trace(gw, replace(eng, trace_state="ot=th:8")), True),
        "engine_bad_threshold": (_trace(gw, replace(eng, trace_state="ot=th:zz")), True),
        "gateway_parent_upstream": (_trace(replace(gw, parent_span_id=upstream), eng), True),
        "engine_own_parent": (_trace(replace(eng, parent_span_id=eng.span_id)), False),
        # The general joining takes an unclaimed SERVER sibling that contains the engine span as its gateway.
        "engine_with_unclaimed_server_sibling": (
            _trace(orphan, _unclaimed(replace(gw, start_unix_ns=eng.start_unix_ns - 1,
                                              end_unix_ns=eng.end_unix_ns + 1), other_id, upstream)), False),
        "gateway_not_server": (_trace(replace(gw, kind=Span.SPAN_KIND_CLIENT), eng), False),
        "gateway_under_its_engine": (_trace(replace(gw, parent_span_id=eng.span_id), eng), False),
        "span_above_gateway": (_trace(_unclaimed(gw, other_id, b""), replace(gw, parent_span_id=other_id), eng), False),
        "engine_below_unclaimed_span": (
            _trace(gw, _unclaimed(gw, other_id, gw.span_id, Span.SPAN_KIND_INTERNAL),
                   replace(eng, parent_span_id=other_id)), False),
        "two_engines": (_trace(gw, eng, replace(eng, span_id=other_id)), False),
        "two_gateways": (_trace(gw, replace(gw, span_id=third_id), eng), False),
        "gateway_alone": (_trace(gw), False),
    }


SHAPES = _shapes()


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("settings_name", sorted(SETTINGS))
def test_shapes_at_the_fast_paths_boundary(shape: str, settings_name: str) -> None:
    trace, fast_allowed = SHAPES[shape]
    assert (requests._simple_request(trace) is not None) == fast_allowed
    fast, general = _both_paths(trace, SETTINGS[settings_name])
    assert fast == general


def test_the_boundary_shapes_mean_what_they_say() -> None:
    """The shapes above test something: the sibling is joined as the gateway by the general path, the
    failed gateway fails the request, the bad threshold is refused, a sampled span weighs 2."""
    gw, eng = _gateway_and_engine()
    settings = SETTINGS["defaults"]

    def one(shape: str) -> RequestRecord:
        records = records_of_trace(SHAPES[shape][0], settings, [])
        assert len(records) == 1
        return records[0]

    assert one("engine_with_unclaimed_server_sibling").edge_span_id == b"\x42" * 8
    assert one("engine_under_gateway").edge_span_id == gw.span_id
    assert one("engine_alone_as_root").edge_span_id == b""
    assert one("gateway_failed").outcome == "error"
    assert one("gateway_as_long_as_engine").gateway_overhead_s == 0.0
    assert one("engine_sampled_upstream").weight == 2.0  # th:8 rejects half: 2**56 / (2**56 - 2**55)
    malformed: list[tuple[str, str]] = []
    assert records_of_trace(SHAPES["engine_bad_threshold"][0], settings, malformed) == []
    assert malformed == [("invalid_sampling_threshold", eng.service_name)]


# --- the compiled core's records on random traces ------------------------------------------------------

_ATTRIBUTE_KEYS = ("http.route", "url.path", "error.type", "gen_ai.server.time_to_first_token", FIRST_TOKEN_EVENT,
                   "x-edge-ttft", "tenant.id")
_ATTRIBUTE_VALUES: tuple[object, ...] = (
    "/v1/chat/completions", "/generate", "/v1/embeddings", "", "x", "Timeout", 0.25, 0.0, 2.0, 86400.0, 86400,
    -1.0, 1e12, float("nan"), float("inf"), 7, -3, 2**70, True, False, None, ["/v1/completions"], [], {"a": 1},
    b"0.5", "0.5", "junk")
_ROUTES = ("/v1/chat/completions", "/generate", "/v1/embeddings", "/health", "")
_FINISH = (None, "", "stop", "STOP", "Length", "abort", "cancelled", "eos", "weird", "\u017ftop", "\u0130")
_MODELS = (None, "", "m-one", "Qwen/Qwen3-0.6B")
_OPERATIONS = (None, "", "chat", "acompletion", "embeddings", "text_completion")
# Upstream sampling thresholds (``adjusted_count``): a weight of 2, of 1, of 2**20 (the largest
# taken), 4/3 (not a power of two), malformed ones, others' members and padding, and one whose
# denominator a double cannot hold.
_TRACE_STATES = ("ot=th:8", "ot=th:0", "ot=th:fffff", "ot=th:ffffff", "ot=th:4", "vendor=a", "ot=th:zz", "ot=p:3",
                 "ot=th:", "ot=th:123456789abcdef", " ot=th:c;rv:abcdef01234567 ", "x=y,ot=th:C", "ot=th:8\u2003",
                 "ot=th:78e5107311d8a4")  # 2**56 / (2**56 - t) rounded once differs from its rounded parts
_RANDOM_SETTINGS = (
    RecordSettings(),
    RecordSettings(default_model="configured", default_operation="chat"),
    RecordSettings(resource_model_rules=(ResourceModelRule("service.name", {"vllm-qwen-0": "Qwen"}),
                                         ResourceModelRule("model.id")), model_from_service_name=True),
    RecordSettings(edge_ttft_attributes=("x-edge-ttft", "gen_ai.server.time_to_first_token"), max_latency_s=2.0,
                   model_from_service_name=True, default_model="fallback"),
)


def _random_attrs(rng: random.Random, start: int) -> tuple[object, ...]:
    pairs: list[object] = []
    for key in rng.sample(_ATTRIBUTE_KEYS, rng.randrange(len(_ATTRIBUTE_KEYS) + 1)):
        if key == FIRST_TOKEN_EVENT:
            value: object = rng.choice((start + rng.randrange(-10**9, 10**10), 0, None, 1.5))
        else:
            value = rng.choice(_ATTRIBUTE_VALUES if rng.random() < 0.3 else _ROUTES)
        pairs += [key, value]
    if pairs and rng.random() < 0.1:
        pairs.append(rng.choice(_ATTRIBUTE_KEYS))  # a key in last place, with no value after it
    return tuple(pairs)


def _random_observation(rng: random.Random, observation: Any, gateway: bool) -> Any:
    """The span's observation with fields drawn at random, as the core's class where it holds those
    values (else the Python class: the core's builder declines it)."""
    fields = list(observation.as_tuple())

    def maybe_float() -> float | None:
        if rng.random() < 0.8:
            return rng.choice((None, 0.0, rng.uniform(0, 3), rng.uniform(0, 0.2)))
        return rng.choice((float("nan"), -0.5, 1e9))

    def maybe_int(top: int) -> int | None:
        if rng.random() < 0.8:
            return rng.choice((None, 0, 1, rng.randrange(top)))
        return rng.choice((-1, top * 3))

    if not gateway:
        for index in range(2, 8):  # ttft, e2e, queue, prefill, decode, inference
            if rng.random() < 0.08:
                fields[index] = maybe_float()
        if rng.random() < 0.1:
            fields[8] = maybe_float()  # preprocess
        for index in (9, 10, 11):  # prompt, completion, max tokens
            if rng.random() < 0.15:
                fields[index] = maybe_int(500)
        fields[16] = rng.choice((None, "", "vllm"))
        fields[17], fields[18] = rng.choice((None, "host")), rng.choice((None, "", "8000"))
        fields[19] = rng.random() < 0.1
        fields[20] = rng.choice((None, None, "", "timeout"))
        fields[25] = rng.choice((None, None, "spec_decode_inconsistent"))
        fields[26] = rng.choice((None, 12))
        fields[27] = rng.choice((None, None, 0.02))
        fields[28] = rng.choice(((), (0.01, 0.02)))
        fields[31] = rng.choice(((),) * 9 + (("prefill", "decode"),))
    fields[12], fields[13] = rng.choice(_MODELS), rng.choice(_MODELS)
    fields[14] = rng.choice(_FINISH)
    fields[15] = rng.choice(_OPERATIONS)
    fields[22] = maybe_int(600)
    fields[23] = rng.choice((None,) * 6 + (5, -2, 10**6, 2**70))
    fields[24] = rng.choice((None,) * 6 + ((3, 5, 2), [3, 5, 2]))
    try:
        return type(observation)(*fields)
    except TypeError:
        return EngineObservation(*fields)


def _random_trace(rng: random.Random, gateway: BufferedSpan, engine: BufferedSpan) -> PendingTrace:
    base = engine.start_unix_ns
    origin = dataclasses.replace(engine.origin, resource_strings=rng.choice((
        {}, {"service.name": "vllm-qwen-0"}, {"service.name": "unknown_service:python"}, {"service.name": ""},
        {"model.id": "from-resource", "service.name": "engine-a"}, {"model.id": ""})))

    def times(span: BufferedSpan) -> dict[str, int]:
        roll = rng.random()
        if roll < 0.05:
            return {"start_unix_ns": 0}
        if roll < 0.1:
            return {"end_unix_ns": span.start_unix_ns - 1}
        if roll < 0.15:
            return {"end_unix_ns": span.start_unix_ns + 10**15}
        if roll < 0.3:
            return {"start_unix_ns": span.start_unix_ns + rng.randrange(-10**8, 10**8)}
        return {}

    new_engine = replace(engine, observation=_random_observation(rng, engine.observation, False), origin=origin,
                         attrs=_random_attrs(rng, base) if rng.random() < 0.5 else (),
                         trace_state=rng.choice(("",) * 12 + _TRACE_STATES),
                         **times(engine))
    if rng.random() < 0.25:
        return _trace(replace(new_engine, parent_span_id=b""))
    new_gateway = replace(gateway, observation=_random_observation(rng, gateway.observation, True),
                          attrs=_random_attrs(rng, gateway.start_unix_ns),
                          status_code=rng.choice((Status.STATUS_CODE_UNSET, Status.STATUS_CODE_OK,
                                                  Status.STATUS_CODE_ERROR)),
                          kind=rng.choice((Span.SPAN_KIND_SERVER,) * 9 + (Span.SPAN_KIND_CLIENT,)), **times(gateway))
    return _trace(*rng.sample((new_gateway, new_engine), 2))


def test_the_core_refuses_a_record_order_it_does_not_build() -> None:
    """The core's record holds ``RequestRecord``'s fields by position: a ``RequestRecord`` whose fields
    moved, or gained one, must stop the builder being made, not fill wrong fields."""
    extension = native_core.active()[0]
    if extension is None:
        pytest.skip("the compiled core is not installed")
    original = requests._RECORD_FIELDS
    try:
        for moved in ((original[1], original[0], *original[2:]), (*original, "new_field")):
            requests._RECORD_FIELDS = moved
            with pytest.raises(ValueError, match="RequestRecord's fields are"):
                requests.native_record_builder(RecordSettings(), extension)
    finally:
        requests._RECORD_FIELDS = original
    assert requests.native_record_builder(RecordSettings(), extension) is not None


def test_the_cores_records_are_the_python_ones_on_random_traces() -> None:
    """The core's ``RecordBuilder`` against the general joining on 6 000 random gateway + engine and
    engine-alone traces: every value it reads drawn from what an adapter, a hostile attribute or an
    odd clock can give (numbers of every type, strings it must not lowercase itself, durations past
    the bound, negative overheads, failed gateways, upstream thresholds, cache counts beyond the
    prompt). Each record it builds must be the general path's, field for field and type for type;
    what it declines, Python reads as before."""
    extension = native_core.active()[0]
    if extension is None:
        pytest.skip("the compiled core is not installed")
    gateway, engine = _gateway_and_engine()
    rng = random.Random(2512)
    taken = {"built": 0, "declined": 0}
    reasons: set[str] = set()
    weights: set[float] = set()
    by_settings: dict[int, list[PendingTrace]] = {}
    for case in range(6000):
        settings = _RANDOM_SETTINGS[case % len(_RANDOM_SETTINGS)]
        trace = _random_trace(rng, gateway, engine)
        by_settings.setdefault(case % len(_RANDOM_SETTINGS), []).append(trace)
        _both_paths(trace, settings, taken)
        built = requests.native_record_builder(settings, extension).build(trace.spans)
        if built is not None:
            reasons.update(built.rejected)
            weights.add(built.weight)
    # ``build_many`` (a completion batch's one call) gives, in order, what ``build`` gives each trace.
    batched = 0
    for index, traces in by_settings.items():
        builder = requests.native_record_builder(_RANDOM_SETTINGS[index], extension)
        for start in range(0, len(traces), 256):
            chunk = [trace.spans for trace in traces[start:start + 256]]
            alone = [builder.build(spans) for spans in chunk]
            together = builder.build_many(chunk)
            assert [None if r is None else typed(r) for r in together] == \
                [None if r is None else typed(r) for r in alone]
            batched += sum(r is not None for r in together)
    assert batched == taken["built"], (batched, taken)
    # Both sides are exercised, and the records it built met the rules that reject values.
    assert taken["built"] > 1000 and taken["declined"] > 1000, taken
    assert {"invalid_span_times", "absurd_span_duration", "negative_gateway_overhead", "invalid_edge_ttft",
            "cached_tokens_exceed_prompt", "cache_write_tokens_exceed_prompt",
            "spec_decode_inconsistent"} <= reasons, reasons
    assert {1.0, 2.0, 4 / 3, 2.0**20} <= weights, weights  # upstream thresholds read by the core


def _sglang_bases() -> list[PendingTrace]:
    """The corpus's SGLang requests the core reads whole (the bench's under and without gateways, the
    captures' unified ones): a core root span with its stage spans below it."""
    builder = requests.native_record_builder(RecordSettings(), native_core.active()[0])
    bases = []
    for traces in CORPUS.values():
        for trace in traces:
            roots = [s for s in trace.spans.values() if s.observation is not None
                     and s.observation.engine_kind == "sglang" and not s.observation.part]
            if len(roots) == 1 and builder is not None and builder.build(trace.spans) is not None:
                bases.append(trace)
    return bases


def _random_sglang_trace(rng: random.Random, base: PendingTrace) -> PendingTrace:
    """``base`` with what an SGLang deployment, a lossy pipe or a hostile sender can change drawn at
    random: the root's latencies, token counts, finish reason, error type and the tokenizer's
    dispatch-to-first-token mark; stage spans lost, sent twice or retracted (the same stage again, at
    the same start or later), renamed, given other times (none, ending before they start, far off) or
    another observation; thread spans failed; the order the trace holds its spans in."""
    spans: list[BufferedSpan] = []
    for span in base.spans.values():
        obs = span.observation
        if obs is not None and obs.engine_kind == "sglang" and not obs.part:
            fields = list(obs.as_tuple())
            ttft = rng.choice((fields[2], None, 0.0, rng.uniform(0, 0.5), float("inf")))
            fields[2] = ttft
            if rng.random() < 0.3:
                fields[3] = rng.choice((None, rng.uniform(0, 2), 0.0))  # e2e
            if rng.random() < 0.3:
                fields[6] = rng.choice((None, 0.0, rng.uniform(0, 2)))  # decode
            if rng.random() < 0.3:
                fields[10] = rng.choice((None, 0, 1, 2, rng.randrange(500)))  # completion tokens
            fields[14] = rng.choice((fields[14], None, "", "abort", "stop", "length"))
            fields[20] = rng.choice((fields[20], None, "", "timeout"))
            dispatch: object = rng.choice((rng.uniform(0, 0.5), 0.0, -0.1, 7, None, "0.1",
                                           (ttft or 0.0), (ttft or 0.0) + 1e-9))
            fields[30] = rng.choice(((), ("dispatch_to_first_token_s", dispatch), ("other", 1.0)))
            try:
                observation = type(obs)(*fields)
            except TypeError:
                observation = EngineObservation(*fields)
            spans.append(replace(span, observation=observation))
            continue
        if obs is not None and obs.part == "sglang_stage":
            roll = rng.random()
            if roll < 0.08:
                continue  # lost
            if roll < 0.14:
                other = rng.choice(sorted(requests.SGLANG_STAGES))
                span = replace(span, observation=requests.sglang_stage_observation(other))
            elif roll < 0.17:
                span = replace(span, observation=EngineObservation(*obs.as_tuple()))  # not the shared one
            if rng.random() < 0.15:
                span = replace(span, **rng.choice((
                    {"start_unix_ns": 0}, {"end_unix_ns": span.start_unix_ns - 1},
                    {"start_unix_ns": span.start_unix_ns + rng.randrange(-10**7, 10**7)},
                    {"end_unix_ns": span.end_unix_ns + 10**15})))
            spans.append(span)
            if rng.random() < 0.12:  # retracted and run again, or sent twice
                later = rng.choice((0, 0, rng.randrange(1, 10**7)))
                spans.append(replace(span, span_id=rng.randbytes(8), start_unix_ns=span.start_unix_ns + later,
                                     end_unix_ns=span.end_unix_ns + later + rng.randrange(10**6)))
            continue
        if obs is None and rng.random() < 0.15:
            span = replace(span, status_code=Status.STATUS_CODE_ERROR)  # a thread span closed by an abort
        spans.append(span)
    if rng.random() < 0.3:
        rng.shuffle(spans)
    return _trace(*spans)


def test_the_cores_sglang_records_are_the_python_ones_on_random_traces() -> None:
    """SGLang's requests read from their stage spans (``composite.sglang``) by the core against the
    general joining, on 4 000 random changes of the corpus's SGLang traces (``_random_sglang_trace``):
    each record the core builds must be Python's, field for field and type for type (segments, their
    order and the sums of retracted stages included); what it declines, Python reads as before."""
    extension = native_core.active()[0]
    if extension is None:
        pytest.skip("the compiled core is not installed")
    bases = _sglang_bases()
    assert len(bases) >= 8, len(bases)
    rng = random.Random(3105)
    taken = {"built": 0, "declined": 0}
    seen: dict[str, set[object]] = {"outcome": set(), "missing": set(), "segments": set(), "queue_sum": set()}
    for case in range(4000):
        settings = _RANDOM_SETTINGS[case % len(_RANDOM_SETTINGS)]
        trace = _random_sglang_trace(rng, rng.choice(bases))
        _both_paths(trace, settings, taken)
        built = requests.native_record_builder(settings, extension).build(trace.spans)
        if built is not None:
            seen["outcome"].add(built.outcome)
            seen["missing"].add(built.segments_missing)
            seen["segments"].add(tuple(s.name for s in built.segments))
            waiting = [s for s in trace.spans.values() if s.observation is not None
                       and s.observation.part == "sglang_stage" and s.observation.mark("stage") == "prefill_waiting"]
            seen["queue_sum"].add(len(waiting) if built.queue_s is not None else 0)
    assert taken["built"] > 1500 and taken["declined"] > 500, taken
    # The rules were met: aborts found below the root, stages missing, both layouts of the segments,
    # the queue_and_prefill interval, kv-less and retracted (summed) queues.
    assert {"abort", "unknown"} <= seen["outcome"], seen["outcome"]
    assert {(), ("queue", "prefill"), ("decode",), ("queue", "prefill", "decode")} <= seen["missing"], seen["missing"]
    assert any("queue_and_prefill" in names for names in seen["segments"]), seen["segments"]
    assert any("postprocess" in names for names in seen["segments"]), seen["segments"]
    assert {1, 2, 3} <= seen["queue_sum"], seen["queue_sum"]


def test_the_cores_float_sum_is_pythons() -> None:
    """The core sums a retracted stage's durations as ``sum()`` does: left to right before CPython
    3.12, with Neumaier's compensation from 3.12 (``Python/bltinmodule.c`` ``builtin_sum_impl``,
    written out below); the interpreter running the suite checks its own."""
    extension = native_core.active()[0]
    if extension is None:
        pytest.skip("the compiled core is not installed")

    def plain(values: list[float]) -> float:
        total = values[0]
        for value in values[1:]:
            total += value
        return total

    def neumaier(values: list[float]) -> float:
        total, compensation = values[0], 0.0
        for value in values[1:]:
            step = total + value
            compensation += (total - step) + value if abs(total) >= abs(value) else (value - step) + total
            total = step
        return total + compensation if compensation and compensation == compensation and abs(compensation) != float("inf") else total

    import sys
    rng = random.Random(12)
    differ = 0
    for _ in range(20000):
        values = [rng.choice((rng.uniform(0, 1), rng.randrange(1, 10**12) / 1e9, rng.uniform(0, 1e-6), 1e16 * rng.random()))
                  for _ in range(rng.randrange(1, 8))]
        assert extension.float_sum(values, False) == plain(values)
        assert extension.float_sum(values, True) == neumaier(values)
        assert extension.float_sum(values, sys.version_info >= (3, 12)) == sum(values)
        differ += plain(values) != neumaier(values)
    assert differ > 1000  # the two rules differ on these values: each check above can fail


# --- segments ------------------------------------------------------------------------------------------

def _step_by_step(start: int, t: Timings) -> tuple[Segment, ...]:
    """DESIGN.md §4's waterfall for timings with ttft, queue, prefill, decode and e2e, one segment at a time."""
    assert t.ttft_s is not None and t.queue_s is not None and t.prefill_s is not None
    assert t.decode_s is not None and t.e2e_s is not None
    out: list[Segment] = []
    first_token = start + round(t.ttft_s * 1e9)
    prefill_start = first_token - round(t.prefill_s * 1e9)
    queue_start = prefill_start - round(t.queue_s * 1e9)
    if queue_start > start:
        out.append(Segment("preprocess", start, queue_start))
    queue_start = max(queue_start, start)
    out.append(Segment("queue", queue_start, max(prefill_start, queue_start)))
    out.append(Segment("prefill", max(prefill_start, queue_start), first_token))
    decode_end = first_token + round(t.decode_s * 1e9)
    out.append(Segment("decode", first_token, decode_end))
    end = start + round(t.e2e_s * 1e9)
    if end > decode_end:
        out.append(Segment("postprocess", decode_end, end))
    return tuple(out)


def _timings(ttft: float, e2e: float, queue: float, prefill: float, decode: float) -> Timings:
    return Timings(ttft, e2e, queue, prefill, decode, prefill + decode, None, None, None)


def test_vllms_straight_layout_is_the_step_by_step_waterfall() -> None:
    rng = random.Random(25)
    start = 1_767_225_600_123_456_789
    cases = [
        _timings(0.5, 2.0, 0.2, 0.3, 1.5),  # no preprocess, no postprocess: both exactly zero
        _timings(0.5, 2.5, 0.1, 0.3, 1.5),  # both there
        _timings(0.0, 0.0, 0.0, 0.0, 0.0),  # all zero
        _timings(0.5, 2.0, 0.3, 0.3, 1.4),  # queue + prefill over ttft: queue clipped at the start
        _timings(0.5, 2.0, 0.0, 0.9, 1.4),  # prefill alone over ttft
        _timings(0.5, 1.9, 0.1, 0.3, 1.5),  # e2e short of decode's end: no postprocess
    ]
    for _ in range(3000):
        ttft = rng.choice((0.0, rng.uniform(0, 2)))
        cases.append(_timings(ttft, rng.choice((ttft, rng.uniform(0, 30))), rng.uniform(0, ttft + 0.01),
                              rng.uniform(0, ttft + 0.01), rng.choice((0.0, rng.uniform(0, 30)))))
    names = set()
    for t in cases:
        laid = build_segments(start, t)
        assert laid == _step_by_step(start, t), t
        assert all(type(s) is Segment for s in laid)
        names.add(tuple(s.name for s in laid))
    assert len(names) == 4  # with and without preprocess, with and without postprocess


def test_the_cores_record_reads_as_the_dataclass() -> None:
    """The core's ``RequestRecord`` is what Python code and the store read where the core built a
    record: the dataclass's fields in its order, its equality (either way round, with either class),
    its repr, ``succeeded``, unhashable; and immutable, since nothing changes a built record."""
    extension = native_core.active()[0]
    if extension is None:
        pytest.skip("the compiled core is not installed")
    python = RequestRecord(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, engine_kind="vllm", adapter="vllm_v1",
                           service_name="<svc>", model="m", model_source="span:gen_ai.request.model",
                           request_model="m", response_model="", operation_name="chat", provider_name="vllm",
                           outcome="abort", ttft_s=0.25, prompt_tokens=2**70, segments=(Segment("queue", 1, 2),),
                           spec_steps=3, lora_adapter="a")
    core = as_core_record(python, extension)
    assert tuple(extension.RequestRecord.FIELDS) == tuple(f.name for f in dataclasses.fields(RequestRecord))
    assert all(getattr(core, f) is getattr(python, f) for f in extension.RequestRecord.FIELDS)
    assert core == python and python == core and core == as_core_record(python, extension)
    other = dataclasses.replace(python, spec_steps=4)
    assert core != other and other != core and core != as_core_record(other, extension)
    assert core != object() and (core == 1) is False
    assert repr(core) == repr(python)
    assert core.succeeded is python.succeeded is False
    assert as_core_record(dataclasses.replace(python, outcome="stop"), extension).succeeded is True
    with pytest.raises(TypeError, match="unhashable"):
        hash(core)
    with pytest.raises(AttributeError):
        core.outcome = "stop"
    with pytest.raises(ValueError, match="takes its 49 fields, 48 given"):
        extension.RequestRecord(*[getattr(python, f) for f in extension.RequestRecord.FIELDS][:-1])
