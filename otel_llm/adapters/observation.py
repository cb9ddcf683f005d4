"""What an engine adapter reads off one span: the engine's own numbers, nothing derived yet."""

from __future__ import annotations

from dataclasses import dataclass


class EngineKind:
    """Label values of ``engine_kind``. Plain strings, not an Enum: they are read for every metric
    observation, and Enum attribute access costs microseconds on that path."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TGI = "tgi"
    GENAI = "genai"


@dataclass(slots=True)
class EngineObservation:
    """Latencies in seconds as the engine reported them; ``None`` where the engine has no such field."""

    engine_kind: str  # an EngineKind value
    adapter: str  # which adapter matched, e.g. "vllm_v1", visible on the trace for debugging
    ttft_s: float | None = None
    e2e_s: float | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    inference_s: float | None = None
    preprocess_s: float | None = None  # only engines that report it directly (TGI validation_time)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    max_tokens: int | None = None
    request_model: str | None = None
    response_model: str | None = None
    finish_reason: str | None = None
    operation_name: str | None = None
    provider_name: str | None = None
    server_address: str | None = None
    server_port: str | None = None
    is_error: bool = False
    error_type: str | None = None
    # A GenAI-semconv span can be a gateway in front of an engine rather than a request of its own;
    # assembly decides once it sees the whole trace.
    may_be_gateway: bool = False


class MalformedSpan(ValueError):
    """An engine span whose numbers cannot be trusted; ``reason`` is a low-cardinality label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
