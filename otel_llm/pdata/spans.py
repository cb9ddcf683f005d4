"""The spans of one trace while it is buffered: what crosses from the receivers' adapter stage to
the tail sampler's buffer and on to the request records (``processors.llm_metrics``)."""

from __future__ import annotations

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
    would pin each whole export request in memory and give the garbage collector ~3x the objects.

    Held by the hundred thousand (``python -m bench --rss-only``): once buffered, ``trace_id`` and
    ``parent_span_id`` are the objects of its trace and of its parent (``TraceAssembler``), equal
    ``attrs`` are one tuple (``digest.shared_attrs``), an SGLang stage's observation one object.
    On the native path the compiled core makes ``otel_llm._core.BufferedSpan`` instead (``rust/src/lib.rs``
    ``Row``): the same attributes and methods, its ids, times and bytes held inline; this class stays
    the reference, and what the Python path makes."""

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
    engine_seen_at: float = 0.0  # when its latest engine span arrived (assembler clock); 0: none yet

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

