"""What a buffered span holds, made smaller (issue 25, ``python -m bench --rss-only``) without
changing what it says: every field reads back as given, and what spans share (a trace's ids, an
SGLang stage's observation, equal attribute tuples) is one object, not equal copies."""

from __future__ import annotations

import inspect

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.internal import core as native_core

from otel_llm.pdata.observation import OBSERVATION_FIELDS, EngineObservation
from otel_llm.pdata.traces import CompletedTrace
from otel_llm.processor.llm_metrics.adapters.engines import SGLANG_STAGES, sglang_stage_observation
from otel_llm.processor.llm_metrics.digest import (
    AttributeLimits, DigestSettings, digest_in_process, shared_attrs)
from otel_llm.processor.tail_sampling.assembler import AssemblySettings, BufferedSpan, Origin, TraceAssembler

ORIGIN = Origin(Resource(), InstrumentationScope(), "svc", {})
TRACE_ID = bytes(range(16))

# A value for every field that differs from its default, so a field dropped or mixed up shows.
EVERY_FIELD_SET: dict[str, object] = {
    "engine_kind": "vllm", "adapter": "vllm_v1", "ttft_s": 0.125, "e2e_s": 2.5, "queue_s": 0.25, "prefill_s": 0.5,
    "decode_s": 1.75, "inference_s": 2.25, "preprocess_s": 0.0625, "prompt_tokens": 1000, "completion_tokens": 300,
    "max_tokens": 512, "request_model": "m-req", "response_model": "m-resp", "finish_reason": "stop",
    "operation_name": "chat", "provider_name": "vllm", "server_address": "10.0.0.1", "server_port": "8000",
    "is_error": True, "error_type": "timeout", "may_be_gateway": True, "cached_tokens": 64, "cache_write_tokens": 32,
    "spec_decode": (3, 5, 2), "spec_decode_rejected": "no verify steps", "reasoning_tokens": 17, "tpot_s": 0.01,
    "itl_s": (0.02, 0.03), "part": "sglang_stage", "marks": ("stage", "prefill_forward"), "derived": ("prefill_s",),
}


def test_every_observation_field_reads_back_as_given_and_round_trips_in_field_order() -> None:
    named = tuple(name for name, parameter in inspect.signature(EngineObservation).parameters.items()
                  if parameter.kind is not inspect.Parameter.VAR_KEYWORD)
    assert named == OBSERVATION_FIELDS
    carried = EngineObservation("vllm", "vllm_v1", request_n=2)  # a field a shape declares beyond these
    assert carried.carried() == {"request_n": 2} and carried != EngineObservation("vllm", "vllm_v1")
    assert set(EVERY_FIELD_SET) == set(OBSERVATION_FIELDS)
    observation = EngineObservation(**EVERY_FIELD_SET)  # type: ignore[arg-type]
    assert {name: getattr(observation, name) for name in OBSERVATION_FIELDS} == EVERY_FIELD_SET
    copy = EngineObservation(*(EVERY_FIELD_SET[name] for name in OBSERVATION_FIELDS))  # type: ignore[arg-type]
    assert copy == observation and copy.as_tuple() == tuple(EVERY_FIELD_SET[name] for name in OBSERVATION_FIELDS)
    assert observation.mark("stage") == "prefill_forward"


def test_an_observation_with_only_its_engine_fields_has_the_documented_defaults() -> None:
    observation = EngineObservation("tgi", "tgi", e2e_s=1.5)
    assert (observation.preprocess_s, observation.error_type, observation.cache_write_tokens, observation.spec_decode,
            observation.spec_decode_rejected, observation.reasoning_tokens, observation.tpot_s) == (None,) * 7
    assert (observation.itl_s, observation.marks, observation.derived, observation.part) == ((), (), (), "")
    assert observation.e2e_s == 1.5 and observation.mark("stage") is None
    assert observation != EngineObservation("tgi", "tgi", e2e_s=1.5, preprocess_s=0.5)
    assert observation == EngineObservation("tgi", "tgi", e2e_s=1.5)


def test_equal_string_attributes_are_one_tuple_and_other_values_are_never_merged() -> None:
    model = "m-" + "shared".upper()  # built at run time: not a constant the compiler already shares
    first = shared_attrs(("gen_ai.request.model", model))
    assert shared_attrs(("gen_ai.request.model", "m-" + "SHARED")) is first
    # 1, 1.0 and True are equal as tuple items: each keeps its own tuple, with its own type.
    for value in (1, 1.0, True, [1]):
        attrs = ("error.type", value)
        assert shared_attrs(attrs) is attrs and type(attrs[1]) is type(value)
    one = shared_attrs(("error.type", 1))
    assert type(shared_attrs(("error.type", True))[1]) is bool and type(one[1]) is int


def _genai_request(models: list[str]) -> bytes:
    request = ExportTraceServiceRequest()
    scope_spans = request.resource_spans.add().scope_spans.add()
    for index, model in enumerate(models):
        span = scope_spans.spans.add(trace_id=bytes([index + 1]) * 16, span_id=bytes([index + 1]) * 8, name="chat",
                                     kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=1_000, end_time_unix_nano=2_000)
        for key, value in (("gen_ai.operation.name", "chat"), ("gen_ai.provider.name", "openai"),
                           ("gen_ai.request.model", model)):
            span.attributes.add(key=key, value=AnyValue(string_value=value))
    return request.SerializeToString()


@pytest.mark.parametrize("core", ["python", "native"])
def test_spans_of_one_model_hold_one_attributes_tuple_on_either_path(core: str) -> None:
    selected = native_core.select(core) if core == "python" or _extension_built() else None
    if selected is None:
        pytest.skip("the compiled core is not built")
    settings = DigestSettings(AttributeLimits(256, 16 * 1024), 3600.0, ("gen_ai.request.model",), frozenset())
    saved = native_core._selected
    native_core._selected = selected
    request = _genai_request(["gpt-a", "gpt-b", "gpt-a"])
    try:
        in_process, _ = digest_in_process(request, settings)
    finally:
        native_core._selected = saved
    for spans in (in_process,):
        assert [span.attrs for span in spans] == [("gen_ai.request.model", m) for m in ("gpt-a", "gpt-b", "gpt-a")]
        assert spans[0].attrs is spans[2].attrs and spans[1].attrs is not spans[0].attrs
        assert all(span.observation is not None and span.observation.request_model == span.attrs[1] for span in spans)


def _extension_built() -> bool:
    try:
        return native_core.select("native")[0] is not None
    except native_core.CoreUnavailable:
        return False


def test_every_span_of_a_stage_shares_one_observation_equal_to_a_fresh_one() -> None:
    for name in SGLANG_STAGES:
        shared = sglang_stage_observation(name)
        assert sglang_stage_observation(name) is shared
        assert shared == EngineObservation("sglang", "sglang_stage", part="sglang_stage", marks=("stage", name))


def _span(span_id: int, parent_id: int | None) -> BufferedSpan:
    # Fresh bytes objects for every id, as the adapter stage makes them for each span it reads.
    parent = bytes(bytearray(parent_id.to_bytes(8, "big"))) if parent_id is not None else b""
    return BufferedSpan(bytes(bytearray(TRACE_ID)), bytes(bytearray(span_id.to_bytes(8, "big"))), parent,
                        2, 0, 1, 2, "", b"", ORIGIN, ())


def test_a_child_buffered_after_its_parent_holds_the_parents_id_object() -> None:
    assembler = TraceAssembler(AssemblySettings(decision_wait_s=1e9, grace_s=0.0), _Discard(), clock=lambda: 0.0)
    # Trace of root 1 <- 2 <- 3 and 1 <- 4: span 3 comes before its parent 2, 2 and 4 after theirs.
    assembler.add_batch([_span(3, 2)])
    assembler.add_batch([_span(1, None), _span(2, 1)])
    assembler.add_batch([_span(4, 1)])
    (trace,) = assembler._pending.values()
    spans = {int.from_bytes(span_id, "big"): span for span_id, span in trace.spans.items()}
    assert sorted(spans) == [1, 2, 3, 4]
    assert [spans[child].parent_span_id for child in (2, 3, 4)] == [(1).to_bytes(8, "big"), (2).to_bytes(8, "big"),
                                                                     (1).to_bytes(8, "big")]
    assert spans[2].parent_span_id is spans[1].span_id and spans[4].parent_span_id is spans[1].span_id
    assert all(span.trace_id is trace.trace_id for span in spans.values())
    assert trace.is_rooted(spans[3]) and trace.is_rooted(spans[4])


class _Discard:
    def consume_batch(self, batch: list[CompletedTrace]) -> None:
        raise AssertionError("nothing is due while decision_wait is not over")
