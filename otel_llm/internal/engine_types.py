"""The types of the native engine's binding, ``otel_llm._core.Engine`` (``rust/src/engine.rs``).

``otel_llm._core`` stays untyped (``internal/core.py`` imports it as a plain module): a ``_core.pyi``
would have to describe every name of the older compiled core too. Code holding an engine types it
as ``NativeEngine`` (``cast(NativeEngine, _core.Engine(config_json))``); the tuples are spelled out
here in the order the binding builds them.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

# (adapter, spans matched)
Matched = tuple[str, int]
# (reason, service name, spans refused)
MalformedCount = tuple[str, str, int]

# `Engine.ingest`'s counts for a request read natively: (matched, malformed, passed_through,
# invalid_ids, buffered, duplicate, dropped_over_trace_limit, late, parked, completed_to_make_room).
IngestCounts = tuple[list[Matched], list[MalformedCount], int, int, int, int, int, int, int, int]

# `pdata.span_rows.SpanRow` (the same tuple type, spelled here as `internal` imports no `pdata`):
# (trace_id hex, span_id hex, parent_span_id hex, name, kind, service_name, start_unix_ns,
# end_unix_ns, status_code, status_message, attributes_json), a row of the store's `spans` table.
SpanRowTuple = tuple[str, str, str, str, int, str, int, int, int, str, str]
# (keep, rate_limited, policy, threshold)
DecisionTuple = tuple[bool, bool, str, str]
# (trace_id, ExportTraceServiceRequest bytes, store rows, decision)
KeptTrace = tuple[bytes, bytes, list[SpanRowTuple], DecisionTuple]

# Spans handed between Python and the engine (`service/handoff.py`, `rust/engine/src/handoff.rs`):
# (origins [(resource bytes, scope bytes, service name)], spans [(trace_id, span_id, parent_span_id,
# kind, status_code, start_unix_ns, end_unix_ns, trace_state, payload, origin index, attrs_kept,
# observation (adapter, [(field, value)]) or None)]).
SpansTuple = tuple[list[tuple[bytes, bytes, str]], list[tuple[Any, ...]]]

# `Engine.tick`'s output: (kept, completed [(reason, n)], late, records_built, records_measured,
# kept_decisions, dropped_decisions, rate_limited, declined [(trace_id, reason, spans)], kept_declined,
# redacted [(reason, n)], malformed [(reason, service)], decide_failed, spans_failed,
# assembled [((engine_kind, outcome), n)], values_rejected [(reason, n)], unmeasured [((service, what), n)]).
TickOutput = tuple[
    list[KeptTrace], list[tuple[str, int]], int, int, int, int, int, int,
    list[tuple[bytes, str, SpansTuple]], int, list[tuple[str, int]], list[tuple[str, str]], int, int,
    list[tuple[tuple[str, str], int]], list[tuple[str, int]], list[tuple[tuple[str, str], int]],
]

# Positions in `TickOutput` (Final: `out[TICK_KEPT]` is typed as that item).
TICK_KEPT: Final = 0
TICK_COMPLETED: Final = 1
TICK_LATE: Final = 2
TICK_RECORDS_BUILT: Final = 3
TICK_RECORDS_MEASURED: Final = 4
TICK_KEPT_DECISIONS: Final = 5
TICK_DROPPED_DECISIONS: Final = 6
TICK_RATE_LIMITED: Final = 7
TICK_DECLINED: Final = 8
TICK_KEPT_DECLINED: Final = 9
TICK_REDACTED: Final = 10
TICK_MALFORMED: Final = 11
TICK_DECIDE_FAILED: Final = 12
TICK_SPANS_FAILED: Final = 13
TICK_ASSEMBLED: Final = 14
TICK_VALUES_REJECTED: Final = 15
TICK_UNMEASURED: Final = 16

class NativeEngine(Protocol):
    """``otel_llm._core.Engine(config_json)``: a ValueError names the setting refused."""

    def ingest(self, data: bytes | bytearray | memoryview, validated: bool, now: float) -> IngestCounts | None:
        """None: Python must read the request. ValueError: bytes that are no request."""

    def supply(self, origins: list[tuple[bytes, bytes, str]], spans: list[tuple[Any, ...]],
               now: float) -> IngestCounts:
        """What Python read of a request (``service/handoff.py`` ``supplied``), buffered. ValueError
        naming the span and field the engine cannot take (nothing buffered then)."""

    def tick(self, now: float) -> TickOutput: ...

    def render(self, openmetrics: bool = False) -> str: ...

    def counters(self) -> dict[str, int]: ...

    def __len__(self) -> int: ...

    def len(self) -> int: ...

    def held_spans(self) -> int: ...

    def heap_bytes(self) -> int: ...

    def shards(self) -> int: ...

    def shed(self, fraction: float) -> int: ...

    def drain(self) -> int: ...
