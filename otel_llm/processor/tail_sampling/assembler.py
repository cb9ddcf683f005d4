"""Grouping spans by trace until each request can be assembled with its gateway ancestors.

Engines and gateways export independently (vLLM's batch exporter can lag its gateway by
seconds), so a trace is held until every engine span's ancestor chain reaches a root span, plus
a short grace for stragglers, or until ``decision_wait`` at the latest. Memory is bounded by
``max_traces``: past it the oldest trace is completed early, never dropped unseen.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

from otel_llm.pdata.spans import FIRST_TOKEN_EVENT, MAX_ANCESTRY, BufferedSpan, Origin, PendingTrace
from otel_llm.pdata.traces import CompletedTrace, Remembered, TraceConsumer


class Counted(Protocol):
    def inc(self, amount: float = 1) -> None: ...

__all__ = ["FIRST_TOKEN_EVENT", "MAX_ANCESTRY", "AssemblySettings", "BufferedSpan", "NativeTraceAssembler", "Origin",
           "PendingTrace", "TraceAssembler", "make_assembler"]


CompletionReason = str
# Why a trace was completed: ``otel_llm_traces_completed_total{reason}``, each explained in docs/reasons.yaml.
COMPLETION_REASONS = ("ready", "decision_wait", "max_open_call_wait", "open_call_limit", "memory_limit",
                      "memory_pressure", "shutdown")


@dataclass(slots=True, frozen=True)
class AssemblySettings:
    decision_wait_s: float = 10.0
    grace_s: float = 1.0
    max_open_call_wait_s: float = 0.0  # a trace with a call in flight is held up to this long; 0: off
    # Traces one sender (the service.name of the CLIENT span in flight) may have held for a call in
    # flight; past it its longest-held one is completed ("open_call_limit"). 0: no bound of their own.
    max_open_calls_per_sender: int = 0
    max_traces: int = 50_000
    max_spans_per_trace: int = 10_000
    decided_cache_size: int = 100_000


# The compiled core's span class (``rust/src/lib.rs`` ``Row``), which holds its ids inline; None without the core.
try:
    from otel_llm import _core  # type: ignore[attr-defined]
    _COMPACT_SPAN: type | None = _core.BufferedSpan
except ImportError:
    _COMPACT_SPAN = None

_SPAN_KIND_CLIENT = 3  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_CLIENT
# Traces handed along the chain together: enough that a batch's locks and calls cost little per
# trace, few enough that a batch's kept traces reach the exporters without waiting on thousands.
COMPLETION_BATCH = 256


def _call_in_flight(trace: PendingTrace) -> BufferedSpan | None:
    """The first CLIENT span whose parent is not here: the caller's span (a GenAI client span over
    its HTTP span, an application span over its call) is still open, and ends, and is exported, later."""
    spans = trace.spans
    for span in spans.values():
        if span.kind == _SPAN_KIND_CLIENT and span.parent_span_id and span.parent_span_id not in spans:
            return span
    return None


class CompletionLane(Protocol):
    """What completes the traces it takes past the chain's stages (``service/lane.py``)."""

    def complete(self, due: list[tuple[Any, str]], chain: Callable[[list[tuple[Any, str]]], None]) -> None:
        """Complete ``due`` (trace, reason) in order: what it does not take goes to ``chain``, in runs."""


class TraceAssembler:
    """Thread-safe: receivers add spans from their threads; a ticker completes traces. A completed
    trace, and a late span of a decided one, goes to ``next`` (the first stage of the chain)."""

    def __init__(
        self,
        settings: AssemblySettings,
        next: TraceConsumer,  # noqa: A002 - the Collector's name for the next consumer
        clock: Callable[[], float] = time.monotonic,
        spans_dropped: Counted | None = None,  # spans past max_spans_per_trace
        spans_duplicate: Counted | None = None,  # a span id its trace already has (a redelivery)
    ) -> None:
        self._init_common(settings, next, clock, spans_dropped, spans_duplicate)
        self._pending: OrderedDict[bytes, PendingTrace] = OrderedDict()
        # The ready traces in due order (each is the monotonic clock read under the lock plus the one
        # grace), so a tick reads only the due ones and stops at the next: each one's id and the very
        # ``ready_at`` object it was given. One that left otherwise (``max_traces``, memory pressure, a
        # hand-over) stays until it reaches the front, where its id no longer leads to a pending trace
        # with that ``ready_at``, and is dropped. Two deques hold 17 B per ready trace, an OrderedDict
        # 86 and a dict 39; a dict's front, once due traces have left it, is found by stepping over
        # the holes they leave (8.2 µs at 50 000 traces, paid per new trace at ``max_traces``).
        self._ready_ids: deque[bytes] = deque()
        self._ready_at: deque[float] = deque()
        # The decision cache: trace id -> what the sampler decided, so late spans follow it; until it
        # is decided, the number of spans the trace was completed with plus late spans taken since
        # (``Remembered.taken`` after): max_spans_per_trace holds for late spans too (one kept trace
        # once grew past 27 000 spans that way). Its ids in the order they came, to forget the
        # oldest: a key is only ever removed there, so the two hold the same ids. One dict and a
        # deque cost 0.2–0.9 µs less per trace than an OrderedDict and a second dict (both touched
        # per trace at saturation, 100 000 random ids missing the CPU's caches).
        self._decided: dict[bytes, Remembered | int] = {}
        self._decided_order: deque[bytes] = deque()
        # trace id -> late spans that arrived while their trace was being completed (its decision not
        # yet made): handed on with that decision once the completion is done, never dropped for it.
        self._parked: dict[bytes, list[BufferedSpan]] = {}
        # The traces held past decision_wait for a call in flight, in the order they were first held:
        # trace id -> (first seen, sender), and each sender's (the service.name of its CLIENT span in
        # flight), so that one sender's calls whose caller never comes cannot crowd out the others'
        # traces (``max_open_calls_per_sender``), and a full buffer completes them first.
        self._held: OrderedDict[bytes, tuple[float, str]] = OrderedDict()
        self._held_by_sender: dict[str, OrderedDict[bytes, None]] = {}

    def _init_common(self, settings: AssemblySettings, next: TraceConsumer,  # noqa: A002
                     clock: Callable[[], float], spans_dropped: Counted | None,
                     spans_duplicate: Counted | None) -> None:
        self.settings = settings
        self._next = next
        self._clock = clock
        self._spans_dropped = spans_dropped
        self._spans_duplicate = spans_duplicate
        self._lock = threading.Lock()
        self.spans_dropped_over_trace_limit = 0
        self.spans_duplicate = 0
        self.completions: dict[str, int] = {}
        # Takes the traces the core reads whole past the chain's stages (``service/lane.py``); None: the chain.
        self.lane: CompletionLane | None = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def held_spans(self) -> int:
        """Spans of the pending traces (``bench.buffered``'s denominator)."""
        with self._lock:
            return sum(len(trace.spans) for trace in self._pending.values())

    def add_batch(self, spans: list[BufferedSpan]) -> None:
        completed: list[tuple[PendingTrace, str]] = []
        late: list[tuple[BufferedSpan, Remembered | None]] = []
        dropped = duplicate = 0
        limit = self.settings.max_spans_per_trace
        compact = _COMPACT_SPAN
        with self._lock:
            now = self._clock()
            touched: dict[bytes, PendingTrace] = {}
            for buffered in spans:
                trace_id = buffered.trace_id
                trace = self._pending.get(trace_id)
                if trace is None:
                    remembered = self._decided.get(trace_id)
                    if remembered is not None:
                        if isinstance(remembered, Remembered):
                            if buffered.is_engine and buffered.span_id in remembered.measured:
                                duplicate += 1  # redelivered (a retried export): measured once already
                            elif remembered.taken >= limit:
                                dropped += 1
                            else:
                                remembered.taken += 1
                                late.append((buffered, remembered))
                        elif remembered >= limit:  # its trace is being completed (spans taken so far)
                            dropped += 1
                        else:  # it waits for the decision and follows it
                            self._decided[trace_id] = remembered + 1
                            self._parked.setdefault(trace_id, []).append(buffered)
                        continue
                    trace = PendingTrace(trace_id, now)
                    self._pending[trace_id] = trace
                    if len(self._pending) > self.settings.max_traces:
                        freed, reason = self._make_room(now)
                        touched.pop(freed.trace_id, None)
                        completed.append((freed, reason))
                # The span goes in (inline: a method call per span cost a third of the loop), and
                # readiness is kept current in steps bounded by ``MAX_ANCESTRY`` per engine span over
                # its life, never by the number of spans the trace holds.
                trace_spans = trace.spans
                span_id = buffered.span_id
                previous = trace_spans.get(span_id)
                is_engine = buffered.is_engine
                if previous is not None and is_engine == previous.is_engine:
                    duplicate += 1  # the same span again (a retried export): it replaces its first copy
                elif len(trace_spans) >= limit:
                    dropped += 1
                    continue
                trace_spans[span_id] = buffered
                if type(buffered) is not compact:
                    # One bytes object per trace and per parent id, not one per span (the dataclass;
                    # the core's span holds its ids inline). A child buffered after its parent holds
                    # the parent's id object (41 B); one buffered before it keeps its own: pointing
                    # it at the parent's later would mean looking through the trace's spans.
                    buffered.trace_id = trace.trace_id
                    parent = trace_spans.get(buffered.parent_span_id)
                    if parent is not None:
                        buffered.parent_span_id = parent.span_id
                if is_engine:
                    trace.engine_seen_at = now
                    if previous is None or not previous.is_engine:
                        trace.has_engine_span = True
                        trace.unrooted += 1
                        self._walk(trace, buffered, buffered, 0)
                # A duplicate keeps the readiness its first copy gave (span ids are unique in a valid
                # trace; a conflicting copy can at worst hold its trace until ``decision_wait``).
                if previous is None and (trace.wait_key == span_id or trace.waiting):
                    waiters = trace.pop_waiters(span_id)
                    if waiters is not None:
                        for engine_span, found in waiters:
                            self._walk(trace, engine_span, buffered, found + 1)
                touched[trace_id] = trace
            for trace in touched.values():
                self._update_readiness(trace, now)
            self.spans_dropped_over_trace_limit += dropped
            self.spans_duplicate += duplicate
        self._hand_on_added(dropped, duplicate, late, completed)

    def _hand_on_added(self, dropped: int, duplicate: int, late: list[tuple[BufferedSpan, Remembered | None]],
                       completed: list[tuple[PendingTrace, str]]) -> None:
        """What ``add_batch`` counted and let go, handed on outside the lock: late spans of decided
        traces, and traces completed to make room."""
        if dropped and self._spans_dropped is not None:
            self._spans_dropped.inc(dropped)
        if duplicate and self._spans_duplicate is not None:
            self._spans_duplicate.inc(duplicate)
        if late:
            # Never None here: a span of a trace being completed waits in _parked for its decision.
            self._next.consume_batch([_late(buffered, remembered) for buffered, remembered in late])
        if completed:
            self._complete(completed)

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
            trace.ready_at = now + self.settings.grace_s
            self._ready_ids.append(trace.trace_id)
            self._ready_at.append(trace.ready_at)

    def _pop_due(self, now: float) -> PendingTrace | None:
        """The ready trace due first, its entry removed, if it is due at ``now``; entries of traces
        that left otherwise are dropped on the way (under the lock). The trace stays pending."""
        ids, times, pending = self._ready_ids, self._ready_at, self._pending
        while ids:
            trace = pending.get(ids[0])
            current = trace is not None and trace.ready_at is times[0]
            if current and times[0] > now:
                return None
            ids.popleft()
            times.popleft()
            if current:
                return trace
        return None

    def _make_room(self, now: float) -> tuple[PendingTrace, str]:
        """At ``max_traces``: a trace whose grace is over is complete, not cut short, so the longest-due
        one goes first ("ready", what the ticker, behind, would have done); when none is due, one is
        completed early ("memory_limit"): the one held longest for a call in flight, which has had
        its ``decision_wait``, before any still inside it; the oldest when none is held."""
        trace = self._pop_due(now)
        if trace is not None:
            return self._leave(trace.trace_id), "ready"
        if self._held:
            return self._leave(next(iter(self._held))), "memory_limit"
        return self._pop_oldest(), "memory_limit"

    def _leave(self, trace_id: bytes) -> PendingTrace:
        """Removes a pending trace (from the held ones too) and remembers it as completed, undecided."""
        trace = self._pending.pop(trace_id)
        self._unhold(trace_id)  # its readiness entry, if any, is dropped at the front
        self._remember(trace_id, len(trace.spans))
        return trace

    def _pop_oldest(self) -> PendingTrace:
        return self._leave(next(iter(self._pending)))

    def _hold(self, trace: PendingTrace, in_flight: BufferedSpan) -> str | None:
        """``trace`` held for its call in flight (if not already); its sender when that takes the
        sender past ``max_open_calls_per_sender``."""
        trace_id = trace.trace_id
        if trace_id in self._held:
            return None
        sender = in_flight.service_name
        self._held[trace_id] = (trace.first_seen, sender)
        of_sender = self._held_by_sender.get(sender)
        if of_sender is None:
            of_sender = self._held_by_sender[sender] = OrderedDict()
        of_sender[trace_id] = None
        bound = self.settings.max_open_calls_per_sender
        return sender if bound and len(of_sender) > bound else None

    def _unhold(self, trace_id: bytes) -> None:
        held = self._held.pop(trace_id, None)
        if held is not None:
            sender = held[1]
            of_sender = self._held_by_sender[sender]
            del of_sender[trace_id]
            if not of_sender:
                del self._held_by_sender[sender]

    def _past_sender_bound(self, senders: list[str]) -> list[PendingTrace]:
        """The longest-held traces of ``senders`` past ``max_open_calls_per_sender``, completed."""
        bound = self.settings.max_open_calls_per_sender
        completed = []
        for sender in senders:
            while len(of_sender := self._held_by_sender.get(sender, ())) > bound:
                completed.append(self._leave(next(iter(of_sender))))
        return completed

    def _remember(self, trace_id: bytes, spans: int) -> None:
        """``trace_id`` completed with ``spans`` spans, not decided yet (under the lock)."""
        decided = self._decided
        known = len(decided)
        decided[trace_id] = spans
        if len(decided) != known:  # a new id (one known already keeps its place, as before)
            self._decided_order.append(trace_id)
            if known >= self.settings.decided_cache_size:
                self._forget_beyond_cache()

    def _forget_beyond_cache(self) -> None:
        """The oldest decisions past ``decided_cache_size`` forgotten (under the lock)."""
        decided, order = self._decided, self._decided_order
        while len(decided) > self.settings.decided_cache_size:
            del decided[order.popleft()]

    def _remembered(self, trace_id: bytes) -> Remembered | None:
        """``trace_id``'s decision, if it was decided and is still remembered."""
        remembered = self._decided.get(trace_id)
        return remembered if isinstance(remembered, Remembered) else None

    def decisions(self) -> list[tuple[bytes, Remembered]]:
        """The decision cache (oldest first), for ``Service`` to keep across a graceful restart."""
        with self._lock:
            return [(trace_id, remembered) for trace_id, remembered in self._decided.items()
                    if isinstance(remembered, Remembered)]

    def restore_decisions(self, decisions: list[tuple[bytes, Remembered]]) -> None:
        """Decisions of the previous run (before any span arrives): a span it had taken, redelivered
        by a sender that never got the answer, is then a duplicate, not a new request."""
        with self._lock:
            for trace_id, remembered in decisions:
                known = self._decided.get(trace_id)
                if known is None:
                    remembered.taken = len(remembered.measured)
                    self._decided_order.append(trace_id)
                else:
                    remembered.taken = known.taken if isinstance(known, Remembered) else known
                self._decided[trace_id] = remembered
                self._forget_beyond_cache()

    def remember_decisions(self, decisions: list[tuple[bytes, Remembered]]) -> None:
        """The chain's decisions of traces completed here; one the cache forgot meanwhile stays forgotten."""
        with self._lock:
            decided = self._decided
            for trace_id, remembered in decisions:
                known = decided.get(trace_id)
                if known is not None:
                    remembered.taken = known.taken if isinstance(known, Remembered) else known
                    decided[trace_id] = remembered

    def tick(self) -> int:
        """Complete every trace whose time has come; returns how many."""
        due: list[tuple[PendingTrace, str]] = []
        with self._lock:
            now = self._clock()
            if self._ready_ids:
                pending, held = self._pending, self._held
                decided, order = self._decided, self._decided_order
                while (trace := self._pop_due(now)) is not None:
                    trace_id = trace.trace_id
                    del pending[trace_id]
                    if held:
                        self._unhold(trace_id)
                    known = len(decided)  # ``_remember``, inlined: the cache is trimmed once below
                    decided[trace_id] = len(trace.spans)
                    if len(decided) != known:
                        order.append(trace_id)
                    due.append((trace, "ready"))
                self._forget_beyond_cache()
            deadline = now - self.settings.decision_wait_s
            open_deadline = now - self.settings.max_open_call_wait_s
            holding = self.settings.max_open_call_wait_s > 0
            examined_held = 0
            over_bound: list[str] = []  # senders taken past max_open_calls_per_sender
            while self._pending:
                trace = next(iter(self._pending.values()))
                if trace.first_seen > deadline:
                    break
                # Held while nothing was measured yet (the engine's request is in flight too), or
                # for decision_wait after its engine span came (its caller's span follows it).
                in_flight = _call_in_flight(trace) if holding and (
                    not trace.engine_seen_at or trace.engine_seen_at > deadline) else None
                if in_flight is not None and trace.first_seen > open_deadline:
                    # Its caller's span has not arrived: held, looked at again once the traces
                    # seen after it are due (so at most decision_wait past the limit).
                    sender = self._hold(trace, in_flight)
                    if sender is not None:
                        over_bound.append(sender)
                    self._pending.move_to_end(trace.trace_id)
                    examined_held += 1
                    if examined_held >= len(self._pending):
                        break
                    continue
                due.append((self._pop_oldest(), "max_open_call_wait" if in_flight is not None else "decision_wait"))
            due += [(trace, "open_call_limit") for trace in self._past_sender_bound(over_bound)]
        if due:
            self._complete(due)
        return len(due)

    def completion_lag(self) -> float:
        """Seconds the longest-due ready trace has waited past its time: the ticker's lag behind intake."""
        try:
            # Read without the lock: the front may be a trace that left otherwise, whose lag then
            # leads the worker to a tick, which drops it.
            first = self._ready_at[0]
        except IndexError:  # none ready, or emptied meanwhile
            return 0.0
        return max(0.0, self._clock() - first)

    def held_since(self) -> float | None:
        """When the oldest trace held past ``decision_wait`` for a call in flight was first seen
        (the intake log keeps every request from then on); None when none is held."""
        with self._lock:
            return min(first_seen for first_seen, _ in self._held.values()) if self._held else None

    @property
    def held_traces(self) -> int:
        return len(self._held)

    def overdue(self, seen_before: float, trace_ids: Collection[bytes]) -> list[PendingTrace]:
        """Copies of the pending traces first seen at or before ``seen_before`` (still pending past
        ``decision_wait``: held for a call in flight) and of those among ``trace_ids``, left in place:
        what the intake log carries past its checkpoint."""
        with self._lock:
            return [PendingTrace(trace.trace_id, trace.first_seen, dict(trace.spans))
                    for trace in self._pending.values()
                    if trace.first_seen <= seen_before or trace.trace_id in trace_ids]

    def shed(self, fraction: float = 0.5) -> int:
        """Complete the oldest ``fraction`` of pending traces now (memory pressure)."""
        with self._lock:
            due = [self._pop_oldest() for _ in range(int(len(self._pending) * fraction))]
        self._complete([(trace, "memory_pressure") for trace in due])
        return len(due)

    def take_pending(self, wanted: Callable[[PendingTrace], bool]) -> list[PendingTrace]:
        """Remove the pending traces ``wanted`` picks, undecided (a graceful stop hands them to the next
        start): not remembered as decided, so nothing of them is late here or there."""
        with self._lock:
            taken = [trace for trace in self._pending.values() if wanted(trace)]
            for trace in taken:
                del self._pending[trace.trace_id]
                self._unhold(trace.trace_id)
        return taken

    def complete_now(self, traces: list[PendingTrace], reason: CompletionReason = "shutdown") -> None:
        """Decide traces taken with ``take_pending`` after all (their handover could not be written)."""
        with self._lock:
            for trace in traces:
                self._remember(trace.trace_id, len(trace.spans))
        self._complete([(trace, reason) for trace in traces])

    def drain(self) -> int:
        """Complete every pending trace now (shutdown)."""
        with self._lock:
            due = [self._pop_oldest() for _ in range(len(self._pending))]
        self._complete([(trace, "shutdown") for trace in due])
        return len(due)

    def _complete(self, due: list[tuple[PendingTrace, str]]) -> None:
        """Hand ``due`` (trace, why it completed) along the chain in batches of ``COMPLETION_BATCH``,
        through the lane where there is one (it hands the chain the traces it does not take)."""
        lane = self.lane
        for start in range(0, len(due), COMPLETION_BATCH):
            chunk = due[start:start + COMPLETION_BATCH]
            try:
                if lane is None:
                    self._complete_in_chain(chunk)
                else:
                    lane.complete(chunk, self._complete_in_chain)
            finally:
                # Nearly always empty: looked at without the lock (the core's buffer under it). A span is
                # parked only while its trace's decision is None, under the lock, so one parked for this
                # batch went in before the chain's remember_decisions (which takes the lock) and is seen here.
                if self._has_parked():
                    self._hand_on_parked([trace.trace_id for trace, _ in chunk])

    def _complete_in_chain(self, due: list[tuple[PendingTrace, str]]) -> None:
        completions = self.completions
        batch = [CompletedTrace(trace, reason) for trace, reason in due]
        for completed in batch:
            completions[completed.reason] = completions.get(completed.reason, 0) + 1
        self._next.consume_batch(batch)

    def count_completed(self, reason: str, traces: int) -> None:
        """``traces`` completed for ``reason`` past the chain (the lane's)."""
        self.completions[reason] = self.completions.get(reason, 0) + traces

    def _has_parked(self) -> bool:
        return bool(self._parked)

    def _hand_on_parked(self, trace_ids: list[bytes]) -> None:
        late: list[CompletedTrace] = []
        with self._lock:
            for trace_id in trace_ids:
                parked = self._parked.pop(trace_id, None)
                if parked:
                    late.extend(_late(buffered, self._remembered(trace_id)) for buffered in parked)
        if late:
            self._next.consume_batch(late)


class NativeTraceAssembler(TraceAssembler):
    """The same buffer with its state in the compiled core (``rust/src/buffer.rs`` ``TraceBuffer``):
    pending traces, readiness, the ready queue, the decision cache and the parked late spans, without
    a Python object or dict per trace until it leaves. ``TraceAssembler`` stays the reference; every
    call into the core is made under ``_lock`` (a call may let another thread take the GIL)."""

    def __init__(
        self,
        settings: AssemblySettings,
        next: TraceConsumer,  # noqa: A002 - the Collector's name for the next consumer
        extension: Any,
        clock: Callable[[], float] = time.monotonic,
        spans_dropped: Counted | None = None,
        spans_duplicate: Counted | None = None,
    ) -> None:
        self._init_common(settings, next, clock, spans_dropped, spans_duplicate)
        self._buffer = extension.TraceBuffer(
            settings.grace_s, settings.decision_wait_s, settings.max_open_call_wait_s,
            settings.max_open_calls_per_sender, settings.max_traces, settings.max_spans_per_trace,
            settings.decided_cache_size)

    def _locked(self, method: Callable[..., Any], *args: Any) -> Any:
        """``method(*args)`` under the lock: no two calls into the core's buffer overlap."""
        with self._lock:
            return method(*args)

    def __len__(self) -> int:
        return int(self._locked(len, self._buffer))

    def held_spans(self) -> int:
        return int(self._locked(self._buffer.held_spans))

    def add_batch(self, spans: list[BufferedSpan]) -> None:
        with self._lock:
            completed, late, dropped, duplicate = self._buffer.add_batch(spans, self._clock())
            self.spans_dropped_over_trace_limit += dropped
            self.spans_duplicate += duplicate
        self._hand_on_added(dropped, duplicate, late, completed)

    def tick(self) -> int:
        with self._lock:
            due = self._buffer.tick(self._clock())
        if due:
            self._complete(due)
        return len(due)

    def completion_lag(self) -> float:
        with self._lock:
            first = self._buffer.first_ready_at()
        return 0.0 if first is None else max(0.0, self._clock() - first)

    def held_since(self) -> float | None:
        since: float | None = self._locked(self._buffer.held_since)
        return since

    @property
    def held_traces(self) -> int:
        return int(self._locked(self._buffer.held_traces))

    def overdue(self, seen_before: float, trace_ids: Collection[bytes]) -> list[PendingTrace]:
        overdue: list[PendingTrace] = self._locked(self._buffer.overdue_traces, seen_before, list(trace_ids))
        return overdue

    def shed(self, fraction: float = 0.5) -> int:
        with self._lock:
            due = self._buffer.pop_oldest_traces(int(len(self._buffer) * fraction))
        self._complete([(trace, "memory_pressure") for trace in due])
        return len(due)

    def take_pending(self, wanted: Callable[[PendingTrace], bool]) -> list[PendingTrace]:
        with self._lock:
            taken = [trace for trace in self._buffer.pending_traces() if wanted(trace)]
            self._buffer.remove_pending([trace.trace_id for trace in taken])
        return taken

    def complete_now(self, traces: list[PendingTrace], reason: CompletionReason = "shutdown") -> None:
        with self._lock:
            for trace in traces:
                self._buffer.remember_completed(trace.trace_id, len(trace.spans))
        self._complete([(trace, reason) for trace in traces])

    def drain(self) -> int:
        with self._lock:
            due = self._buffer.pop_oldest_traces(len(self._buffer))
        self._complete([(trace, "shutdown") for trace in due])
        return len(due)

    def decisions(self) -> list[tuple[bytes, Remembered]]:
        decisions: list[tuple[bytes, Remembered]] = self._locked(self._buffer.decisions)
        return decisions

    def restore_decisions(self, decisions: list[tuple[bytes, Remembered]]) -> None:
        self._locked(self._buffer.restore_decisions, decisions)

    def remember_decisions(self, decisions: list[tuple[bytes, Remembered]]) -> None:
        self._locked(self._buffer.remember_decisions, decisions)

    def remember_lane(self, lane: Any, run: Any) -> None:
        """The decisions of a run the core's completion lane decided (``service/lane.py``), remembered
        by the core (``Lane.remember``) without a ``Remembered`` object per trace."""
        self._locked(lane.remember, run, self._buffer)

    def _has_parked(self) -> bool:
        return bool(self._locked(self._buffer.has_parked))

    def _hand_on_parked(self, trace_ids: list[bytes]) -> None:
        parked = self._locked(self._buffer.take_parked, trace_ids)
        if parked:
            self._next.consume_batch([_late(buffered, remembered) for buffered, remembered in parked])


def make_assembler(settings: AssemblySettings, next: TraceConsumer,  # noqa: A002
                   extension: Any | None, spans_dropped: Counted | None = None,
                   spans_duplicate: Counted | None = None) -> TraceAssembler:
    """The core's buffer where the compiled core runs (``extension``), else the Python reference."""
    if extension is not None and hasattr(extension, "TraceBuffer"):
        return NativeTraceAssembler(settings, next, extension, spans_dropped=spans_dropped,
                                    spans_duplicate=spans_duplicate)
    return TraceAssembler(settings, next, spans_dropped=spans_dropped, spans_duplicate=spans_duplicate)


def _late(buffered: BufferedSpan, remembered: Remembered | None) -> CompletedTrace:
    """A span of a trace completed before it came, on its own, with the trace's decision if remembered."""
    single = PendingTrace(buffered.trace_id, 0.0, {buffered.span_id: buffered})
    return CompletedTrace(single, "late", prior=remembered, late=True)
