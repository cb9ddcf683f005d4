"""The request record: one per LLM request, the single input of every metric and sampling policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from otel_llm.pdata.span_rows import SpanRow


class Outcome:
    """vLLM's ``finished_reason`` values plus ``unknown`` for engines that don't report one.
    Plain strings, as EngineKind, because they are label values on the hot path."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"
    UNKNOWN = "unknown"
    FAILED = frozenset({ABORT, ERROR})


class Side:
    """Which side of the request a record describes (DESIGN.md §10): the server side (engine spans
    and the gateways in front of them) feeds ``vllm:``/``gen_ai.server.*``; the client side
    (CLIENT/INTERNAL GenAI spans of applications and gateways calling out) feeds ``gen_ai.client.*``."""

    SERVER = "server"
    CLIENT = "client"


class Source:
    """Where a record's model or operation came from. Only ``DEFAULT`` is not an observation; what
    came from it is never written into an exported span."""

    DEFAULT = "default"


class Segment(NamedTuple):
    """A named tuple rather than a frozen dataclass: five or six per request, built at completion,
    and a frozen dataclass's ``__init__`` costs ~4x a tuple's."""

    name: str
    start_unix_ns: int
    end_unix_ns: int

    @property
    def duration_s(self) -> float:
        return (self.end_unix_ns - self.start_unix_ns) / 1e9


@dataclass(slots=True)
class RequestRecord:
    trace_id: bytes
    span_id: bytes  # the engine span, or the edge span of a request that never reached an engine
    engine_kind: str  # an EngineKind value; "client" on the client side
    adapter: str
    service_name: str
    model: str
    model_source: str  # which model-name rule fired, e.g. "span:gen_ai.response.model"; "none" if none did
    request_model: str  # observed (or mapped from the resource); "" when nothing said
    response_model: str  # observed only; "" when nothing said
    operation_name: str
    provider_name: str  # observed, or the engine that emitted the span; "" when nothing said
    outcome: str  # an Outcome value
    side: str = Side.SERVER
    operation_source: str = Source.DEFAULT  # "span", "gateway", "route" or "default" (configured)
    error_type: str = ""
    server_address: str = ""
    server_port: str = ""
    start_unix_ns: int = 0
    # On a client record: ttft_s is the time to first chunk, e2e_s the client operation's duration.
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    inference_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    gateway_overhead_s: float | None = None
    # The joined client span's duration minus the engine's e2e: network, gateways and queueing
    # outside the engine, as the caller saw them (server records joined to a client span only).
    client_overhead_s: float | None = None
    edge_ttft_s: float | None = None
    edge_span_id: bytes = b""
    # Server record: the client span it was joined with; client record: the engine span it joined.
    joined_span_id: bytes = b""
    segments: tuple[Segment, ...] = ()
    dimensions: tuple[str, ...] = ()  # values of the configured extra dimensions, in config order
    weight: float = 1.0  # adjusted count under upstream probability sampling
    # Values read at assembly that failed validation (reasons), so they are counted, not observed.
    rejected: tuple[str, ...] = ()
    # Segments the engine does not report for this request (e.g. SGLang's queue and prefill when its
    # scheduler spans are missing), and those derived from other numbers rather than measured.
    segments_missing: tuple[str, ...] = ()
    # Derived intervals that came out negative for this request (two processes, two clocks): not
    # measurable, so not observed; the request is measured with everything else.
    not_measurable: tuple[str, ...] = ()
    segments_derived: tuple[str, ...] = ()
    cached_tokens: int | None = None
    # GenAI usage the span reports (cache writes: semconv v1.41 ``cache_creation``, genai v0.1 ``cache_write``).
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    itl_s: tuple[float, ...] = ()  # per-step inter-token latencies (vLLM token events)
    # The configured tenant attribute's value if allow-listed, else the configured ``other``; ""
    # when no span of the request carries one (or no tenant is configured).
    tenant: str = ""
    # Speculative decoding, where a span reports it (vLLM's per-request ``metrics.speculative_decoding``
    # keys): draft tokens accepted, draft tokens proposed, verify steps.
    spec_accepted_tokens: int | None = None
    spec_draft_tokens: int | None = None
    spec_steps: int | None = None
    # The LoRA adapter the request named (a configured adapter name), "" when none did.
    lora_adapter: str = ""
    lora_base_model: str = ""

    @property
    def succeeded(self) -> bool:
        return self.outcome not in Outcome.FAILED


class KeptTrace:
    """What the tail sampler kept, after redaction and synthesis: the OTLP request to export (the
    trace's spans plus the synthesized segment spans), the one record per request a store row is
    written for, the policy that kept it, and, when its producer built them, the store rows of the
    request's spans (``pdata.span_rows``), so the store need not read the request again.

    ``request`` may be given as the message or as its bytes (what the compiled core writes): from
    bytes, the message is parsed the first time a consumer reads ``request`` (the store, given the
    rows, never does); ``serialized`` is the bytes either way."""

    __slots__ = ("_request", "_serialized", "spans", "records", "policy", "span_rows")

    def __init__(self, request: ExportTraceServiceRequest | bytes, spans: int, records: list[RequestRecord],
                 policy: str, span_rows: list[SpanRow] | None = None) -> None:
        if isinstance(request, bytes):
            self._request: ExportTraceServiceRequest | None = None
            self._serialized: bytes | None = request
        else:
            self._request, self._serialized = request, None
        self.spans = spans
        self.records = records
        self.policy = policy
        self.span_rows = span_rows

    @property
    def request(self) -> ExportTraceServiceRequest:
        if self._request is None:
            assert self._serialized is not None
            self._request = ExportTraceServiceRequest.FromString(self._serialized)
        return self._request

    @property
    def serialized(self) -> bytes:
        if self._serialized is None:
            assert self._request is not None
            self._serialized = self._request.SerializeToString()
        return self._serialized

    @property
    def trace_id(self) -> bytes:
        if self.span_rows:
            return bytes.fromhex(self.span_rows[0][0])
        for resource_spans in self.request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    return bytes(span.trace_id)
        return b""
