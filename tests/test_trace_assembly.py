"""Trace assembly at scale: a span's cost does not depend on how many spans its trace already holds
(readiness, completion, decision), and spans beyond ``max_spans_per_trace`` are counted as dropped.

Costs are counted, not timed: every lookup and every element iterated in a trace's span table,
and every line of otel_llm's code executed."""

from __future__ import annotations

import random
import time
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from pathlib import Path

import pytest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from otel_llm.pdata.observation import EngineObservation
from otel_llm.processor.tail_sampling import assembler as traces
from otel_llm.processor.llm_metrics.requests import RecordSettings, records_of_trace
from otel_llm.internal import core as native_core
from otel_llm.processor.tail_sampling.assembler import (
    AssemblySettings,
    BufferedSpan,
    NativeTraceAssembler,
    Origin,
    PendingTrace,
    TraceAssembler,
)
from otel_llm.config import TailSamplingProcessor
from otel_llm.pdata.traces import DROP, CompletedTrace, Remembered
from otel_llm.processor.tail_sampling.sampler import TailSampler
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.support.payloads import gateway_batch, vllm_batch

ORIGIN = Origin(Resource(), InstrumentationScope(), "svc", {})
TRACE_ID = b"\x01" * 16


class CountingSpans(dict):  # type: ignore[type-arg]
    """A trace's span table that counts what is done to it: lookups, stores, and iterated elements."""

    operations = 0

    def get(self, key, default=None):  # type: ignore[no-untyped-def]
        CountingSpans.operations += 1
        return super().get(key, default)

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        CountingSpans.operations += 1
        return super().__getitem__(key)

    def __setitem__(self, key, value) -> None:  # type: ignore[no-untyped-def]
        CountingSpans.operations += 1
        super().__setitem__(key, value)

    def __contains__(self, key) -> bool:  # type: ignore[no-untyped-def]
        CountingSpans.operations += 1
        return super().__contains__(key)

    def __iter__(self):  # type: ignore[no-untyped-def]
        CountingSpans.operations += len(self)
        return super().__iter__()

    def values(self):  # type: ignore[no-untyped-def]
        CountingSpans.operations += len(self)
        return super().values()

    def items(self):  # type: ignore[no-untyped-def]
        CountingSpans.operations += len(self)
        return super().items()

    def keys(self):  # type: ignore[no-untyped-def]
        CountingSpans.operations += len(self)
        return super().keys()


@pytest.fixture
def counted(monkeypatch):
    """Every trace the assembler creates gets a counting span table."""
    monkeypatch.setattr(traces, "PendingTrace",
                        lambda trace_id, first_seen: PendingTrace(trace_id, first_seen, CountingSpans()))
    CountingSpans.operations = 0
    return CountingSpans


def sid(i: int) -> bytes:
    return i.to_bytes(8, "big")


def span(i: int, parent: int | None, engine: bool) -> BufferedSpan:
    observation = EngineObservation("vllm", "vllm_v1", ttft_s=0.1, e2e_s=1.0) if engine else None
    return BufferedSpan(TRACE_ID, sid(i), sid(parent) if parent is not None else b"", 2, 0, 1, 2, "", b"",
                        ORIGIN, (), observation)


class Completed:
    """The next stage: collects what the buffer completes (late spans are not what these tests count)."""

    def __init__(self, into: list[PendingTrace]) -> None:
        self.into = into

    def consume_batch(self, batch: list[CompletedTrace]) -> None:
        self.into.extend(completed.trace for completed in batch if not completed.late)


def assembler(completed: list[PendingTrace] | None = None, max_spans: int = 1_000_000) -> TraceAssembler:
    done = completed if completed is not None else []
    return TraceAssembler(AssemblySettings(decision_wait_s=1e9, grace_s=0.0, max_spans_per_trace=max_spans),
                          Completed(done), clock=lambda: 0.0)


GATEWAY_DEPTH = 8  # a root and 7 gateway/middleware spans above every engine span


def gateway_chain() -> list[BufferedSpan]:
    return [span(1, None, False)] + [span(d, d - 1, False) for d in range(2, GATEWAY_DEPTH + 1)]


def operations_per_engine_span(counter: type[CountingSpans], engine_spans: int, gateways_first: bool) -> float:
    """Engine spans of one trace, one export request each (what a pending trace sees from a busy
    fleet); the gateway chain before or after them."""
    assembly = assembler()
    if gateways_first:
        assembly.add_batch(gateway_chain())
    counter.operations = 0
    for i in range(engine_spans):
        assembly.add_batch([span(100 + i, GATEWAY_DEPTH, True)])
    if not gateways_first:
        assert assembly.tick() == 0  # nothing rooted yet: waiting for the gateway
        assembly.add_batch(list(reversed(gateway_chain())))  # nearest gateway first, the root last
    assert assembly.tick() == 1  # rooted: completed
    return counter.operations / engine_spans


@pytest.mark.parametrize("gateways_first", [True, False], ids=["gateway-first", "gateway-last"])
def test_readiness_cost_per_span_does_not_grow_with_the_trace(counted, gateways_first):
    small = operations_per_engine_span(counted, 100, gateways_first)
    large = operations_per_engine_span(counted, 10_000, gateways_first)
    print(f"\nspan-table operations per engine span: {small:.1f} at 100 spans, {large:.1f} at 10 000")
    # Quadratic readiness (every engine span's chain walked again on every add) costs ~50x more
    # per span at 10 000 than at 100; constant cost is the same, plus rounding.
    assert large <= small * 1.1 + 1
    assert large <= 3 * (GATEWAY_DEPTH + 2)


def test_readiness_matches_a_full_walk_on_random_traces():
    """The incremental readiness says what walking every engine span's ancestors says, after every
    batch: parents missing, arriving late, in any order, resent, cycles and chains beyond the walk's
    bound."""
    rng = random.Random(7)
    for round_ in range(300):
        ids = list(range(1, rng.randint(2, 90)))
        parents: dict[int, int | None] = {}
        for i in ids:
            choice = rng.random()
            if choice < 0.15:
                parents[i] = None  # a root
            elif choice < 0.2:
                parents[i] = 10_000 + i  # a parent that never arrives
            elif choice < 0.25:
                parents[i] = rng.choice(ids)  # anything, cycles included
            else:
                parents[i] = rng.choice([j for j in ids if j < i] or [None])  # type: ignore[list-item]
        if round_ % 10 == 0:  # a chain deeper than the walk's bound
            ids = list(range(1, traces.MAX_ANCESTRY + 5))
            parents = {i: (i - 1 if i > 1 else None) for i in ids}
        engine = {i: rng.random() < 0.4 for i in ids}
        order = ids[:]
        rng.shuffle(order)
        assembly = assembler()
        sent: list[int] = []
        while order:
            size = rng.randint(1, 5)
            batch, order = order[:size], order[size:]
            if sent and rng.random() < 0.2:
                batch.append(rng.choice(sent))  # an exporter's retry: the same span again
            sent += batch
            assembly.add_batch([span(i, parents[i], engine[i]) for i in batch])
            pending = assembly._pending.get(TRACE_ID)
            if pending is None:
                break
            expected = [s for s in pending.spans.values() if s.is_engine and not pending.is_rooted(s)]
            assert pending.unrooted == len(expected), (round_, parents, engine)
            if pending.has_engine_span and not expected:
                assert pending.ready_at is not None


def executed_lines(function: Callable[[], object]) -> tuple[object, int]:
    """``function()`` and how many lines of otel_llm's code it executed: a deterministic measure of
    work that sees every loop, whatever data structure it walks."""
    package = str(Path(traces.__file__).parent.parent)
    count = 0

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal count
        if event == "line":
            count += 1
        return local

    def global_(frame, event, arg):  # type: ignore[no-untyped-def]
        return local if frame.f_code.co_filename.startswith(package) else None

    sys.settrace(global_)
    try:
        result = function()
    finally:
        sys.settrace(None)
    return result, count


def completion_lines(engine_spans: int, parent_kind: int) -> tuple[float, float]:
    """Lines executed per engine span to assemble, then decide, a completed trace of ``engine_spans``
    engine spans under one gateway chain (the engines' parent of ``parent_kind``)."""
    completed: list[PendingTrace] = []
    assembly = assembler(completed)
    chain = gateway_chain()
    chain[-1].kind = parent_kind
    assembly.add_batch(chain + [span(100 + i, GATEWAY_DEPTH, True) for i in range(engine_spans)])
    assembly.drain()
    (trace,) = completed
    sampler = TailSampler(TailSamplingProcessor())
    records, assembled = executed_lines(lambda: records_of_trace(trace, RecordSettings()))
    assert len(records) == engine_spans  # type: ignore[arg-type]
    _, decided = executed_lines(lambda: sampler.decide(trace, records))  # type: ignore[arg-type]
    return assembled / engine_spans, decided / engine_spans


@pytest.mark.parametrize("parent_kind", [Span.SPAN_KIND_SERVER, Span.SPAN_KIND_INTERNAL], ids=["server", "internal"])
def test_completion_and_decision_cost_per_span_does_not_grow_with_the_trace(parent_kind):
    small_records, small_decision = completion_lines(100, parent_kind)
    large_records, large_decision = completion_lines(1000, parent_kind)
    print(f"\nlines per engine span: records {small_records:.0f} -> {large_records:.0f}, "
          f"decision {small_decision:.0f} -> {large_decision:.0f} (100 -> 1000 spans)")
    # Linear work is the same per span at both sizes (plus per-trace constants spread thinner);
    # a walk over the trace per span is 10x.
    assert large_decision <= small_decision * 1.2 + 5
    assert large_records <= small_records * 1.2 + 5


def test_spans_beyond_max_spans_per_trace_are_counted_on_metrics(make_server):
    server = make_server({"processors": {"tail_sampling": {"max_spans_per_trace": 5}}})
    request = vllm_batch(8)
    trace_id = request.resource_spans[0].scope_spans[0].spans[0].trace_id
    for sent in request.resource_spans[0].scope_spans[0].spans:
        sent.trace_id = trace_id
    post = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/traces", data=request.SerializeToString(),
                                  headers={"Content-Type": "application/x-protobuf"}, method="POST")
    with urllib.request.urlopen(post, timeout=10) as response:
        assert response.status == 200
    scrape = server.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") == 5,
                               what="the 5 spans within the limit assembled")
    assert scrape.value("otel_llm_spans_dropped_total", reason="max_spans_per_trace") == 3
    assert "otel_llm_spans_dropped_total" in scrape.text


# --- late spans and redeliveries (issue 24: High 3, duplicates) --------------------------------------

def _post(server, request) -> None:  # noqa: ANN001
    post = urllib.request.Request(f"http://127.0.0.1:{server.http_port}/v1/traces", data=request.SerializeToString(),
                                  headers={"Content-Type": "application/x-protobuf"}, method="POST")
    with urllib.request.urlopen(post, timeout=10) as response:
        assert response.status == 200


def _one_trace(count: int, trace_id: bytes):  # noqa: ANN202
    request = vllm_batch(count)
    for sent in request.resource_spans[0].scope_spans[0].spans:
        sent.trace_id = trace_id
    return request


def test_late_spans_of_a_decided_trace_are_bounded_by_max_spans_per_trace(make_server):
    """A decided trace of 3 spans, then 10 late spans of it: with ``max_spans_per_trace: 5`` only 2
    more are taken (one kept trace once grew past 27 000 spans through late spans)."""
    server = make_server({"processors": {"tail_sampling": {"max_spans_per_trace": 5, "grace": "100ms"}}})
    trace_id = bytes(range(1, 17))
    _post(server, _one_trace(3, trace_id))
    server.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") == 3
                      and s.value("otel_llm_traces_in_memory") == 0, what="the trace decided")
    for _ in range(2):
        _post(server, _one_trace(5, trace_id))
    scrape = server.wait_until(lambda s: s.value("otel_llm_spans_dropped_total", reason="max_spans_per_trace") == 8,
                               what="8 late spans over the limit dropped")
    assert scrape.value("otel_llm_requests_assembled_total") == 5


def test_every_span_a_decided_trace_measured_late_or_not_is_a_duplicate_when_redelivered(make_server):
    """A trace of two engine spans is decided; two late engine spans of it are measured, one after
    the other; then all four are sent again: each copy is a duplicate (the decision cache remembers
    every span measured, the trace's two and the late ones), and no request is measured twice."""
    server = make_server({"processors": {"tail_sampling": {"grace": "100ms"}}})
    trace_id = bytes(range(17, 33))
    first = _one_trace(2, trace_id)
    _post(server, first)
    server.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") == 2
                      and s.value("otel_llm_traces_in_memory") == 0, what="the trace decided")
    late = [_one_trace(1, trace_id), _one_trace(1, trace_id)]
    for measured, request in enumerate(late, start=3):
        _post(server, request)
        server.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") == measured,
                          what=f"late span {measured - 2} measured")
    for request in [first, *late]:
        _post(server, request)
    scrape = server.wait_until(lambda s: s.value("otel_llm_spans_duplicate_total") == 4, what="4 copies counted")
    assert scrape.value("otel_llm_requests_assembled_total") == 4
    assert scrape.value("vllm:e2e_request_latency_seconds_count") == 4
    assert scrape.value("otel_llm_traces_in_memory") == 0


def test_a_redelivered_request_is_counted_once_and_as_duplicates(make_server):
    """The same export twice (a sender that retried a request whose answer it never got), while its
    traces are pending and again once they are decided: each span measured once, the copies counted."""
    server = make_server({"processors": {"tail_sampling": {"grace": "100ms"}}})
    request = vllm_batch(4)
    _post(server, request)
    _post(server, request)  # pending still (grace 100 ms is after the worker took both, or not: either way)
    server.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == 0
                      and s.value("otel_llm_requests_assembled_total") >= 4, what="decided")
    _post(server, request)  # decided by now: the decision cache knows the spans
    scrape = server.wait_until(lambda s: s.value("otel_llm_spans_duplicate_total") == 8, what="8 copies counted")
    assert scrape.value("otel_llm_requests_assembled_total") == 4
    assert scrape.value("vllm:e2e_request_latency_seconds_count") == 4


def test_a_request_redelivered_after_a_graceful_restart_is_a_duplicate(tmp_path):
    """A replica stopped (SIGTERM) after taking a request, restarted on the same store, then sent the
    same request again (the Collector's retry of a call whose answer the stop cut): the decision
    cache kept across the restart makes it a duplicate, not a second request (the rolling-restart
    test's "0 lost, 1 extra")."""
    from otel_llm.exporter.store.sqlite import StoreReader
    from tests.support.otelllm import ServerProcess

    config = {"processors": {"tail_sampling": {"grace": "100ms", "policies": [
        {"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}}}
    request = vllm_batch(3)
    first = ServerProcess(tmp_path, config)
    try:
        first.start()
        _post(first, request)
        first.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") == 3
                         and s.value("otel_llm_traces_in_memory") == 0, what="decided")
        assert first.stop() == 0
    finally:
        first.ensure_stopped()
    second = ServerProcess(tmp_path, config)
    try:
        second.start()
        _post(second, request)
        scrape = second.wait_until(lambda s: s.value("otel_llm_spans_duplicate_total") == 3, what="3 duplicates")
        assert scrape.value("otel_llm_requests_assembled_total") == 0
        assert second.stop() == 0
    finally:
        second.ensure_stopped()
    assert len(StoreReader(tmp_path / "store").list_requests(limit=100)) == 3


@pytest.mark.parametrize("hand_over", [True, False])
def test_a_gateway_span_pending_at_a_graceful_stop_joins_its_engine_span_after_the_restart(tmp_path, hand_over):
    """The rolling-restart split: a gateway's span reached the replica, the engine's export had not
    when SIGTERM came; behind the load balancer the engine's span reaches the next process. Handed
    over (``hand_over_pending_traces: true``) the two are one request, as without the restart; deciding at stop
    (``hand_over_pending_traces: false``) counts the gateway span as a request of its own. Every
    pending trace is handed over (an engine span waiting for its parent too, measured once by the
    next process); no content reaches the handover file."""
    import sqlite3

    from tests.support.otelllm import ServerProcess

    config = {"processors": {"tail_sampling": {"grace": "100ms", "decision_wait": "120s", "policies": [
        {"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}},
        "service": {"hand_over_pending_traces": hand_over}}  # off by default
    whole = gateway_batch()
    scope = whole.resource_spans[0].scope_spans[0]
    engine_span, gateway_span = scope.spans[0], scope.spans[1]
    secret = "the user's prompt: SECRET-4711"
    kv = gateway_span.attributes.add()
    kv.key, kv.value.string_value = "gen_ai.prompt", secret
    gateway_only, engine_only = ExportTraceServiceRequest(), ExportTraceServiceRequest()
    for request, span in ((gateway_only, gateway_span), (engine_only, engine_span)):
        resource_spans = request.resource_spans.add()
        resource_spans.resource.CopyFrom(whole.resource_spans[0].resource)
        scope_spans = resource_spans.scope_spans.add()
        scope_spans.scope.CopyFrom(scope.scope)
        scope_spans.spans.append(span)
    orphan = vllm_batch(1, parent=True)  # an engine span whose parent never comes: decided at stop
    trace_hex, orphan_hex = engine_span.trace_id.hex(), orphan.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()
    handover = tmp_path / "store" / "handover"
    # The next process decides at its stop what never completes (the orphan): its decision_wait stays
    # long, so the gateway span taken over waits for its engine span however slow the start is.
    restarted = {**config, "service": {"hand_over_pending_traces": False}}

    first = ServerProcess(tmp_path, config)
    try:
        first.start()
        _post(first, gateway_only)
        _post(first, orphan)
        first.wait_until(lambda s: s.value("otel_llm_traces_in_memory") == 2, what="both traces pending")
        assert first.stop() == 0
    finally:
        first.ensure_stopped()
    assert handover.exists() == hand_over
    if hand_over:
        data = handover.read_bytes()
        assert gateway_span.span_id in data and b"SECRET-4711" not in data
    second = ServerProcess(tmp_path, restarted)
    try:
        second.start()
        scrape = second.scrape()
        assert scrape.value("otel_llm_spans_taken_over_total") == (2 if hand_over else 0)
        assert not handover.exists()  # one start takes it
        _post(second, engine_only)
        second.wait_until(lambda s: s.value("otel_llm_receiver_accepted_spans_total") == 1, what="the engine span")
        assert second.stop() == 0
    finally:
        second.ensure_stopped()
    with sqlite3.connect(tmp_path / "store" / "traces.db") as connection:
        rows = connection.execute("SELECT trace_id, span_id FROM requests").fetchall()
        stored_spans = {(t, s) for t, s in connection.execute("SELECT trace_id, span_id FROM spans")}
        texts = "".join(str(row) for row in connection.execute("SELECT * FROM spans"))
    assert sum(1 for t, _ in rows if t == orphan_hex) == 1
    requests_of_trace = sorted(s for t, s in rows if t == trace_hex)
    if hand_over:
        assert requests_of_trace == [engine_span.span_id.hex()]  # one request, as the whole trace gives
    else:
        assert requests_of_trace == sorted([engine_span.span_id.hex(), gateway_span.span_id.hex()])
    assert (trace_hex, gateway_span.span_id.hex()) in stored_spans
    assert "SECRET-4711" not in texts


def test_a_large_trace_is_answered_a_page_at_a_time(make_server):
    """/api/traces/{id} of a kept trace of 2500 engine spans (and their synthesized segments): pages
    of at most 2000 spans with the total and the next offset, which together give every span once (a
    27 000-span trace once answered 568.7 MB in one piece)."""
    import json

    server = make_server({"processors": {"tail_sampling": {"grace": "100ms", "policies": [
        {"name": "all", "type": "probabilistic", "probabilistic": {"sampling_percentage": 100}}]}}})
    trace_id = bytes(range(32, 48))
    _post(server, _one_trace(2500, trace_id))
    server.wait_until(lambda s: s.value("otel_llm_requests_assembled_total") == 2500
                      and s.value("otel_llm_traces_in_memory") == 0, what="the trace decided")
    seen: list[str] = []
    offset: int | None = 0
    pages = 0
    deadline = time.monotonic() + 30
    while offset is not None:
        try:
            with urllib.request.urlopen(f"{server.metrics_url}/api/traces/{trace_id.hex()}?span_offset={offset}",
                                        timeout=30) as response:
                page = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
            page = {"span_count": 0}
        if page["span_count"] < 2500:  # the store writer commits a little after the decision
            assert time.monotonic() < deadline, page["span_count"]
            time.sleep(0.2)
            continue
        assert len(page["spans"]) <= 2000 and page["span_offset"] == offset
        seen += [span["span_id"] for span in page["spans"]]
        offset = page["next_span_offset"]
        pages += 1
    total = page["span_count"]  # the 2500 spans and the segment spans synthesized under each
    assert total > 2500 and pages == -(-total // 2000) and len(seen) == len(set(seen)) == total


def _native_assembler(settings: AssemblySettings, next: Any, clock: Callable[[], float] = time.monotonic,
                      **counters: Any) -> TraceAssembler:
    extension = native_core.select("auto")[0]
    if extension is None:
        pytest.skip("the compiled core is not installed")
    return NativeTraceAssembler(settings, next, extension, clock=clock, **counters)


@pytest.fixture(params=["python", "native"])
def Assembler(request: pytest.FixtureRequest) -> Callable[..., TraceAssembler]:
    """The buffer under test: the Python reference, and the compiled core's (``NativeTraceAssembler``)."""
    return TraceAssembler if request.param == "python" else _native_assembler


def test_a_late_span_arriving_while_its_trace_is_completed_follows_the_decision(
        Assembler: Callable[..., TraceAssembler]):
    """A span of a trace that arrives while that trace is being completed (after the buffer let it go,
    before the decision is remembered: a gateway's batch landing in that window under load) waits for
    the decision and follows it; it used to be dropped as if the trace were not kept (the
    rolling-restart test's "2253 spans stored, 2287 sent")."""
    from otel_llm.pdata.traces import Decision, Remembered

    handed: list[CompletedTrace] = []

    class Chain:
        def consume_batch(self, batch: list[CompletedTrace]) -> None:
            handed.extend(batch)
            for completed in batch:
                if not completed.late:  # mid-completion: a late span of this very trace arrives
                    buffer.add_batch([span(50, 1, engine=False)])
                    buffer.remember_decisions([(completed.trace_id, Remembered(Decision(True, "all"), set()))])

    buffer = Assembler(AssemblySettings(decision_wait_s=1e9, grace_s=0.0), Chain(), clock=lambda: 0.0)
    buffer.add_batch([span(1, None, engine=False), span(2, 1, engine=True)])
    assert buffer.tick() == 1
    late = [c for c in handed if c.late]
    assert len(late) == 1 and late[0].prior is not None and late[0].prior.decision.keep
    assert list(late[0].trace.spans) == [sid(50)]


def test_at_max_traces_a_due_trace_is_completed_as_ready_before_any_is_cut_short(
        Assembler: Callable[..., TraceAssembler]):
    """A ticker behind (saturation) leaves due traces buffered; reaching ``max_traces`` completes
    them ("ready"), and only once none is due the oldest trace early ("memory_limit")."""
    clock = [0.0]
    completions: list[tuple[bytes, str]] = []

    class Record:
        def consume_batch(self, batch: list[CompletedTrace]) -> None:
            completions.extend((completed.trace.trace_id, completed.reason) for completed in batch)

    buffer = Assembler(AssemblySettings(decision_wait_s=1e9, grace_s=1.0, max_traces=3), Record(),
                            clock=lambda: clock[0])

    def request(number: int, rooted: bool) -> list[BufferedSpan]:
        trace_id = number.to_bytes(16, "big")
        engine = span(2, 1 if rooted else 9, True)
        engine.trace_id = trace_id
        if not rooted:
            return [engine]  # its parent (9) never comes: never ready
        root = span(1, None, False)
        root.trace_id = trace_id
        return [root, engine]

    buffer.add_batch(request(1, rooted=False))  # the oldest, never ready
    buffer.add_batch(request(2, rooted=True))   # ready, due at 1.0
    clock[0] = 0.5
    buffer.add_batch(request(3, rooted=True))   # ready, due at 1.5
    clock[0] = 1.2  # trace 2 is due, trace 3 not yet; the ticker has not run
    buffer.add_batch(request(4, rooted=False))
    assert completions == [((2).to_bytes(16, "big"), "ready")]
    buffer.add_batch(request(5, rooted=False))  # nothing due: the oldest is cut short
    assert completions[1:] == [((1).to_bytes(16, "big"), "memory_limit")]
    assert len(buffer) == 3 and buffer.completions == {"ready": 1, "memory_limit": 1}
    clock[0] = 2.0
    assert buffer.tick() == 1 and completions[2:] == [((3).to_bytes(16, "big"), "ready")]


def test_a_ready_trace_that_left_early_and_came_back_holds_back_no_trace_due_before_it(
        Assembler: Callable[..., TraceAssembler]) -> None:
    """Trace A is ready, then completed early (memory pressure) and forgotten; a span of it opens A
    again, ready later than trace X. A tick after X is due completes X, not held back behind A's
    first readiness, and A at its own time."""
    clock = [0.0]
    completions: list[tuple[int, str]] = []

    class Record:
        def consume_batch(self, batch: list[CompletedTrace]) -> None:
            completions.extend((completed.trace.trace_id[0], completed.reason) for completed in batch)

    buffer = Assembler(AssemblySettings(decision_wait_s=1e9, grace_s=1.0, decided_cache_size=0), Record(),
                            clock=lambda: clock[0])

    def rooted(trace: int) -> list[BufferedSpan]:
        root, engine = span(1, None, False), span(2, 1, True)
        root.trace_id = engine.trace_id = bytes([trace]) * 16
        return [root, engine]

    buffer.add_batch(rooted(0xA))  # due at 1.0
    clock[0] = 0.1
    buffer.add_batch(rooted(0xB))  # X: due at 1.1
    clock[0] = 0.2
    assert buffer.shed(0.5) == 1 and completions == [(0xA, "memory_pressure")]  # A, and forgotten (no cache)
    clock[0] = 0.3
    buffer.add_batch(rooted(0xA))  # A again: due at 1.3
    clock[0] = 1.2
    assert buffer.tick() == 1 and completions[1:] == [(0xB, "ready")]
    assert buffer.completion_lag() == 0.0  # A is not due yet
    clock[0] = 1.3
    assert buffer.tick() == 1 and completions[2:] == [(0xA, "ready")]
    assert len(buffer) == 0 and buffer.completion_lag() == 0.0


def test_a_span_id_seen_first_as_another_span_then_as_the_engines_makes_the_trace_ready(
        Assembler: Callable[..., TraceAssembler]) -> None:
    """A redelivered span id that is the engine's this time (its first copy had no observation: a
    conflicting copy) replaces the first and starts the engine's readiness: the trace completes
    after the grace, not at ``decision_wait``."""
    done: list[PendingTrace] = []
    assembly = Assembler(AssemblySettings(decision_wait_s=1e9, grace_s=0.0), Completed(done), clock=lambda: 0.0)
    assembly.add_batch([span(1, None, False), span(2, 1, False)])
    assert assembly.tick() == 0  # no engine span: held for decision_wait
    assembly.add_batch([span(2, 1, True)])
    assert assembly.tick() == 1 and done[0].spans[sid(2)].observation is not None
    assert assembly.spans_duplicate == 0  # a different span under a known id, not a redelivery


def test_the_decision_cache_keeps_the_newest_decided_cache_size_traces(
        Assembler: Callable[..., TraceAssembler]) -> None:
    """Four traces completed in one tick with room for two decisions: the two completed last are
    remembered (a span of theirs is late), the first two forgotten (a span of theirs starts a trace)."""
    def engine_span(trace: int, span_id: int) -> BufferedSpan:
        return BufferedSpan(bytes([trace]) * 16, sid(span_id), b"", 2, 0, 1, 2, "", b"", ORIGIN, (),
                            EngineObservation("vllm", "vllm_v1", ttft_s=0.1, e2e_s=1.0))

    batches: list[list[CompletedTrace]] = []

    class Chain:  # decides to drop every trace, as the decision stage remembers it
        def consume_batch(self, batch: list[CompletedTrace]) -> None:
            batches.append(batch)
            buffer.remember_decisions([(c.trace.trace_id, Remembered(DROP, set())) for c in batch if not c.late])

    buffer = Assembler(AssemblySettings(decision_wait_s=1e9, grace_s=0.0, decided_cache_size=2), Chain(),
                            clock=lambda: 0.0)
    buffer.add_batch([engine_span(trace, 1) for trace in (1, 2, 3, 4)])
    assert buffer.tick() == 4 and [c.trace.trace_id[0] for c in batches[0]] == [1, 2, 3, 4]
    buffer.add_batch([engine_span(trace, 2) for trace in (1, 2, 3, 4)])
    assert len(buffer) == 2  # the spans of traces 1 and 2 opened traces again
    assert [(c.trace.trace_id[0], c.late) for c in batches[1]] == [(3, True), (4, True)]


def test_spans_arriving_while_their_trace_is_completed_are_bounded_by_max_spans_per_trace(
        Assembler: Callable[..., TraceAssembler]) -> None:
    """A trace of 2 spans completed with ``max_spans_per_trace: 4``; 5 spans of it arrive before its
    decision is remembered: 2 wait for it and follow it, 3 are dropped over the limit."""
    from otel_llm.pdata.traces import Decision

    handed: list[CompletedTrace] = []

    class Chain:
        def consume_batch(self, batch: list[CompletedTrace]) -> None:
            handed.extend(batch)
            for completed in batch:
                if not completed.late:
                    buffer.add_batch([span(50 + i, 1, engine=False) for i in range(5)])
                    buffer.remember_decisions([(completed.trace_id, Remembered(Decision(True, "all"), set()))])

    buffer = Assembler(AssemblySettings(decision_wait_s=1e9, grace_s=0.0, max_spans_per_trace=4), Chain(),
                            clock=lambda: 0.0)
    buffer.add_batch([span(1, None, engine=False), span(2, 1, engine=True)])
    assert buffer.tick() == 1
    late = [c for c in handed if c.late]
    assert [list(c.trace.spans) for c in late] == [[sid(50)], [sid(51)]]
    assert all(c.prior is not None and c.prior.decision.keep for c in late)
    assert buffer.spans_dropped_over_trace_limit == 3
    buffer.add_batch([span(60, 1, engine=False)])  # decided now, and still at its limit
    assert buffer.spans_dropped_over_trace_limit == 4 and len(handed) == 3


def test_a_restored_decision_counts_the_spans_it_measured_against_max_spans_per_trace(
        Assembler: Callable[..., TraceAssembler]) -> None:
    """A decision restored after a graceful restart, of a trace that measured 3 spans, with
    ``max_spans_per_trace: 4``: one late span more is taken, the next two are dropped."""
    from otel_llm.pdata.traces import Decision

    handed: list[CompletedTrace] = []

    class Chain:
        def consume_batch(self, batch: list[CompletedTrace]) -> None:
            handed.extend(batch)

    buffer = Assembler(AssemblySettings(decision_wait_s=1e9, grace_s=0.0, max_spans_per_trace=4), Chain(),
                            clock=lambda: 0.0)
    buffer.restore_decisions([(TRACE_ID, Remembered(Decision(True, "all"), {sid(1), sid(2), sid(3)}))])
    buffer.add_batch([span(10 + i, 1, engine=False) for i in range(3)])
    assert [list(c.trace.spans) for c in handed] == [[sid(10)]] and handed[0].late
    assert buffer.spans_dropped_over_trace_limit == 2
    assert [trace_id for trace_id, _ in buffer.decisions()] == [TRACE_ID]
