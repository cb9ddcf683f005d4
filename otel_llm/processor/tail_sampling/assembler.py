"""Grouping spans by trace until each request can be assembled with its gateway ancestors.

Engines and gateways export independently (vLLM's batch exporter can lag its gateway by
seconds), so a trace is held until every engine span's ancestor chain reaches a root span, plus
a short grace for stragglers, or until ``decision_wait`` at the latest. Memory is bounded by
``max_traces``: past it the oldest trace is completed early, never dropped unseen.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_llm.pdata.observation import EngineObservation


@dataclass(slots=True, frozen=True)
class Origin:
    """Where a span came from: one standalone copy per resource and scope of a request."""

    resource: Resource
    scope: InstrumentationScope
    service_name: str
    # The resource's string attributes, read once per request rather than once per request record
    # (model mapping and dimensions fall back to them).
    resource_strings: dict[str, str]


# The time of a configured first-token event on a SERVER span, kept among its attributes.
FIRST_TOKEN_EVENT = "\x00first_token_event_unix_ns"


@dataclass(slots=True)
class BufferedSpan:
    """What a trace holds of one span until its decision: the few fields assembly reads, and the
    span itself as bytes, parsed again only if the trace is kept. Holding protobuf messages instead
    would pin each whole export request in memory and give the garbage collector ~3x the objects."""

    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    kind: int
    status_code: int
    start_unix_ns: int
    end_unix_ns: int
    trace_state: str
    payload: bytes  # the span as received (attributes possibly truncated to the configured limits)
    origin: Origin  # shared by every span of one resource and scope in a request
    attrs: tuple[Any, ...]  # (key, value, key, value, ...) of only the keys assembly reads; () otherwise
    observation: EngineObservation | None = None  # validated by its adapter and derive_timings

    @property
    def resource(self) -> Resource:
        return self.origin.resource

    @property
    def scope(self) -> InstrumentationScope:
        return self.origin.scope

    @property
    def service_name(self) -> str:
        return self.origin.service_name

    @property
    def is_engine(self) -> bool:
        """An engine's own request span (not a GenAI span that may turn out to be a gateway)."""
        observation = self.observation
        return observation is not None and not observation.may_be_gateway and not observation.part

    def attr(self, key: str) -> Any:
        attrs = self.attrs
        for index in range(0, len(attrs), 2):  # a handful of entries: a flat tuple beats a dict's 200+ bytes
            if attrs[index] == key:
                return attrs[index + 1]
        return None


# How many ancestors a readiness check or an assembly walks at most: a cycle in hostile input must
# not hang the pipeline, and a deeper chain is not a gateway path.
MAX_ANCESTRY = 64


@dataclass(slots=True)
class PendingTrace:
    trace_id: bytes
    first_seen: float
    spans: dict[bytes, BufferedSpan] = field(default_factory=dict)
    has_engine_span: bool = False
    ready_at: float | None = None
    # Readiness, kept incrementally so a span's cost does not depend on the trace's size: engine
    # spans whose ancestor chain stops at a span not (yet) here, by that missing span's id, with
    # how many ancestors were found below it; and how many engine spans are not rooted (waiting
    # or too deep/cyclic to ever be). Most pending traces wait for one parent: that waiter takes
    # three slots, and a dict is made only for a second one (a dict, a list and a tuple would
    # cost ~310 B per trace held).
    wait_key: bytes | None = None
    wait_span: BufferedSpan | None = None
    wait_found: int = 0
    waiting: dict[bytes, list[tuple[BufferedSpan, int]]] | None = None
    unrooted: int = 0

    def add_waiter(self, missing: bytes, engine_span: BufferedSpan, found: int) -> None:
        if self.waiting is None:
            if self.wait_key is None:
                self.wait_key, self.wait_span, self.wait_found = missing, engine_span, found
                return
            assert self.wait_span is not None
            self.waiting = {self.wait_key: [(self.wait_span, self.wait_found)]}
            self.wait_key = self.wait_span = None
        self.waiting.setdefault(missing, []).append((engine_span, found))

    def pop_waiters(self, arrived: bytes) -> list[tuple[BufferedSpan, int]] | None:
        if self.wait_key is not None:
            if self.wait_key != arrived:
                return None
            assert self.wait_span is not None
            waiter = [(self.wait_span, self.wait_found)]
            self.wait_key = self.wait_span = None
            return waiter
        return self.waiting.pop(arrived, None) if self.waiting else None

    def ancestors(self, span: BufferedSpan) -> list[BufferedSpan]:
        """Buffered ancestors of ``span``, nearest first; stops at the first one not (yet) here."""
        chain: list[BufferedSpan] = []
        parent = span.parent_span_id
        seen = 0
        while parent and seen < MAX_ANCESTRY:  # a cycle in hostile input must not hang the pipeline
            buffered = self.spans.get(parent)
            if buffered is None:
                break
            chain.append(buffered)
            parent = buffered.parent_span_id
            seen += 1
        return chain

    def is_rooted(self, span: BufferedSpan) -> bool:
        chain = self.ancestors(span)
        top = chain[-1] if chain else span
        return not top.parent_span_id


# Why a trace was completed: "ready", "decision_wait", "memory_limit", "memory_pressure", "shutdown".
CompletionReason = str


@dataclass(slots=True, frozen=True)
class AssemblySettings:
    decision_wait_s: float = 10.0
    grace_s: float = 1.0
    max_traces: int = 50_000
    max_spans_per_trace: int = 10_000
    decided_cache_size: int = 100_000


class TraceAssembler:
    """Thread-safe: receivers add spans from their threads; a ticker completes traces."""

    def __init__(
        self,
        settings: AssemblySettings,
        on_complete: Callable[[PendingTrace, CompletionReason], None],
        on_late_span: Callable[[BufferedSpan, object], None],
        clock: Callable[[], float] = time.monotonic,
        on_spans_dropped: Callable[[str, int], None] | None = None,
    ) -> None:
        self._settings = settings
        self._on_complete = on_complete
        self._on_late_span = on_late_span
        self._clock = clock
        self._on_spans_dropped = on_spans_dropped  # (reason, count), called outside the lock
        self._pending: OrderedDict[bytes, PendingTrace] = OrderedDict()
        self._ready: dict[bytes, float] = {}
        # trace id -> the sampler's decision (None until decided), so late spans follow it
        self._decided: OrderedDict[bytes, object] = OrderedDict()
        self._lock = threading.Lock()
        self.spans_dropped_over_trace_limit = 0
        self.completions: dict[str, int] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def add_batch(self, spans: list[BufferedSpan]) -> None:
        completed: list[tuple[PendingTrace, str]] = []
        late: list[tuple[BufferedSpan, object]] = []
        dropped = 0
        with self._lock:
            now = self._clock()
            touched: dict[bytes, PendingTrace] = {}
            for buffered in spans:
                trace_id = buffered.trace_id
                trace = self._pending.get(trace_id)
                if trace is None:
                    if trace_id in self._decided:
                        late.append((buffered, self._decided[trace_id]))
                        continue
                    trace = PendingTrace(trace_id, now)
                    self._pending[trace_id] = trace
                    if len(self._pending) > self._settings.max_traces:
                        oldest = self._pop_oldest()
                        touched.pop(oldest.trace_id, None)
                        completed.append((oldest, "memory_limit"))
                if len(trace.spans) >= self._settings.max_spans_per_trace:
                    dropped += 1
                    continue
                buffered.trace_id = trace.trace_id  # one bytes object per trace, not one per span
                self._insert(trace, buffered)
                touched[trace_id] = trace
            for trace in touched.values():
                self._update_readiness(trace, now)
            self.spans_dropped_over_trace_limit += dropped
        if dropped and self._on_spans_dropped is not None:
            self._on_spans_dropped("max_spans_per_trace", dropped)
        for buffered, decision in late:
            self._on_late_span(buffered, decision)
        for trace, reason in completed:
            self._complete(trace, reason)

    def _insert(self, trace: PendingTrace, buffered: BufferedSpan) -> None:
        """Add one span and keep readiness current, in steps bounded by ``MAX_ANCESTRY`` per
        engine span over its life, never by the number of spans the trace holds."""
        spans = trace.spans
        span_id = buffered.span_id
        previous = spans.get(span_id)
        spans[span_id] = buffered
        if buffered.is_engine and (previous is None or not previous.is_engine):
            trace.has_engine_span = True
            trace.unrooted += 1
            self._walk(trace, buffered, buffered, 0)
        # A duplicate keeps the readiness its first copy gave (span ids are unique in a valid
        # trace; a conflicting copy can at worst hold its trace until ``decision_wait``).
        if previous is None:
            waiters = trace.pop_waiters(span_id)
            if waiters is not None:
                for engine_span, found in waiters:
                    self._walk(trace, engine_span, buffered, found + 1)

    def _walk(self, trace: PendingTrace, engine_span: BufferedSpan, top: BufferedSpan, found: int) -> None:
        """Continue ``engine_span``'s ancestor walk from ``top``, its ``found``-th buffered ancestor
        (0: itself), as ``PendingTrace.is_rooted`` walks: rooted, waiting for the first missing
        ancestor, or never rooted (a chain deeper than ``MAX_ANCESTRY``, or a cycle)."""
        spans = trace.spans
        parent = top.parent_span_id
        while parent and found < MAX_ANCESTRY:
            ancestor = spans.get(parent)
            if ancestor is None:
                trace.add_waiter(parent, engine_span, found)
                return
            parent = ancestor.parent_span_id
            found += 1
        if not parent:
            trace.unrooted -= 1

    def _update_readiness(self, trace: PendingTrace, now: float) -> None:
        if not trace.has_engine_span or trace.unrooted:
            return
        if trace.ready_at is None:
            trace.ready_at = now + self._settings.grace_s
            self._ready[trace.trace_id] = trace.ready_at

    def _pop_oldest(self) -> PendingTrace:
        trace_id, trace = self._pending.popitem(last=False)
        self._ready.pop(trace_id, None)
        self._remember(trace_id)
        return trace

    def _remember(self, trace_id: bytes) -> None:
        self._decided[trace_id] = None
        if len(self._decided) > self._settings.decided_cache_size:
            self._decided.popitem(last=False)

    def remember_decision(self, trace_id: bytes, decision: object) -> None:
        with self._lock:
            if trace_id in self._decided:
                self._decided[trace_id] = decision

    def tick(self) -> int:
        """Complete every trace whose time has come; returns how many."""
        due: list[tuple[PendingTrace, str]] = []
        with self._lock:
            now = self._clock()
            for trace_id, ready_at in list(self._ready.items()):
                if ready_at <= now:
                    trace = self._pending.pop(trace_id)
                    del self._ready[trace_id]
                    self._remember(trace_id)
                    due.append((trace, "ready"))
            deadline = now - self._settings.decision_wait_s
            while self._pending:
                trace = next(iter(self._pending.values()))
                if trace.first_seen > deadline:
                    break
                due.append((self._pop_oldest(), "decision_wait"))
        for trace, reason in due:
            self._complete(trace, reason)
        return len(due)

    def shed(self, fraction: float = 0.5) -> int:
        """Complete the oldest ``fraction`` of pending traces now (memory pressure)."""
        with self._lock:
            due = [self._pop_oldest() for _ in range(int(len(self._pending) * fraction))]
        for trace in due:
            self._complete(trace, "memory_pressure")
        return len(due)

    def drain(self) -> int:
        """Complete every pending trace now (shutdown)."""
        with self._lock:
            due = [self._pop_oldest() for _ in range(len(self._pending))]
        for trace in due:
            self._complete(trace, "shutdown")
        return len(due)

    def _complete(self, trace: PendingTrace, reason: str) -> None:
        self.completions[reason] = self.completions.get(reason, 0) + 1
        self._on_complete(trace, reason)
