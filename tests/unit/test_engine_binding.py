"""``otel_llm._core.Engine``, the native engine's binding (``rust/src/engine.rs``), with the real extension.

The engine is built from what Python declares (``service/declarations.py`` ``engine_declaration``
for a configuration whose sampler keeps requests slower than 1.5 s), the requests are the engine
fixtures' vLLM spans (without per-token events: those are Python's to read).
"""

from __future__ import annotations

import json
import threading
from typing import Any, cast

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from otel_llm.component import Kind, Signal
from otel_llm.config import config_from_dict
from otel_llm.internal import core as native_core
from otel_llm.internal import engine_types as T
from otel_llm.internal.engine_types import NativeEngine
from otel_llm.service.declarations import engine_declaration
from tests.support import engine_fixtures as F

_core = native_core.active()[0]
pytestmark = pytest.mark.skipif(_core is None, reason="the compiled core is not installed")

FAST = (0.010,) * 7  # e2e 0.145 s: dropped
SLOW = (0.500,) * 4  # e2e 2.075 s: kept by the "slow" policy
NOW = 1.0
LATER = 100.0  # past decision_wait (10 s)


SLOW_POLICY = {"name": "slow", "type": "slo", "slo": {"thresholds": {"e2e": "1.5s"}}}


def declaration(shards: int = 1, max_traces: int = 1000) -> dict[str, Any]:
    cfg = config_from_dict({"processors": {"tail_sampling": {"policies": [SLOW_POLICY], "num_traces": max_traces}}})
    processors = {name: getattr(cfg.processors, name) for name in cfg.running(Kind.PROCESSOR, Signal.TRACES)}
    return engine_declaration(processors, write_kept=True, shards=shards)


def make_engine(shards: int = 1, max_traces: int = 1000) -> NativeEngine:
    assert _core is not None
    return cast(NativeEngine, _core.Engine(json.dumps(declaration(shards, max_traces))))


def vllm_request(seed: str, decode_steps: tuple[float, ...] = FAST, token_events: bool = False
                 ) -> ExportTraceServiceRequest:
    return F.vllm_request_span(seed=seed, token_events=token_events, decode_steps=decode_steps)


def samples(text: str) -> dict[str, float]:
    """Each sample's name summed over its series."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def test_ingest_tick_render_counts_what_was_sent() -> None:
    engine = make_engine()
    fast = [vllm_request(f"fast{i}") for i in range(3)]
    slow = [vllm_request(f"slow{i}", SLOW) for i in range(2)]
    for request in fast + slow:
        counts = engine.ingest(request.SerializeToString(), False, NOW)
        assert counts is not None
        matched, malformed, passed_through, invalid_ids, buffered = counts[:5]
        assert (matched, malformed, passed_through, invalid_ids, buffered) == ([("vllm_v1", 1)], [], 0, 0, 1)
        assert counts[5:] == (0, 0, 0, 0, 0)
    assert len(engine) == engine.len() == 5
    assert engine.held_spans() == 5 and engine.heap_bytes() > 0 and engine.shards() == 1

    assert engine.tick(NOW + 0.001)[T.TICK_COMPLETED] == []  # nothing due yet
    out = engine.tick(LATER)
    assert sum(n for _, n in out[T.TICK_COMPLETED]) == 5
    assert out[T.TICK_RECORDS_BUILT] == out[T.TICK_RECORDS_MEASURED] == 5
    assert (out[T.TICK_KEPT_DECISIONS], out[T.TICK_DROPPED_DECISIONS], out[T.TICK_RATE_LIMITED]) == (2, 3, 0)
    assert out[T.TICK_DECLINED] == [] and out[T.TICK_KEPT_DECLINED] == 0
    assert out[T.TICK_ASSEMBLED] == [(("vllm", "stop"), 5)]
    assert out[T.TICK_VALUES_REJECTED] == [] and out[T.TICK_UNMEASURED] == []
    assert [reason for reason, _ in out[T.TICK_REDACTED]] == [
        "content_key", "free_text", "content_event", "not_allowed", "url_reduced"]
    assert len(engine) == 0

    text = engine.render()
    assert "vllm:" in text
    values = samples(text)
    assert values["vllm:request_success_total"] == 5
    assert values["vllm:e2e_request_latency_seconds_count"] == 5
    assert values["vllm:request_prompt_tokens_count"] == 5
    assert values["vllm:request_prompt_tokens_sum"] == 5 * 32
    assert values["vllm:e2e_request_latency_seconds_sum"] == pytest.approx(3 * 0.145 + 2 * 2.075)
    assert "vllm:e2e_request_latency_seconds" in engine.render(openmetrics=True)

    counters = engine.counters()
    assert counters["completed_ready"] + counters["completed_decision_wait"] == 5
    assert (counters["kept"], counters["dropped"], counters["kept_written"]) == (2, 3, 2)
    assert counters["requests_native"] == 5 and counters["requests_python"] == 0
    assert all(isinstance(v, int) for v in counters.values())


def test_kept_traces_come_back_as_export_requests_and_rows() -> None:
    engine = make_engine()
    sent = {vllm_request(f"slow{i}", SLOW).resource_spans[0].scope_spans[0].spans[0].trace_id: i for i in range(2)}
    for i in range(2):
        engine.ingest(vllm_request(f"slow{i}", SLOW).SerializeToString(), False, NOW)
    engine.ingest(vllm_request("fast").SerializeToString(), False, NOW)
    kept = engine.tick(LATER)[T.TICK_KEPT]
    assert {trace_id for trace_id, *_ in kept} == set(sent)
    for trace_id, data, rows, decision in kept:
        request = ExportTraceServiceRequest.FromString(data)
        spans = F.all_spans(request)
        # The engine's span, and the segment spans the writer synthesizes beneath it.
        assert {span.trace_id for span in spans} == {trace_id}
        assert spans[0].name == "chat Qwen/Qwen3-0.6B"
        assert all(span.parent_span_id == spans[0].span_id for span in spans[1:]) and len(spans) > 1
        assert decision == (True, False, "slow", "0")
        assert len(rows) == len(spans)
        for row, span in zip(rows, spans):
            assert len(row) == 11
            assert (row[0], row[1], row[3]) == (trace_id.hex(), span.span_id.hex(), span.name)
            assert (row[6], row[7]) == (span.start_time_unix_nano, span.end_time_unix_nano)
        assert rows[0][5] == "vllm"
        assert json.loads(rows[0][10])["otel_llm.sampling.policy"] == "slow"


@pytest.mark.parametrize("wrap", [
    bytes, bytearray, memoryview,
    lambda b: memoryview(memoryview(b"header" + b)[6:]),  # a view of bytes: copied once, as any non-bytes buffer
    lambda b: memoryview(bytearray(b)).toreadonly(),  # copied: the bytearray may change meanwhile
], ids=["bytes", "bytearray", "memoryview", "memoryview_slice_of_bytes", "readonly_memoryview_of_bytearray"])
def test_ingest_takes_any_buffer(wrap: Any) -> None:
    engine = make_engine()
    counts = engine.ingest(wrap(vllm_request("one").SerializeToString()), True, NOW)
    assert counts is not None and counts[0] == [("vllm_v1", 1)]
    engine.tick(LATER)
    assert samples(engine.render())["vllm:request_success_total"] == 1


def test_ingest_refuses_what_is_no_buffer() -> None:
    engine = make_engine()
    with pytest.raises(TypeError):
        engine.ingest(cast(bytes, "not bytes"), False, NOW)


def _mutated(change: Any) -> str:
    declared = declaration()
    change(declared)
    return json.dumps(declared)


@pytest.mark.parametrize("change, named", [
    (lambda d: d.update(shards=0), "shards"),
    (lambda d: d["assembly"].update(max_traces=-1), "assembly"),
    (lambda d: d["sampler"]["policies"][0].update(type="nope"), r"sampler\.policies\[0\]"),
    (lambda d: d.pop("metrics"), "metrics"),
], ids=["shards", "max_traces", "policy_type", "no_metrics"])
def test_a_bad_configuration_is_a_value_error_naming_the_setting(change: Any, named: str) -> None:
    assert _core is not None
    with pytest.raises(ValueError, match=named):
        _core.Engine(_mutated(change))


def test_a_configuration_that_is_no_json_is_a_value_error() -> None:
    assert _core is not None
    with pytest.raises(ValueError, match="not JSON"):
        _core.Engine("{")


def test_a_request_python_must_read_is_none_and_nothing_is_buffered() -> None:
    engine = make_engine()
    # Per-token events: the shape table's reading of them is Python's.
    assert engine.ingest(vllm_request("events", token_events=True).SerializeToString(), False, NOW) is None
    assert len(engine) == 0
    assert engine.counters()["requests_python"] == 1


def test_malformed_bytes_are_a_value_error_and_the_next_request_is_served() -> None:
    engine = make_engine()
    good = vllm_request("after").SerializeToString()
    for bad in (b"\x0a\xff", good[:-3], b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"):
        with pytest.raises(ValueError, match="malformed ExportTraceServiceRequest"):
            engine.ingest(bad, False, NOW)
    assert len(engine) == 0
    counts = engine.ingest(good, False, NOW)
    assert counts is not None and counts[4] == 1
    out = engine.tick(LATER)
    assert out[T.TICK_RECORDS_MEASURED] == 1
    assert samples(engine.render())["vllm:request_success_total"] == 1


def test_shed_drain_and_shards() -> None:
    engine = make_engine(shards=2, max_traces=100)
    assert engine.shards() == 2
    for i in range(8):
        engine.ingest(vllm_request(f"t{i}").SerializeToString(), False, NOW)
    assert len(engine) == 8
    shed = engine.shed(0.5)
    assert 0 < shed <= 4
    drained = engine.drain()
    assert shed + drained == 8
    out = engine.tick(NOW + 0.001)
    assert dict(out[T.TICK_COMPLETED]) == {"memory_pressure": shed, "shutdown": drained}
    assert len(engine) == 0 and engine.held_spans() == 0
    with pytest.raises(ValueError, match="fraction"):
        engine.shed(1.5)


def _large_request(spans: int) -> bytes:
    template = vllm_request("large")
    span = template.resource_spans[0].scope_spans[0].spans[0]
    request = ExportTraceServiceRequest()
    request.resource_spans.add().CopyFrom(template.resource_spans[0])
    scope = request.resource_spans[0].scope_spans[0]
    del scope.spans[:]
    for i in range(spans):
        copy = scope.spans.add()
        copy.CopyFrom(span)
        copy.trace_id = (i + 1).to_bytes(16, "big")
    return request.SerializeToString()


def test_ingest_releases_the_gil() -> None:
    """A Python thread makes progress while another thread's large ingest runs.

    The worker signals, then calls ``ingest`` at once; this thread, woken by the signal, can only
    run while the worker holds the GIL if ``ingest`` released it. It counts its turns until the
    engine has counted the request (``counters()`` itself releases the GIL while it reads): with the
    GIL held through the ingest, this thread would first run after the request was counted, and
    count no turn.
    """
    spans = 50_000
    engine = make_engine(max_traces=spans)
    data = _large_request(spans)
    started = threading.Event()
    result: list[T.IngestCounts | None] = []

    def worker() -> None:
        started.set()
        result.append(engine.ingest(data, False, NOW))

    thread = threading.Thread(target=worker)
    thread.start()
    started.wait()
    turns = 0
    while thread.is_alive() and engine.counters()["requests_native"] == 0:
        turns += 1
    thread.join()
    counts = result[0]
    assert counts is not None and counts[4] == spans
    assert turns > 0
    assert len(engine) == spans


def test_ingests_and_ticks_on_several_threads_count_every_request_once() -> None:
    """Ingests on four threads while this one ticks: the GIL and the engine's locks never wait on
    each other (every call returns), and every request is measured once."""
    engine = make_engine(shards=2, max_traces=2000)
    batches = [[vllm_request(f"c{t}:{i}").SerializeToString() for i in range(100)] for t in range(4)]
    errors: list[BaseException] = []

    def ingest(batch: list[bytes]) -> None:
        try:
            for data in batch:
                assert engine.ingest(data, False, NOW) is not None
        except BaseException as exc:  # reported below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=ingest, args=(batch,)) for batch in batches]
    for thread in threads:
        thread.start()
    measured = 0
    while any(thread.is_alive() for thread in threads):
        measured += engine.tick(NOW + 2.0)[T.TICK_RECORDS_MEASURED]  # past the grace: ready traces go
        engine.render()
    for thread in threads:
        thread.join()
    assert errors == []
    engine.drain()
    measured += engine.tick(NOW + 2.0)[T.TICK_RECORDS_MEASURED]
    assert measured == 400
    assert samples(engine.render())["vllm:request_success_total"] == 400
    assert engine.counters()["requests_native"] == 400 and len(engine) == 0


def _supplied(request: ExportTraceServiceRequest) -> tuple[list[Any], list[Any]]:
    from otel_llm.processor.llm_metrics.config import LlmMetricsProcessor
    from otel_llm.processor.llm_metrics.digest import digest_in_process, digest_settings
    from otel_llm.processor.redaction.config import RedactionProcessor
    from otel_llm.service.handoff import supplied
    from tests.support.cores import implementation

    with implementation("python"):
        spans, _ = digest_in_process(request.SerializeToString(),
                                     digest_settings(LlmMetricsProcessor(), RedactionProcessor()))
    origins, rows = supplied(spans)
    return list(origins), list(rows)


def test_a_request_python_read_is_supplied_and_measured_as_the_engine_would() -> None:
    """What the reference digest made of a request the engine leaves to Python (vLLM's token
    events) goes to ``supply``: buffered, completed and measured, its observation by field name."""
    engine = make_engine()
    request = vllm_request("supplied", SLOW, token_events=True)
    assert engine.ingest(request.SerializeToString(), False, NOW) is None
    origins, rows = _supplied(request)
    assert [row[11][0] for row in rows] == ["vllm_v1"]
    assert dict(rows[0][11][1])["itl_s"], "the token events' inter-token latencies are supplied"
    counts = engine.supply(origins, rows, NOW)
    assert counts[4] == 1 and len(engine) == 1  # buffered
    engine.drain()
    engine.tick(LATER)
    measured = samples(engine.render())
    assert measured["vllm:e2e_request_latency_seconds_count"] == 1
    assert measured["vllm:inter_token_latency_seconds_count"] == len(dict(rows[0][11][1])["itl_s"])


@pytest.mark.parametrize("change, named", [
    (lambda row: (*row[:11], ("vllm_v1", [("no_such_field", 1.0)])), "no_such_field"),
    (lambda row: (*row[:11], ("no_such_adapter", [])), "no_such_adapter"),
    (lambda row: (*row[:11], ("vllm_v1", [("e2e_s", "slow")])), "e2e_s"),
    (lambda row: (*row[:9], 7, *row[10:]), "origin"),
])
def test_a_supply_the_engine_cannot_take_is_a_value_error_naming_it(change: Any, named: str) -> None:
    engine = make_engine()
    origins, rows = _supplied(vllm_request("refused", SLOW, token_events=True))
    with pytest.raises(ValueError, match=named):
        engine.supply(origins, [change(rows[0])], NOW)
    assert len(engine) == 0  # nothing of it buffered
    engine.ingest(vllm_request("next").SerializeToString(), False, NOW)
    assert len(engine) == 1  # and the engine serves the next request


def test_a_declined_trace_comes_back_with_its_spans_and_can_be_supplied_again() -> None:
    """A trace whose records only Python builds (Triton) is declined at its tick: its spans come back
    as plain data (payloads that parse, origins as received), which ``supply`` takes as they are."""
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    engine = make_engine()
    request = F.triton_request()
    sent = {span.span_id for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans}
    if engine.ingest(request.SerializeToString(), False, NOW) is None:
        origins, rows = _supplied(request)
        engine.supply(origins, rows, NOW)
    engine.drain()
    out = engine.tick(LATER)
    declined = out[T.TICK_DECLINED]
    assert len(declined) == 1 and declined[0][1], declined
    trace_id, _, (origins, rows) = declined[0]
    assert {row[1] for row in rows} == sent and all(row[0] == trace_id for row in rows)
    assert all(Span.FromString(row[8]).span_id == row[1] for row in rows)
    assert all(isinstance(Resource.FromString(origin[0]), Resource) for origin in origins)
    again = make_engine()
    assert again.supply(origins, rows, NOW)[4] == len(rows) and len(again) == 1
