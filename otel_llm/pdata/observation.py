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
    # Issue 14 (tests/testdata/engines/FACTS.md): the engine kinds those facts name, nothing else.
    TRITON = "triton"
    TRTLLM = "trtllm"
    DYNAMO = "dynamo"
    LLM_D = "llm-d"


class Part:
    """Roles of spans that are not requests themselves but parts of one, read at assembly from the
    request's root span (``EngineObservation.part``)."""

    SGLANG_STAGE = "sglang_stage"  # an SGLang stage span (prefill_waiting, prefill_forward, ...)
    TRITON_MODEL = "triton_model"  # a Triton model span (REQUEST_START/QUEUE_START/REQUEST_END)
    TRITON_COMPUTE = "triton_compute"  # its compute child (COMPUTE_* events)
    DYNAMO_WORKER = "dynamo_worker"  # a Dynamo worker's engine.generate span
    LLMD_PROXY = "llmd_proxy"  # llm-d's sidecar prefill / decode spans
    LLMD_ORCHESTRATION = "llmd_orchestration"  # the EPP's gateway.request_orchestration


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
    cached_tokens: int | None = None  # prompt tokens read from the prefix cache, where the engine says
    cache_write_tokens: int | None = None  # prompt tokens written to a cache, where the emitter says
    # (accepted draft tokens, proposed draft tokens, verify steps) of speculative decoding; None where unsaid.
    spec_decode: tuple[int, int, int] | None = None
    spec_decode_rejected: str | None = None  # why the span's speculative-decoding numbers were not taken
    reasoning_tokens: int | None = None  # output tokens spent reasoning, where a span says
    tpot_s: float | None = None  # a per-request mean inter-token latency the engine reports itself (Dynamo)
    # Per engine step after the first, from vLLM's token_generated events (vllm#32573); () without them.
    itl_s: tuple[float, ...] = ()
    # Non-empty: the span is a part of a request read from its root at assembly (a ``Part`` value).
    part: str = ""
    # (key, value, ...) a root or part carries for assembly: event times (unix ns), a few attribute values.
    marks: tuple[object, ...] = ()
    # The engine's prefill/decode are derived from other numbers, not measured (trtllm-serve).
    derived: tuple[str, ...] = ()

    def mark(self, key: str) -> object:
        marks = self.marks
        for index in range(0, len(marks), 2):
            if marks[index] == key:
                return marks[index + 1]
        return None


class MalformedSpan(ValueError):
    """An engine span whose numbers cannot be trusted; ``reason`` is a low-cardinality label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
