"""The request record: one per LLM request, the single input of every metric and sampling policy."""

from __future__ import annotations

from dataclasses import dataclass


class Outcome:
    """vLLM's ``finished_reason`` values plus ``unknown`` for engines that don't report one.
    Plain strings, as EngineKind, because they are label values on the hot path."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"
    UNKNOWN = "unknown"
    FAILED = frozenset({ABORT, ERROR})


@dataclass(slots=True, frozen=True)
class Segment:
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
    engine_kind: str  # an EngineKind value
    adapter: str
    service_name: str
    model: str
    model_source: str  # which model-name rule fired, e.g. "span:gen_ai.response.model"
    request_model: str
    response_model: str
    operation_name: str
    provider_name: str
    outcome: str  # an Outcome value
    error_type: str = ""
    server_address: str = ""
    server_port: str = ""
    start_unix_ns: int = 0
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
    edge_ttft_s: float | None = None
    edge_span_id: bytes = b""
    segments: tuple[Segment, ...] = ()
    dimensions: tuple[str, ...] = ()  # values of the configured extra dimensions, in config order
    weight: float = 1.0  # adjusted count under upstream probability sampling

    @property
    def succeeded(self) -> bool:
        return self.outcome not in Outcome.FAILED
