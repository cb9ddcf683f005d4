"""The compiled core's trace buffer (``NativeTraceAssembler``, ``rust/src/buffer.rs``) against the Python
reference (``TraceAssembler``): the same calls, in the same order, on the same span objects, give the
same traces completed (ids, reasons, spans and which copy of each, readiness), the same late spans
with the same decisions, the same counts and the same decision cache, over seeded random workloads
that reach every path: parents late, missing, cyclic or deeper than the walk's bound; resent spans and
conflicting copies; ``max_traces``, ``max_spans_per_trace`` and ``decision_cache_size`` at small
values; calls in flight held past ``decision_wait``, from three senders, under a bound of their own
(``max_open_calls_per_sender``) or none; spans arriving while their trace is completed
and after its decision; memory pressure, hand-overs and restored decisions; ids of unusual lengths
(as a pipeline fed without receivers may see) next to the core's own ``BufferedSpan``."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_llm.internal import core as native_core
from otel_llm.pdata.observation import EngineObservation
from otel_llm.pdata.spans import BufferedSpan, Origin
from otel_llm.pdata.traces import CompletedTrace, Decision, Remembered
from otel_llm.processor.tail_sampling.assembler import (
    MAX_ANCESTRY,
    AssemblySettings,
    NativeTraceAssembler,
    TraceAssembler,
    make_assembler,
)

extension = native_core.select("auto")[0]
pytestmark = pytest.mark.skipif(extension is None, reason="the compiled core is not installed")

ORIGIN = Origin(Resource(), InstrumentationScope(), "svc", {})
SENDERS = [Origin(Resource(), InstrumentationScope(), name, {}) for name in ("svc", "app-a", "app-b")]
CLIENT, SERVER, INTERNAL = 3, 2, 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Chain:
    """The next stage: records what it is handed and decides some traces (by their id, so both
    buffers get the same decisions), as the decision stage does with ``remember_decisions``."""

    def __init__(self) -> None:
        self.buffer: TraceAssembler | None = None
        self.seen: list[tuple[Any, ...]] = []
        self.numbers: dict[int, int] = {}  # id() of each span made -> the order it was made in (the same in both runs)

    def consume_batch(self, batch: list[CompletedTrace]) -> None:
        decided = []
        for completed in batch:
            trace = completed.trace
            prior = completed.prior
            self.seen.append((
                completed.reason, completed.late, trace.trace_id, trace.first_seen,
                [(key, self.numbers.get(id(value))) for key, value in trace.spans.items()],
                None if prior is None else (prior.decision, sorted(prior.measured), prior.taken),
            ) + (() if completed.late else (trace.has_engine_span, trace.ready_at, trace.unrooted,
                                             trace.engine_seen_at)))
            if not completed.late and sum(trace.trace_id) % 3:
                measured = {key for key, span in trace.spans.items() if span.is_engine}
                decided.append((trace.trace_id, Remembered(Decision(sum(trace.trace_id) % 2 == 0, "p"),
                                                           tuple(sorted(measured)))))
        if decided and self.buffer is not None:
            self.buffer.remember_decisions(decided)


def observation(rng: random.Random) -> EngineObservation | None:
    roll = rng.random()
    if roll < 0.45:
        return None
    if roll < 0.9:
        return EngineObservation("vllm", "vllm_v1", ttft_s=0.1, e2e_s=1.0)
    return EngineObservation("genai", "genai", may_be_gateway=True)  # not an engine's own span


def make_span(rng: random.Random, trace_id: bytes, span_number: int, parent: bytes, kind: int) -> Any:
    span_id = span_number.to_bytes(8, "big")
    fields = (trace_id, span_id, parent, kind, 0, 1, 2, "", b"\x0a\x00", rng.choice(SENDERS), (), observation(rng))
    if extension is not None and len(trace_id) == 16 and rng.random() < 0.5:
        return extension.BufferedSpan(*fields)  # the core's own, as its digest makes them
    if len(trace_id) != 16 and rng.random() < 0.5:
        fields = (trace_id, span_id[:4], parent[:4], *fields[3:])  # ids of other lengths
    return BufferedSpan(*fields)


def trace_ids(rng: random.Random) -> list[bytes]:
    ids = [rng.randbytes(16) for _ in range(rng.randint(3, 12))]
    ids.append(rng.randbytes(8))   # lengths no receiver lets through: a pipeline fed directly
    ids.append(rng.randbytes(20))
    return ids


def batch(rng: random.Random, ids: list[bytes], sent: list[Any], numbers: dict[int, int],
          open_calls: float = 0.05) -> list[Any]:
    """``open_calls``: how many spans have a parent that never arrives (a CLIENT one is a call in flight)."""
    spans = []
    for _ in range(rng.randint(1, 8)):
        if sent and rng.random() < 0.15:
            spans.append(rng.choice(sent))  # an exporter's retry: the same object again
            continue
        trace_id = rng.choice(ids)
        number = rng.randint(1, 40)
        roll = rng.random()
        if roll < 0.2:
            parent = b""
        elif roll < 0.2 + open_calls:
            parent = (1000 + number).to_bytes(8, "big")  # never arrives
        else:
            parent = rng.randint(1, 40).to_bytes(8, "big")  # any: late, early, cyclic
        kind = rng.choice((CLIENT, SERVER, INTERNAL, SERVER))
        spans.append(make_span(rng, trace_id, number, parent, kind))
    if rng.random() < 0.05:  # a chain about as deep as the walk's bound, in any order
        trace_id = rng.choice(ids)
        chain = [make_span(rng, trace_id, 100 + depth, (99 + depth).to_bytes(8, "big") if depth else b"", SERVER)
                 for depth in range(MAX_ANCESTRY + rng.randint(-2, 2))]
        rng.shuffle(chain)
        spans += chain
    for span in spans:
        numbers.setdefault(id(span), len(numbers))
    sent.extend(spans)
    return spans


def state(buffer: TraceAssembler, chain: Chain) -> tuple[Any, ...]:
    return (len(buffer), buffer.spans_dropped_over_trace_limit, buffer.spans_duplicate, dict(buffer.completions),
            buffer.held_traces, buffer.held_since(), buffer.completion_lag(),
            [(trace_id, remembered.decision, sorted(remembered.measured), remembered.taken)
             for trace_id, remembered in buffer.decisions()],
            list(chain.seen))


def run(seed: int, native: bool) -> list[tuple[Any, ...]]:
    rng = random.Random(seed)
    settings = AssemblySettings(decision_wait_s=rng.choice((1.0, 3.0)), grace_s=rng.choice((0.0, 0.5, 1.0)),
                                max_open_call_wait_s=rng.choice((0.0, 0.0, 6.0, 6.0)),
                                max_open_calls_per_sender=rng.choice((0, 1, 2, 4)), max_traces=rng.randint(1, 12),
                                max_spans_per_trace=rng.randint(2, 30), decided_cache_size=rng.randint(0, 8))
    open_calls = rng.choice((0.05, 0.05, 0.4))
    clock, chain = Clock(), Chain()
    buffer: TraceAssembler = (NativeTraceAssembler(settings, chain, extension, clock=clock) if native
                              else TraceAssembler(settings, chain, clock=clock))
    chain.buffer = buffer
    ids = trace_ids(rng)
    sent: list[Any] = []
    states = []
    for step in range(rng.randint(20, 120)):
        roll = rng.random()
        if roll < 0.55:
            spans = batch(rng, ids, sent, chain.numbers, open_calls)
            while spans:  # a deep chain arrives over several requests
                size = rng.randint(1, 40)
                buffer.add_batch(spans[:size])
                spans = spans[size:]
        elif roll < 0.75:
            clock.now += rng.choice((0.1, 0.4, 1.1, 2.5))
            buffer.tick()
        elif roll < 0.8:
            buffer.shed(rng.choice((0.25, 0.5, 1.0)))
        elif roll < 0.85:
            keep = rng.randrange(3)
            taken = buffer.take_pending(lambda trace: trace.trace_id[0] % 3 == keep)
            if taken and rng.random() < 0.5:
                buffer.complete_now(taken, "shutdown")  # a hand-over that could not be written
        elif roll < 0.9:
            restored = rng.choice(ids)
            buffer.restore_decisions([(restored, Remembered(Decision(True, "restored"), (b"\x00" * 7 + b"\x05",)))])
        elif roll < 0.93:
            ids = trace_ids(rng) + ids[:3]  # new traces, and some old ones coming back
        else:
            clock.now += 0.05
        states.append((step, roll < 0.55) + state(buffer, chain))
    buffer.drain()
    states.append(state(buffer, chain))
    return states


@pytest.mark.parametrize("seed", range(400))
def test_the_core_buffer_does_what_the_python_buffer_does(seed: int) -> None:
    reference = run(seed, native=False)
    native = run(seed, native=True)
    for expected, got in zip(reference, native):
        assert got == expected
    assert len(native) == len(reference)


def test_the_service_takes_the_core_buffer_where_the_core_runs_and_the_reference_without_it() -> None:
    settings, chain = AssemblySettings(), Chain()
    assert type(make_assembler(settings, chain, extension)) is NativeTraceAssembler
    assert type(make_assembler(settings, chain, None)) is TraceAssembler


def test_a_trace_of_many_spans_is_looked_up_by_map_past_the_scan_limit() -> None:
    """Past 16 spans a trace indexes its spans: 3 000 engine spans under one gateway chain, the
    chain sent last, complete as one ready trace holding every span once (the readiness walks
    reach the root through the index, duplicates are found there)."""
    rng = random.Random(1)
    trace_id = b"\x07" * 16
    clock, chain = Clock(), Chain()
    buffer = NativeTraceAssembler(AssemblySettings(grace_s=0.0), chain, extension, clock=clock)
    engines = [BufferedSpan(trace_id, (100 + i).to_bytes(8, "big"), (8).to_bytes(8, "big"), SERVER, 0, 1, 2, "", b"",
                            ORIGIN, (), EngineObservation("vllm", "vllm_v1", ttft_s=0.1, e2e_s=1.0))
               for i in range(3000)]
    buffer.add_batch(engines)
    buffer.add_batch(engines[:500])  # resent: duplicates, found through the index
    assert buffer.tick() == 0 and buffer.spans_duplicate == 500  # no root yet
    gateways = [make_span(rng, trace_id, depth, (depth - 1).to_bytes(8, "big") if depth > 1 else b"", SERVER)
                for depth in range(8, 0, -1)]  # nearest first, the root last
    buffer.add_batch(gateways)
    assert buffer.tick() == 1
    (seen,) = chain.seen
    assert seen[0] == "ready" and len(seen[4]) == 3008 and seen[8] == 0  # every engine span rooted


def lookups_per_engine_span(engine_spans: int, gateways_first: bool) -> float:
    """Spans looked at per engine span, over its trace's life, for ``engine_spans`` engine spans of one
    trace, one request each, under an 8-span gateway chain sent before or after them."""
    trace_id = b"\x09" * 16
    buffer = NativeTraceAssembler(AssemblySettings(decision_wait_s=1e9, grace_s=0.0, max_spans_per_trace=1_000_000),
                                  Chain(), extension, clock=Clock())
    rng = random.Random(2)
    gateways = [make_span(rng, trace_id, depth, (depth - 1).to_bytes(8, "big") if depth > 1 else b"", SERVER)
                for depth in range(1, 9)]
    if gateways_first:
        buffer.add_batch(gateways)
    before = buffer._buffer.lookup_steps()
    for i in range(engine_spans):
        buffer.add_batch([BufferedSpan(trace_id, (100 + i).to_bytes(8, "big"), (8).to_bytes(8, "big"), SERVER, 0, 1,
                                       2, "", b"", ORIGIN, (), EngineObservation("vllm", "vllm_v1", ttft_s=0.1))])
    if not gateways_first:
        assert buffer.tick() == 0
        buffer.add_batch(list(reversed(gateways)))
    assert buffer.tick() == 1
    return (buffer._buffer.lookup_steps() - before) / engine_spans


@pytest.mark.parametrize("gateways_first", [True, False], ids=["gateway-first", "gateway-last"])
def test_a_spans_lookups_do_not_grow_with_its_trace(gateways_first: bool) -> None:
    """The Python buffer's test counts dict operations; the core's counts the spans it looks at. A
    scan of every span per lookup is ~100x more per span at 10 000 spans than at 100."""
    small = lookups_per_engine_span(100, gateways_first)
    large = lookups_per_engine_span(10_000, gateways_first)
    assert large <= small * 1.1 + 1
    assert large <= 3 * (8 + 2)


def boundary_run(native: bool, depth: int, order: str) -> list[tuple[Any, ...]]:
    """An engine span under ``depth`` ancestors, the chain sent leaf first, one span per request,
    in ``order``: nearest ancestor first, or the root first."""
    trace_id = b"\x0b" * 16
    clock, chain = Clock(), Chain()
    settings = AssemblySettings(decision_wait_s=5.0, grace_s=0.0)
    buffer = (NativeTraceAssembler(settings, chain, extension, clock=clock) if native
              else TraceAssembler(settings, chain, clock=clock))
    engine = BufferedSpan(trace_id, (1000).to_bytes(8, "big"), depth.to_bytes(8, "big"), SERVER, 0, 1, 2, "", b"",
                          ORIGIN, (), EngineObservation("vllm", "vllm_v1", ttft_s=0.1))
    ancestors = [BufferedSpan(trace_id, number.to_bytes(8, "big"),
                              (number - 1).to_bytes(8, "big") if number > 1 else b"", SERVER, 0, 1, 2, "", b"",
                              ORIGIN, (), None) for number in range(1, depth + 1)]
    buffer.add_batch([engine])
    for span in (reversed(ancestors) if order == "nearest-first" else ancestors):
        buffer.add_batch([span])
    buffer.tick()
    clock.now += 10.0
    buffer.tick()
    return [(reason, unrooted) for reason, *_, unrooted, _ in chain.seen]


@pytest.mark.parametrize("order", ["nearest-first", "root-first"])
def test_an_engine_span_at_the_walks_bound_is_rooted_or_not_as_in_the_python_buffer(order: str) -> None:
    """Readiness walks resumed as ancestors arrive count them as the Python buffer counts them: at
    ``MAX_ANCESTRY`` ancestors and below, the trace is ready; past it, it waits for ``decision_wait``."""
    outcomes = {}
    for depth in range(MAX_ANCESTRY - 2, MAX_ANCESTRY + 3):
        reference = boundary_run(False, depth, order)
        assert boundary_run(True, depth, order) == reference
        outcomes[depth] = reference
    assert {reason for (reason, _), in outcomes.values()} == {"ready", "decision_wait"}
