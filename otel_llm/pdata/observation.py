"""What an engine adapter reads off one span: the engine's own numbers, nothing derived yet."""

from __future__ import annotations

from typing import TYPE_CHECKING


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


# What an observation carries, in its constructor's positional order (the compiled core's
# ``Digester`` and ``as_tuple`` read and make an observation's fields in this order).
OBSERVATION_FIELDS = (
    "engine_kind", "adapter", "ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "inference_s", "preprocess_s",
    "prompt_tokens", "completion_tokens", "max_tokens", "request_model", "response_model", "finish_reason",
    "operation_name", "provider_name", "server_address", "server_port", "is_error", "error_type", "may_be_gateway",
    "cached_tokens", "cache_write_tokens", "spec_decode", "spec_decode_rejected", "reasoning_tokens", "tpot_s",
    "itl_s", "part", "marks", "derived")
class EngineObservation:
    """Latencies in seconds as the engine reported them; ``None`` where the engine has no such field.
    Not changed once its adapter made it (an SGLang stage's is shared by every span of the stage).
    For the spans the compiled core reads, it makes ``otel_llm._core.EngineObservation`` instead
    (``rust/src/lib.rs`` ``Observation``): the same attributes, ``as_tuple``, ``mark``, equality with
    this class, its numbers held as numbers."""

    __slots__ = ("engine_kind", "adapter", "ttft_s", "e2e_s", "queue_s", "prefill_s", "decode_s", "inference_s",
                 "prompt_tokens", "completion_tokens", "max_tokens", "request_model", "response_model",
                 "finish_reason", "operation_name", "provider_name", "server_address", "server_port", "is_error",
                 "may_be_gateway", "cached_tokens", "part", "__dict__")

    engine_kind: str  # an EngineKind value
    adapter: str  # which adapter matched, e.g. "vllm_v1", visible on the trace for debugging
    ttft_s: float | None
    e2e_s: float | None
    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    inference_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    max_tokens: int | None
    request_model: str | None
    response_model: str | None
    finish_reason: str | None
    operation_name: str | None
    provider_name: str | None
    server_address: str | None
    server_port: str | None
    is_error: bool
    # A GenAI-semconv span can be a gateway in front of an engine rather than a request of its own;
    # assembly decides once it sees the whole trace.
    may_be_gateway: bool
    cached_tokens: int | None  # prompt tokens read from the prefix cache, where the engine says
    # Non-empty: the span is a part of a request read from its root at assembly (a ``Part`` value).
    part: str
    # The fields few engines or spans set: not a slot each (8 B in every observation, and every
    # buffered engine span holds one) but class attributes holding their defaults, overridden in
    # the instance's ``__dict__`` (made only then) when set; read as fast as a slot either way.
    preprocess_s: float | None = None  # only engines that report it directly (TGI validation_time)
    error_type: str | None = None
    cache_write_tokens: int | None = None  # prompt tokens written to a cache, where the emitter says
    # (accepted draft tokens, proposed draft tokens, verify steps) of speculative decoding.
    spec_decode: tuple[int, int, int] | None = None
    spec_decode_rejected: str | None = None  # why the span's speculative-decoding numbers were not taken
    reasoning_tokens: int | None = None  # output tokens spent reasoning, where a span says
    tpot_s: float | None = None  # a per-request mean inter-token latency the engine reports itself (Dynamo)
    # Per engine step after the first, from vLLM's token_generated events (vllm#32573).
    itl_s: tuple[float, ...] = ()
    # (key, value, ...) a root or part carries for assembly: event times (unix ns), a few attribute values.
    marks: tuple[object, ...] = ()
    # The engine's prefill/decode are derived from other numbers, not measured (trtllm-serve).
    derived: tuple[str, ...] = ()

    def __init__(self, engine_kind: str, adapter: str, ttft_s: float | None = None, e2e_s: float | None = None,
                 queue_s: float | None = None, prefill_s: float | None = None, decode_s: float | None = None,
                 inference_s: float | None = None, preprocess_s: float | None = None,
                 prompt_tokens: int | None = None, completion_tokens: int | None = None,
                 max_tokens: int | None = None, request_model: str | None = None, response_model: str | None = None,
                 finish_reason: str | None = None, operation_name: str | None = None,
                 provider_name: str | None = None, server_address: str | None = None,
                 server_port: str | None = None, is_error: bool = False, error_type: str | None = None,
                 may_be_gateway: bool = False, cached_tokens: int | None = None,
                 cache_write_tokens: int | None = None, spec_decode: tuple[int, int, int] | None = None,
                 spec_decode_rejected: str | None = None, reasoning_tokens: int | None = None,
                 tpot_s: float | None = None, itl_s: tuple[float, ...] = (), part: str = "",
                 marks: tuple[object, ...] = (), derived: tuple[str, ...] = (), **carried: object) -> None:
        self.engine_kind = engine_kind
        self.adapter = adapter
        self.ttft_s = ttft_s
        self.e2e_s = e2e_s
        self.queue_s = queue_s
        self.prefill_s = prefill_s
        self.decode_s = decode_s
        self.inference_s = inference_s
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.max_tokens = max_tokens
        self.request_model = request_model
        self.response_model = response_model
        self.finish_reason = finish_reason
        self.operation_name = operation_name
        self.provider_name = provider_name
        self.server_address = server_address
        self.server_port = server_port
        self.is_error = is_error
        self.may_be_gateway = may_be_gateway
        self.cached_tokens = cached_tokens
        self.part = part
        # The rarely set fields: into the instance's __dict__ only when not at their class default.
        if preprocess_s is not None:
            self.preprocess_s = preprocess_s
        if error_type is not None:
            self.error_type = error_type
        if cache_write_tokens is not None:
            self.cache_write_tokens = cache_write_tokens
        if spec_decode is not None:
            self.spec_decode = spec_decode
        if spec_decode_rejected is not None:
            self.spec_decode_rejected = spec_decode_rejected
        if reasoning_tokens is not None:
            self.reasoning_tokens = reasoning_tokens
        if tpot_s is not None:
            self.tpot_s = tpot_s
        if itl_s:
            self.itl_s = itl_s
        if marks:
            self.marks = marks
        if derived:
            self.derived = derived
        # Fields a shape declares beyond these (``adapters/shapes.py``), carried by name to the record.
        for name, value in carried.items():
            if value is not None:
                setattr(self, name, value)

    def carried(self) -> dict[str, object]:
        """The values of fields declared beyond ``OBSERVATION_FIELDS`` (``adapters/shapes.py``)."""
        return {name: value for name, value in self.__dict__.items() if name not in _OWN_FIELDS}

    def as_tuple(self) -> tuple[object, ...]:
        """Every field in ``OBSERVATION_FIELDS`` order: ``EngineObservation(*as_tuple())`` is an equal copy."""
        return tuple(getattr(self, name) for name in OBSERVATION_FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EngineObservation):
            return NotImplemented
        return self.as_tuple() == other.as_tuple() and self.carried() == other.carried()

    __hash__ = None  # type: ignore[assignment]  # as the mutable dataclass it replaced

    def __repr__(self) -> str:
        return "EngineObservation(" + ", ".join(
            f"{name}={getattr(self, name)!r}" for name in OBSERVATION_FIELDS) + ")"

    def mark(self, key: str) -> object:
        marks = self.marks
        for index in range(0, len(marks), 2):
            if marks[index] == key:
                return marks[index + 1]
        return None


_OWN_FIELDS = frozenset(OBSERVATION_FIELDS)


class MalformedSpan(ValueError):
    """An engine span whose numbers cannot be trusted; ``reason`` is a low-cardinality label."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
