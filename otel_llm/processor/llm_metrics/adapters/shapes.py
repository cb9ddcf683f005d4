"""Every engine span shape otel-llm reads, declared once as data.

The table below is read by both implementations: ``classify`` (``engines.py``) interprets it in
Python, and the native engine (``rust/engine/src/shapes.rs``) compiles it at start-up. A shape says
which spans it matches (``RULES``, the first matching rule wins), and how each field of the
observation is read (``Shape.reads``, in order: the first value that cannot be read names the
span's refusal). Facts behind every key: ``tests/testdata/engines/FACTS.md`` and the captures.

Adding an attribute a real emitter sends is a row here (the field and how it is read), a field of
``RequestRecord`` of the same name (``pdata/records.py``), and a metric declared on it
(``metrics/definitions.py``): the field reaches the record by name in both implementations.

A shape with a ``python`` reading is read by its Python function only (its numbers are spread over
events or several spans in ways a table does not say); the native engine hands such spans to
Python. Requests of ``python_records`` shapes are assembled by Python (``composite.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Span kinds and status codes (opentelemetry.proto.trace.v1), as plain ints: the table is data.
INTERNAL, SERVER, CLIENT = 1, 2, 3

FLOAT, INT, TEXT, FLAG, FLOATS, TEXTS = "float", "int", "text", "flag", "floats", "texts"


@dataclass(frozen=True, slots=True)
class ObservationField:
    name: str
    kind: str  # FLOAT, INT, TEXT, FLAG, FLOATS, TEXTS
    description: str


# What an observation holds beyond its shape (the shape says engine kind, adapter, part and
# whether it may be a gateway). Latencies in seconds as the engine reported them; None (absent)
# where the engine has no such field.
FIELDS: tuple[ObservationField, ...] = (
    ObservationField("ttft_s", FLOAT, "time to first token"),
    ObservationField("e2e_s", FLOAT, "the request's end-to-end latency"),
    ObservationField("queue_s", FLOAT, "time in the engine's queue"),
    ObservationField("prefill_s", FLOAT, "prefill time"),
    ObservationField("decode_s", FLOAT, "decode time"),
    ObservationField("inference_s", FLOAT, "time in the model (prefill + decode)"),
    ObservationField("preprocess_s", FLOAT, "time before the queue, where the engine reports it (TGI validation)"),
    ObservationField("prompt_tokens", INT, "prompt (input) tokens"),
    ObservationField("completion_tokens", INT, "completion (output) tokens"),
    ObservationField("max_tokens", INT, "the request's max_tokens"),
    ObservationField("request_model", TEXT, "the model the request asked for"),
    ObservationField("response_model", TEXT, "the model that answered"),
    ObservationField("finish_reason", TEXT, "the first finish reason"),
    ObservationField("operation_name", TEXT, "gen_ai.operation.name"),
    ObservationField("provider_name", TEXT, "the provider (the engine for an engine's span)"),
    ObservationField("server_address", TEXT, "server.address"),
    ObservationField("server_port", TEXT, "server.port"),
    ObservationField("is_error", FLAG, "the span's status is ERROR"),
    ObservationField("error_type", TEXT, "error.type, the exception's type, or _OTHER"),
    ObservationField("cached_tokens", INT, "prompt tokens read from a prefix cache"),
    ObservationField("cache_write_tokens", INT, "prompt tokens written to a cache"),
    ObservationField("spec_accepted_tokens", INT, "speculative decoding: draft tokens accepted"),
    ObservationField("spec_draft_tokens", INT, "speculative decoding: draft tokens proposed"),
    ObservationField("spec_steps", INT, "speculative decoding: verify steps"),
    ObservationField("spec_decode_rejected", TEXT, "why the span's speculative-decoding numbers were not taken"),
    ObservationField("reasoning_tokens", INT, "output tokens spent reasoning"),
    ObservationField("tpot_s", FLOAT, "a mean inter-token latency the engine reports itself"),
    ObservationField("itl_s", FLOATS, "per-step inter-token latencies (vLLM token events)"),
    ObservationField("derived", TEXTS, "segments derived from other numbers, not measured"),
    ObservationField("dispatch_to_first_token_s", FLOAT,
                     "SGLang's time_in_model_prefill: from the scheduler hand-off to the first output"),
)


@dataclass(frozen=True, slots=True)
class Read:
    """How one or more fields are read off a span. ``how`` names a reading both implementations
    know (``READINGS``); ``keys`` are attributes, the first one present wins where several are given."""

    how: str
    keys: tuple[str, ...] = ()
    arg: Any = None


def seconds(*keys: str) -> Read:
    """A number (a double, an int, or a numeric string); anything else refuses the span as
    ``non_numeric_latency``."""
    return Read("seconds", keys)


def milliseconds(*keys: str) -> Read:
    """``seconds`` of a value given in milliseconds."""
    return Read("milliseconds", keys)


def count(*keys: str) -> Read:
    """An int (a whole double, or an int string); anything else refuses as ``non_integer_tokens``."""
    return Read("count", keys)


def text(*keys: str) -> Read:
    """Text: a string, an int in decimal, a bool as true/false, a double as Python's repr, an
    array's first element; the first key present."""
    return Read("text", keys)


def first_text(*keys: str) -> Read:
    """The first key's text that is not empty."""
    return Read("first_text", keys)


def finish_reason(key: str) -> Read:
    """The first reason of an array, or of a JSON array in a string, or a bare reason."""
    return Read("finish_reason", (key,))


def rust_duration(key: str) -> Read:
    """Rust ``Duration`` Debug text (``"1.234567ms"``); anything else refuses as ``unparsable_duration``."""
    return Read("rust_duration", (key,))


def constant(value: str) -> Read:
    return Read("constant", (), value)


def by_span_name(mapping: Mapping[str, str], default: str) -> Read:
    """A value chosen by the span's name."""
    return Read("by_span_name", (), (tuple(mapping.items()), default))


def text_or_mapped(key: str, fallback: str, mapping: Mapping[str, str]) -> Read:
    """``key``'s text where the span has ``key``; else ``fallback``'s text mapped (None if unmapped)."""
    return Read("text_or_mapped", (key, fallback), tuple(mapping.items()))


# Readings of several fields at once, in the order the fields are given.
ERROR = Read("error")  # (is_error, error_type): ERROR status; error.type, the last exception event's type, or _OTHER
# (cached_tokens, cache_write_tokens, spec_accepted_tokens, spec_draft_tokens, spec_steps, spec_decode_rejected)
CACHE_AND_SPEC = Read("cache_and_spec")
TOKEN_EVENTS = Read("token_events")  # (ttft_s, itl_s) from vLLM's token_generated events, where it has them

READINGS = frozenset({"seconds", "milliseconds", "count", "text", "first_text", "finish_reason", "rust_duration",
                      "constant", "by_span_name", "text_or_mapped", "error", "cache_and_spec", "token_events"})

# What a shape does after its fields are read (named here, done alike in both implementations).
SGLANG_SINGLE_OUTPUT = "sglang_single_output"  # decode == 0 with completion > 1: ttft and decode are the final output's
TGI_UNFINISHED = "tgi_unfinished"  # no total_time: no observation unless an error, and then an error
AFTERWARDS = frozenset({SGLANG_SINGLE_OUTPUT, TGI_UNFINISHED})


@dataclass(frozen=True, slots=True)
class Shape:
    adapter: str
    engine_kind: str
    reads: tuple[tuple[tuple[str, ...], Read], ...] = ()
    part: str = ""
    may_be_gateway: bool = False
    python_records: bool = False  # requests of this shape are assembled by Python (composite.py)
    afterwards: tuple[str, ...] = ()
    # Read by a Python function of engines.py (``PYTHON_READINGS``), not by ``reads``: its numbers
    # are in events or a layout a table does not say. The native engine hands such spans to Python.
    python_reading: bool = False
    reads_attributes: bool = True  # False: the span's attributes are not read, nor kept for assembly


@dataclass(frozen=True, slots=True)
class Rule:
    """Matches a span when every condition given holds; ``shape`` or ``malformed`` is the outcome."""

    shape: str | None = None
    malformed: tuple[str, str] | None = None  # (reason, detail)
    kinds: frozenset[int] = frozenset()  # empty: any kind
    names: frozenset[str] = frozenset()  # empty: any name
    present: tuple[str, ...] = ()  # every key present
    absent: tuple[str, ...] = ()  # no key present
    any_of: tuple[str, ...] = ()  # at least one key present
    equals: tuple[tuple[str, str], ...] = ()  # the key's text equals the value
    true: tuple[str, ...] = ()  # the key is a true bool or the string "true"
    no_attributes: bool = False
    has_events: bool = False


@dataclass(frozen=True, slots=True)
class Candidates:
    """Which spans are worth reading at all, from their kind and name alone: any span of ``kinds``;
    of another kind, a name in ``names``, containing one of ``contains``, whose first word is in
    ``first_words``, or starting with one of ``prefixes``. A span that is none of these is passed
    through without its attributes being read."""

    kinds: frozenset[int]
    names: frozenset[str]
    contains: tuple[str, ...]
    first_words: frozenset[str]
    prefixes: tuple[str, ...]

    def match(self, kind: int, name: str) -> bool:
        if kind in self.kinds:
            return True
        return (name in self.names or any(part in name for part in self.contains)
                or name.split(" ", 1)[0] in self.first_words or name.startswith(self.prefixes))


_LAT = "gen_ai.latency."
E2E = _LAT + "e2e"
TTFT = _LAT + "time_to_first_token"
QUEUE = _LAT + "time_in_queue"
PREFILL = _LAT + "time_in_model_prefill"
DECODE = _LAT + "time_in_model_decode"
INFERENCE = _LAT + "time_in_model_inference"
# trtllm-serve's keys beside vLLM's (tensorrt_llm/llmapi/tracing.py @ 0fb7f758); vLLM's own phase keys.
TRTLLM_KV = _LAT + "kv_cache_transfer_time"
VLLM_PHASE_KEYS = tuple(_LAT + k for k in ("time_in_model_prefill", "time_in_model_inference", "time_in_model_decode",
                                           "time_in_scheduler", "time_in_model_forward", "time_in_model_execute"))
VLLM_SPAN_NAME = "llm_request"
TGI_HANDLER_SPANS = frozenset({"generate", "generate_stream", "chat_completions", "completions", "compat_generate"})
# SGLang 0.5.23 stage spans (RequestStage, req_time_stats.py:106-226; tests/testdata/engines/sglang/README.md).
SGLANG_STAGES = frozenset({
    "tokenize", "api_server_dispatch", "dpc_dispatch", "request_process", "prefill_waiting", "prefill_forward",
    "chunked_prefill", "decode_waiting", "decode_forward", "decode_loop", "prefill_prepare", "prefill_bootstrap",
    "prefill_transfer_kv_cache", "decode_prepare", "decode_bootstrap", "decode_transferred", "fake_output",
    "quick_finish"})
# Triton (server src/tracer.cc @ e1db8a60): the request root and a model's compute child, both SERVER.
TRITON_ROOT = "InferRequest"
TRITON_COMPUTE = "compute"
# Dynamo (lib/runtime/src/logging.rs @ b4d7ad45): the frontend's root and a worker's engine span.
DYNAMO_ROOT = "http-request"
DYNAMO_WORKER = "engine.generate"
# llm-d (llm-d-router @ ebab6879): the P/D sidecar's request span and its prefill/decode spans.
LLMD_FORWARD = "forward_request"
LLMD_PROXY_SPANS = {"prefill": "prefill", "decode": "decode", "llm_d.pd_proxy.prefill": "prefill",
                    "llm_d.pd_proxy.decode": "decode"}
LLMD_ORCHESTRATION = "gateway.request_orchestration"
# GenAI semconv span names are "{gen_ai.operation.name} {model}".
GENAI_OPERATIONS = frozenset({"chat", "text_completion", "embeddings", "generate_content", "execute_tool",
                              "invoke_agent", "create_agent", "invoke_workflow", "retrieval"})
# LiteLLM's legacy OTel logger (litellm/integrations/opentelemetry.py, 1.110): an INTERNAL span with
# gen_ai.* attributes; its child raw_gen_ai_request carries only llm.<provider>.* (no adapter reads it).
LITELLM_SPAN_NAMES = frozenset({"litellm_request"})
# Logfire's openai-agents LLM spans (INTERNAL; their names are Logfire's message templates,
# logfire/_internal/integrations/openai_agents.py @ 5.4.0): client calls, counted like any GenAI client span.
LOGFIRE_AGENT_LLM_PREFIXES = ("Responses API", "Chat completion with ")
# Traceloop's own key, on OpenLLMetry releases before gen_ai.operation.name (0.54: "chat", "completion",
# "embedding", "rerank"; opentelemetry-semantic-conventions-ai LLMRequestTypeValues), as semconv names.
TRACELOOP_REQUEST_TYPES = {"chat": "chat", "completion": "text_completion", "embedding": "embeddings"}

# Cache reads and writes on a span, first key present wins. Reads: semconv v1.41 (written by
# opentelemetry-instrumentation-openai-v2 2.4b0 response_extractors.py:371-374, OpenLLMetry 0.62.4
# openai/shared/__init__.py:285-290, LiteLLM 1.110 gen_ai_semconv.py:77-80, Logfire 5.4 semconv.py:75;
# vllm#40799/#54476 on the engine span). Writes: semconv v1.41's cache_creation (same emitters) and the
# genai repo's rename cache_write (genai #440).
CACHE_READ_KEYS = ("gen_ai.usage.cache_read.input_tokens",)
CACHE_WRITE_KEYS = ("gen_ai.usage.cache_creation.input_tokens", "gen_ai.usage.cache_write.input_tokens")
# vLLM's per-request speculative-decoding object (response ``metrics.speculative_decoding``, vllm PR #48915;
# RequestSpecDecodeMetrics.to_dict, vllm/v1/metrics/stats.py @ 0.32.0), read where a span carries it
# under the vendor prefix ``vllm.``. No emitter in reach writes it on a span yet.
SPEC_DECODE_PREFIX = "vllm.metrics.speculative_decoding."
SPEC_DECODE_KEYS = tuple(SPEC_DECODE_PREFIX + k for k in ("num_accepted_draft_tokens", "num_draft_tokens",
                                                         "num_spec_steps"))
VLLM_EVENT_LIMIT = 128  # the OTel SDK's default span event limit: past it, token events are dropped
ERROR_FIELDS = ("is_error", "error_type")
CACHE_FIELDS = ("cached_tokens", "cache_write_tokens", "spec_accepted_tokens", "spec_draft_tokens", "spec_steps",
                "spec_decode_rejected")


def _vllm(adapter: str) -> Shape:
    """vLLM's request span (V1: with prefill or inference; V0: without), FACTS.md and vllm#47633's names."""
    return Shape(adapter, "vllm", (
        (ERROR_FIELDS, ERROR),
        (("inference_s",), seconds(INFERENCE)),
        (("prefill_s",), seconds(PREFILL)),
        (("ttft_s",), seconds(TTFT)),
        (("ttft_s", "itl_s"), TOKEN_EVENTS),
        # vllm#40799 renames the token keys; the old ones stay accepted.
        (("prompt_tokens",), count("gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens")),
        (("completion_tokens",), count("gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens")),
        (CACHE_FIELDS, CACHE_AND_SPEC),
        (("e2e_s",), seconds(E2E)),
        (("queue_s",), seconds(QUEUE)),
        (("decode_s",), seconds(DECODE)),
        (("max_tokens",), count("gen_ai.request.max_tokens")),
        (("request_model",), text("gen_ai.request.model")),
        (("response_model",), text("gen_ai.response.model")),
        (("finish_reason",), finish_reason("gen_ai.response.finish_reasons")),
        (("operation_name",), text("gen_ai.operation.name")),
        (("provider_name",), constant("vllm")),
        (("server_address",), text("server.address")),
        (("server_port",), text("server.port")),
    ))


SHAPES: dict[str, Shape] = {shape.adapter: shape for shape in (
    _vllm("vllm_v1"),
    _vllm("vllm_v0"),
    Shape("sglang", "sglang", (
        (ERROR_FIELDS, ERROR),
        (("finish_reason",), finish_reason("gen_ai.response.finish_reasons")),
        (("ttft_s",), seconds(TTFT)),
        (("decode_s",), seconds(DECODE)),
        (("completion_tokens",), count("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")),
        # SGLang's time_in_model_prefill runs from the hand-off to the scheduler to the first output: it
        # holds the scheduler queue, so it is neither a prefill nor (with inference) a running time.
        # Assembly reads queue/prefill/decode from the stage spans, or reports them missing.
        (("dispatch_to_first_token_s",), seconds(PREFILL)),
        (("e2e_s",), seconds(E2E)),
        (("queue_s",), seconds(QUEUE)),  # declared by SGLang but never set today
        (("prompt_tokens",), count("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")),
        (("cached_tokens",), count("gen_ai.usage.cached_tokens")),
        (("max_tokens",), count("gen_ai.request.max_tokens")),
        (("request_model",), text("gen_ai.request.model")),
        (("response_model",), text("gen_ai.response.model")),
        (("provider_name",), constant("sglang")),
    ), afterwards=(SGLANG_SINGLE_OUTPUT,)),
    # No attribute is read: the stage's name (its span's) and interval are what assembly needs.
    Shape("sglang_stage", "sglang", part="sglang_stage", reads_attributes=False),
    Shape("tgi", "tgi", (
        (("e2e_s",), rust_duration("total_time")),
        (ERROR_FIELDS, ERROR),
        (("inference_s",), rust_duration("inference_time")),
        (("preprocess_s",), rust_duration("validation_time")),
        (("queue_s",), rust_duration("queue_time")),
        (("operation_name",), by_span_name({"chat_completions": "chat"}, "text_completion")),
        (("provider_name",), constant("tgi")),
    ), afterwards=(TGI_UNFINISHED,)),
    Shape("genai", "genai", (
        (ERROR_FIELDS, ERROR),
        (("finish_reason",), finish_reason("gen_ai.response.finish_reasons")),
        (CACHE_FIELDS, CACHE_AND_SPEC),
        # A client's time to first chunk (semconv v1.41, LiteLLM's V2 logger); the older server-named
        # attribute some gateways (and, from the client, OpenLLMetry) write otherwise.
        (("ttft_s",), seconds("gen_ai.response.time_to_first_chunk", "gen_ai.server.time_to_first_token")),
        (("prompt_tokens",), count("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")),
        (("completion_tokens",), count("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")),
        (("max_tokens",), count("gen_ai.request.max_tokens")),
        (("request_model",), text("gen_ai.request.model")),
        (("response_model",), text("gen_ai.response.model")),
        (("operation_name",), text_or_mapped("gen_ai.operation.name", "llm.request.type", TRACELOOP_REQUEST_TYPES)),
        (("provider_name",), first_text("gen_ai.provider.name", "gen_ai.system")),
        (("server_address",), text("server.address")),
        (("server_port",), text("server.port")),
        # Reasoning tokens: the same key in semconv v1.41.0 and genai v0.1.0 (research/genai-semconv.md §2a-2b).
        (("reasoning_tokens",), count("gen_ai.usage.reasoning.output_tokens")),
    ), may_be_gateway=True),
    # Read by their Python functions (engines.py): numbers in events, or spread over spans.
    Shape("trtllm", "trtllm", python_records=True, python_reading=True),
    Shape("triton", "triton", python_records=True, python_reading=True),
    Shape("triton_model", "triton", part="triton_model", python_records=True, python_reading=True),
    Shape("triton_compute", "triton", part="triton_compute", python_records=True, python_reading=True),
    Shape("dynamo", "dynamo", python_records=True, python_reading=True),
    Shape("dynamo_worker", "dynamo", part="dynamo_worker", python_records=True, python_reading=True),
    Shape("llm-d", "llm-d", python_records=True),  # no fields: the request's numbers are its parts'
    Shape("llm-d_proxy", "llm-d", part="llmd_proxy", python_records=True, python_reading=True),
    Shape("llm-d_orchestration", "llm-d", part="llmd_orchestration", python_records=True, python_reading=True),
)}

_NOT_VLLM_PHASES = (INFERENCE, *VLLM_PHASE_KEYS)

# ``classify``'s order: the first rule whose conditions all hold decides the span.
RULES: tuple[Rule, ...] = (
    Rule("sglang_stage", kinds=frozenset({INTERNAL}), names=SGLANG_STAGES),
    Rule(malformed=("missing_latency", "llm_request span without gen_ai.latency.e2e"),
         kinds=frozenset({SERVER}), names=frozenset({VLLM_SPAN_NAME}), absent=(E2E,)),
    # trtllm-serve's key set: its KV-transfer key, or vLLM's latency keys without any of vLLM's phases.
    Rule("trtllm", kinds=frozenset({SERVER}), names=frozenset({VLLM_SPAN_NAME}), absent=(INFERENCE,),
         present=(TRTLLM_KV,)),
    Rule("trtllm", kinds=frozenset({SERVER}), names=frozenset({VLLM_SPAN_NAME}), present=(QUEUE,),
         absent=_NOT_VLLM_PHASES),
    Rule("vllm_v1", kinds=frozenset({SERVER}), names=frozenset({VLLM_SPAN_NAME}), any_of=(PREFILL, INFERENCE)),
    Rule("vllm_v0", kinds=frozenset({SERVER}), names=frozenset({VLLM_SPAN_NAME})),
    Rule("tgi", names=TGI_HANDLER_SPANS, absent=(E2E,)),
    # vLLM under any name (vllm#47633 "{operation} {model}"), by its attributes.
    Rule("vllm_v1", kinds=frozenset({SERVER}), present=(E2E,), any_of=(INFERENCE, PREFILL)),
    Rule("trtllm", kinds=frozenset({SERVER}), present=(E2E, TRTLLM_KV)),
    Rule("trtllm", kinds=frozenset({SERVER}), present=(E2E, QUEUE), absent=VLLM_PHASE_KEYS),
    Rule("vllm_v0", kinds=frozenset({SERVER}), present=(E2E, "gen_ai.operation.name")),
    Rule("sglang", present=(E2E,)),
    Rule("sglang", equals=(("module", "sglang::request"),)),
    Rule("triton_model", kinds=frozenset({SERVER}), present=("triton.model_name",)),
    Rule("triton", kinds=frozenset({SERVER}), names=frozenset({TRITON_ROOT})),
    Rule("triton_compute", kinds=frozenset({SERVER}), names=frozenset({TRITON_COMPUTE}), no_attributes=True,
         has_events=True),
    Rule("llm-d", kinds=frozenset({SERVER}), names=frozenset({LLMD_FORWARD}),
         true=("llm_d.pd_proxy.disaggregation_used",)),
    Rule("llm-d_orchestration", kinds=frozenset({SERVER}), names=frozenset({LLMD_ORCHESTRATION}),
         present=("target_model",)),
    Rule("dynamo", kinds=frozenset({INTERNAL}), names=frozenset({DYNAMO_ROOT}), any_of=("ttft_ms", "request.outcome")),
    Rule("dynamo_worker", kinds=frozenset({INTERNAL}), names=frozenset({DYNAMO_WORKER}), present=("disagg_role",)),
    Rule("llm-d_proxy", kinds=frozenset({INTERNAL}), names=frozenset(LLMD_PROXY_SPANS),
         present=("llm_d.pd_proxy.connector",)),
    Rule("genai", any_of=("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model")),
)

CANDIDATES = Candidates(
    kinds=frozenset({SERVER, CLIENT}),
    names=frozenset({VLLM_SPAN_NAME, *TGI_HANDLER_SPANS, *LITELLM_SPAN_NAMES, *SGLANG_STAGES, DYNAMO_ROOT,
                     DYNAMO_WORKER, *LLMD_PROXY_SPANS}),
    contains=(" Req ",),
    first_words=GENAI_OPERATIONS,
    prefixes=LOGFIRE_AGENT_LLM_PREFIXES,
)


def declaration() -> dict[str, Any]:
    """The table as plain data (JSON), the form the native engine compiles at start-up
    (``rust/engine/src/declaration.rs``): fields by name and kind, shapes with their readings (a
    reading's field names, ``how``, keys and argument), rules in ``classify``'s order, candidates.
    ``cache_and_spec`` carries the key lists this module names for it, so the engine holds no key."""

    def read_of(read: Read) -> dict[str, Any]:
        arg: Any = read.arg
        if read.how == "by_span_name":
            arg = [[list(pair) for pair in read.arg[0]], read.arg[1]]
        elif read.how == "text_or_mapped":
            arg = [list(pair) for pair in read.arg]
        elif read.how == "cache_and_spec":
            arg = {"read_keys": list(CACHE_READ_KEYS), "write_keys": list(CACHE_WRITE_KEYS),
                   "spec_keys": list(SPEC_DECODE_KEYS)}
        return {"how": read.how, "keys": list(read.keys), "arg": arg}

    return {
        "fields": [[field.name, field.kind] for field in FIELDS],
        "shapes": [{"adapter": shape.adapter, "engine_kind": shape.engine_kind, "part": shape.part,
                    "may_be_gateway": shape.may_be_gateway, "python_records": shape.python_records,
                    "python_reading": shape.python_reading, "reads_attributes": shape.reads_attributes,
                    "afterwards": list(shape.afterwards),
                    "reads": [[list(fields), read_of(read)] for fields, read in shape.reads]}
                   for shape in SHAPES.values()],
        "rules": [{"shape": rule.shape, "malformed": None if rule.malformed is None else rule.malformed[0],
                   "kinds": sorted(rule.kinds), "names": sorted(rule.names), "present": list(rule.present),
                   "absent": list(rule.absent), "any_of": list(rule.any_of),
                   "equals": [list(pair) for pair in rule.equals], "true": list(rule.true),
                   "no_attributes": rule.no_attributes, "has_events": rule.has_events}
                  for rule in RULES],
        "candidates": {"kinds": sorted(CANDIDATES.kinds), "names": sorted(CANDIDATES.names),
                       "contains": list(CANDIDATES.contains), "first_words": sorted(CANDIDATES.first_words),
                       "prefixes": list(CANDIDATES.prefixes)},
    }


def check() -> None:
    """The table's own consistency, at import: a rule names a declared shape, a reading a known
    one, a field a declared one of a kind its reading gives."""
    names = {f.name for f in FIELDS}
    for rule in RULES:
        if (rule.shape is None) == (rule.malformed is None):
            raise ImportError(f"a rule gives a shape or a refusal: {rule}")
        if rule.shape is not None and rule.shape not in SHAPES:
            raise ImportError(f"rule for undeclared shape {rule.shape!r}")
    for shape in SHAPES.values():
        for fields, read in shape.reads:
            if read.how not in READINGS:
                raise ImportError(f"{shape.adapter}: unknown reading {read.how!r}")
            for name in fields:
                if name not in names:
                    raise ImportError(f"{shape.adapter}: undeclared field {name!r}")
        for after in shape.afterwards:
            if after not in AFTERWARDS:
                raise ImportError(f"{shape.adapter}: unknown afterwards {after!r}")


check()
