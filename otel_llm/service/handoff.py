"""What Python hands the native engine of a request it read itself (``rust/engine/src/handoff.rs``):
a request the engine leaves to Python (``Engine.ingest`` returned None: a value the shape table's
native reading leaves to Python, vLLM's token events, a repeated key, a span over the attribute
limits) is read by the reference digest (``digest.digest_in_process``), and its ``BufferedSpan``s
go to ``Engine.supply`` as plain tuples: each span's fields in ``BufferedSpan``'s order, its origin
as an index into the request's origins, and its observation by field NAME (the shape table's
``FIELDS``; the engine converts each through its schema by name and refuses an unknown one).
"""

from __future__ import annotations

from typing import Any

from otel_llm.pdata.observation import EngineObservation
from otel_llm.pdata.spans import FIRST_TOKEN_EVENT, BufferedSpan
from otel_llm.processor.llm_metrics.adapters.shapes import FIELDS, FLOAT, FLOATS, INT, TEXTS

# ``EngineObservation.spec_decode``'s three ints, as the table's fields name them.
SPEC_FIELDS = ("spec_accepted_tokens", "spec_draft_tokens", "spec_steps")
# An observation's marks the table declares as fields (SGLang's dispatch-to-first-output time).
MARK_FIELDS = frozenset({"dispatch_to_first_token_s"})

OriginTuple = tuple[bytes, bytes, str]
ObservationTuple = tuple[str, list[tuple[str, Any]]]
SpanTuple = tuple[bytes, bytes, bytes, int, int, int, int, str, bytes, int, bool, ObservationTuple | None]


def observation_fields(observation: EngineObservation | None) -> ObservationTuple | None:
    """(adapter, [(field, value)]) of the fields present; an empty list or tuple is absent, as the
    engine's reading leaves it."""
    if observation is None:
        return None
    marks = dict(zip(observation.marks[::2], observation.marks[1::2]))
    carried = observation.carried()
    fields: list[tuple[str, Any]] = []
    for field in FIELDS:
        value: Any
        if field.name in SPEC_FIELDS:
            spec = observation.spec_decode
            value = None if spec is None else spec[SPEC_FIELDS.index(field.name)]
        elif field.name in MARK_FIELDS:
            value = marks.get(field.name)
        elif field.name in carried:
            value = carried[field.name]
        else:
            value = getattr(observation, field.name, None)
        if value is None or (field.kind in (FLOATS, TEXTS) and not value):
            continue
        if field.kind == FLOAT:
            value = float(value)
        elif field.kind == INT:
            value = int(value)
        elif field.kind in (FLOATS, TEXTS):
            value = list(value)
        fields.append((field.name, value))
    return observation.adapter, fields


def supplied(spans: list[BufferedSpan]) -> tuple[list[OriginTuple], list[SpanTuple]]:
    """``spans`` (one request's, as the reference digest made them) as ``Engine.supply`` takes them."""
    origins: list[OriginTuple] = []
    index: dict[int, int] = {}
    rows: list[SpanTuple] = []
    for span in spans:
        origin = span.origin
        if id(origin) not in index:
            index[id(origin)] = len(origins)
            origins.append((origin.resource.SerializeToString(), origin.scope.SerializeToString(),
                            origin.service_name))
        # Assembly reads the span's attributes where Python kept any (the first-token event's time is
        # read off the payload's events by the engine).
        attrs_kept = any(key != FIRST_TOKEN_EVENT for key in span.attrs[::2])
        rows.append((span.trace_id, span.span_id, span.parent_span_id, span.kind, span.status_code,
                     span.start_unix_ns, span.end_unix_ns, span.trace_state, span.payload, index[id(origin)],
                     attrs_kept, observation_fields(span.observation)))
    return origins, rows
