"""Every span-derived metric, declared once as data: name, unit, buckets, labels, value.

Both namings read the same ``RequestRecord``; the Prometheus exposition names of the OTel
metrics are derived here by the OTLP->Prometheus rules, never spelled twice.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from otel_llm.pdata.records import RequestRecord, Side

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
# vLLM's inter_token_latency buckets (vllm/v1/metrics/buckets.py, v0.33.0; research/engine-spans.md 2.1).
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
GENAI_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
GENAI_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
GENAI_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
GENAI_CLIENT_TOKEN_BUCKETS = (1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
                              4194304.0, 16777216.0, 67108864.0)


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, ... up to ``max_value``, stopping at the first larger."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(float(b) for b in buckets)
            buckets.append(value)
        exponent += 1


_RECORD_FIELDS = frozenset(RequestRecord.__dataclass_fields__)


class Field:
    """A spec's value that is a record's field as it is, declared as data: the recorder's compiled
    observer reads ``record.<name>`` inline instead of calling a function, and a misspelled name
    fails here, at import, not at the first record."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if name not in _RECORD_FIELDS:
            raise ValueError(f"RequestRecord has no field {name!r}")
        self.name = name

    def __call__(self, record: RequestRecord) -> Any:
        return getattr(record, self.name)

    def __repr__(self) -> str:
        return f"Field({self.name!r})"


class Either:
    """A label value that is a record's field, or another field where the first is empty
    (``record.first or record.fallback``), declared as data as ``Field`` is."""

    __slots__ = ("first", "fallback")

    def __init__(self, first: str, fallback: str) -> None:
        Field(first)  # the same check
        Field(fallback)
        self.first = first
        self.fallback = fallback

    def __call__(self, record: RequestRecord) -> Any:
        return getattr(record, self.first) or getattr(record, self.fallback)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Either) and (other.first, other.fallback) == (self.first, self.fallback)

    def __hash__(self) -> int:
        return hash((self.first, self.fallback))

    def __repr__(self) -> str:
        return f"Either({self.first!r}, {self.fallback!r})"


class Fields:
    """A naming's label values that are record fields as they are (or ``Either`` of two), in label
    order (see ``Field``)."""

    __slots__ = ("names",)

    def __init__(self, *names: str | Either) -> None:
        for name in names:
            if not isinstance(name, Either):
                Field(name)  # the same check
        self.names = names

    def __call__(self, record: RequestRecord) -> tuple[str, ...]:
        return tuple(name(record) if isinstance(name, Either) else getattr(record, name) for name in self.names)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Fields) and other.names == self.names

    def __hash__(self) -> int:
        return hash(self.names)

    def __repr__(self) -> str:
        return f"Fields{self.names!r}"


class Constant:
    """A spec's value that is the same for every record (a counter of requests counts 1 each)."""

    __slots__ = ("value",)

    def __init__(self, value: int | None) -> None:
        self.value = value

    def __call__(self, record: RequestRecord) -> int | None:
        return self.value

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"


class Difference:
    """``record.minuend - record.subtrahend``, None where either is None: a value computed from two
    fields, declared as data so the compiled core computes it without calling Python (with
    CPython's own number protocol, so the result is the same object type and value)."""

    __slots__ = ("minuend", "subtrahend")

    def __init__(self, minuend: str, subtrahend: str) -> None:
        Field(minuend)
        Field(subtrahend)
        self.minuend = minuend
        self.subtrahend = subtrahend

    def __call__(self, record: RequestRecord) -> Any:
        minuend, subtrahend = getattr(record, self.minuend), getattr(record, self.subtrahend)
        if minuend is None or subtrahend is None:
            return None
        return minuend - subtrahend

    def __repr__(self) -> str:
        return f"Difference({self.minuend!r}, {self.subtrahend!r})"


class IfSet:
    """``then(record)`` where ``record.<field>`` is set, else None: a value counted only for the
    records that name something (a LoRA adapter), declared as data (the engine reads it as
    ``ValueSpec::IfSet``)."""

    __slots__ = ("field", "then")

    def __init__(self, field: str, then: Callable[[RequestRecord], Any]) -> None:
        Field(field)  # the same check
        self.field = field
        self.then = then

    def __call__(self, record: RequestRecord) -> Any:
        return self.then(record) if getattr(record, self.field) else None

    def __repr__(self) -> str:
        return f"IfSet({self.field!r}, {self.then!r})"


class Ratio:
    """``record.numerator / record.denominator`` (plus ``offset`` if one is given), None where the
    numerator is None or the denominator is None or zero; declared as data as ``Difference`` is."""

    __slots__ = ("numerator", "denominator", "offset")

    def __init__(self, numerator: str, denominator: str, offset: float | None = None) -> None:
        Field(numerator)
        Field(denominator)
        self.numerator = numerator
        self.denominator = denominator
        self.offset = offset

    def __call__(self, record: RequestRecord) -> Any:
        numerator, denominator = getattr(record, self.numerator), getattr(record, self.denominator)
        if numerator is None or not denominator:
            return None
        quotient = numerator / denominator
        return quotient if self.offset is None else self.offset + quotient

    def __repr__(self) -> str:
        return f"Ratio({self.numerator!r}, {self.denominator!r}, {self.offset!r})"


class UnlessAtMost:
    """``record.name``, except None where ``record.guard`` is not None and at most ``limit``;
    declared as data as ``Difference`` is."""

    __slots__ = ("name", "guard", "limit")

    def __init__(self, name: str, guard: str, limit: int) -> None:
        Field(name)
        Field(guard)
        self.name = name
        self.guard = guard
        self.limit = limit

    def __call__(self, record: RequestRecord) -> Any:
        guard = getattr(record, self.guard)
        if guard is not None and guard <= self.limit:
            return None
        return getattr(record, self.name)

    def __repr__(self) -> str:
        return f"UnlessAtMost({self.name!r}, {self.guard!r}, {self.limit!r})"


# Any other callable is called per record (the compiled core calls it back too).
Value = Callable[[RequestRecord], float | None]
# A spec with ``per_step``: one observation per value of a sequence (vLLM's per-step inter-token latency).
Values = Callable[[RequestRecord], tuple[float, ...]]


@dataclass(frozen=True, slots=True)
class HistogramSpec:
    name: str  # OTel-style or vLLM name as users know it
    unit: str  # UCUM, "s" or "{token}"
    description: str
    buckets: tuple[float, ...]
    value: Value
    success_only: bool = False  # TTFT and TPOT are defined for successful responses only
    # One more label with a fixed value, for instruments that split one record into several
    # observations (``gen_ai.client.token.usage`` by ``gen_ai.token.type``); same-named specs share a family.
    fixed_label: tuple[str, str] | None = None
    per_step: Values | None = None  # observed once per value instead of ``value``
    # (model label, buckets) pairs whose series use their own buckets (vLLM's token buckets per max_model_len)
    buckets_by_model: tuple[tuple[str, tuple[float, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class CounterSpec:
    name: str
    unit: str
    description: str
    value: Value
    by_outcome: bool = False  # adds the ``finished_reason`` label
    # One more label with a fixed value (``gen_ai.token.modality`` on the GenAI v0.1 usage counters).
    fixed_label: tuple[str, str] | None = None


Labels = Callable[[RequestRecord], tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Naming:
    key: str  # the config switch: processors.llm_metrics.namings.<key>
    label_names: tuple[str, ...]  # OTel attribute names; Prometheus label names are derived
    labels: Labels
    histograms: tuple[HistogramSpec, ...]
    counters: tuple[CounterSpec, ...] = ()
    side: str = Side.SERVER  # which records it observes
    # The conventions' schema URL its metrics are pushed under over OTLP (scope ``otel_llm``); "" = none.
    schema_url: str = ""


_UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": ""}
_INVALID_NAME = re.compile(r"[^a-zA-Z0-9_:]+")
_INVALID_LABEL = re.compile(r"[^a-zA-Z0-9_]+")
_REPEATED = re.compile(r"__+")


def prometheus_metric_name(name: str, unit: str) -> str:
    """OTLP->Prometheus (UnderscoreEscapingWithSuffixes): escape, then append the unit word."""
    escaped = _REPEATED.sub("_", _INVALID_NAME.sub("_", name))
    word = "" if unit.startswith("{") else _UNIT_WORDS.get(unit, unit)
    if word and not escaped.endswith("_" + word):
        escaped = f"{escaped}_{word}"
    return escaped


def prometheus_label_name(name: str) -> str:
    return _REPEATED.sub("_", _INVALID_LABEL.sub("_", name))


def tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    return build_1_2_5_buckets(max_model_len)


def vllm_naming(max_model_len: int, max_model_len_by_model: dict[str, int] | None = None) -> Naming:
    tokens = tokens_buckets(max_model_len)
    per_model = tuple((model, tokens_buckets(length)) for model, length in sorted((max_model_len_by_model or {}).items()))
    return Naming(
        key="vllm",
        label_names=("model_name", "engine_kind", "service_name"),
        labels=Fields("model", "engine_kind", "service_name"),
        histograms=(
            HistogramSpec("vllm:time_to_first_token_seconds", "s", "Histogram of time to first token in seconds.",
                          TTFT_BUCKETS, Field("ttft_s"), success_only=True),
            HistogramSpec("vllm:request_time_per_output_token_seconds", "s",
                          "Histogram of time_per_output_token_seconds per request.",
                          TPOT_BUCKETS, Field("tpot_s"), success_only=True),
            HistogramSpec("vllm:inter_token_latency_seconds", "s", "Histogram of inter-token latency in seconds.",
                          INTER_TOKEN_LATENCY_BUCKETS, Constant(None), per_step=Field("itl_s")),
            HistogramSpec("vllm:e2e_request_latency_seconds", "s", "Histogram of e2e request latency in seconds.",
                          REQUEST_LATENCY_BUCKETS, Field("e2e_s")),
            HistogramSpec("vllm:request_queue_time_seconds", "s",
                          "Histogram of time spent in WAITING phase for request.",
                          REQUEST_LATENCY_BUCKETS, Field("queue_s")),
            HistogramSpec("vllm:request_prefill_time_seconds", "s",
                          "Histogram of time spent in PREFILL phase for request.",
                          REQUEST_LATENCY_BUCKETS, Field("prefill_s")),
            HistogramSpec("vllm:request_decode_time_seconds", "s",
                          "Histogram of time spent in DECODE phase for request.",
                          REQUEST_LATENCY_BUCKETS, Field("decode_s")),
            HistogramSpec("vllm:request_inference_time_seconds", "s",
                          "Histogram of time spent in RUNNING phase for request.",
                          REQUEST_LATENCY_BUCKETS, Field("inference_s")),
            HistogramSpec("vllm:request_prompt_tokens", "{token}", "Number of prefill tokens processed.",
                          tokens, Field("prompt_tokens"), buckets_by_model=per_model),
            HistogramSpec("vllm:request_generation_tokens", "{token}", "Number of generation tokens processed.",
                          tokens, Field("completion_tokens"), buckets_by_model=per_model),
        ),
        counters=(
            CounterSpec("vllm:prompt_tokens", "{token}", "Number of prefill tokens processed.", Field("prompt_tokens")),
            CounterSpec("vllm:generation_tokens", "{token}", "Number of generation tokens processed.",
                        Field("completion_tokens")),
            CounterSpec("vllm:request_success", "{request}", "Count of finished requests by finished reason.",
                        Constant(1), by_outcome=True),
        ),
    )


GENAI_LABEL_NAMES = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model",
                     "server.address", "server.port", "error.type")


# A configured default model (never an observation) still labels the series the user asked it to.
_GENAI_LABELS = Fields("operation_name", "provider_name", Either("request_model", "model"), "response_model",
                       "server_address", "server_port", "error_type")
# Semconv: time per output token *after the first*, which a request of at most one output token does not
# have (the ``vllm:`` family observes 0 for it, as vLLM does).
_GENAI_TPOT = UnlessAtMost("tpot_s", "completion_tokens", 1)


def genai_naming(version: str = "1.41") -> Naming:
    """The three ``gen_ai.server.*`` metrics: the same names, units and buckets in semconv v1.41.0 and
    genai v0.1.0 (``gen-ai-metrics.md`` at both; research/field-2026.md §1.1); only the schema URL differs."""
    return Naming(
        key="gen_ai",
        label_names=GENAI_LABEL_NAMES,
        labels=_GENAI_LABELS,
        schema_url=GENAI_VERSIONS[version],
        histograms=(
            HistogramSpec("gen_ai.server.time_to_first_token", "s", "Time to generate first token for successful responses.",
                          GENAI_TTFT_BUCKETS, Field("ttft_s"), success_only=True),
            HistogramSpec("gen_ai.server.time_per_output_token", "s",
                          "Time per output token generated after the first token for successful responses.",
                          GENAI_TPOT_BUCKETS, _GENAI_TPOT, success_only=True),
            HistogramSpec("gen_ai.server.request.duration", "s", "Generative AI server request duration.",
                          GENAI_DURATION_BUCKETS, Field("e2e_s")),
        ),
    )


# The GenAI conventions a ``gen_ai`` naming can follow (``processors.llm_metrics.namings.gen_ai_version``):
# version -> the schema URL of the scope its metrics are pushed in over OTLP.
#   1.41: semantic-conventions v1.41.0, the last core release with GenAI content (research/genai-semconv.md §1a, §3).
#   0.1:  semantic-conventions-genai v0.1.0, the first standalone release, "Depends on semantic-conventions
#         v1.45.0" (its CHANGELOG; research/field-2026.md §1.1). Its schema URL follows the genai repo
#         README's pattern ``https://opentelemetry.io/schemas/gen-ai/<version>`` (research/genai-semconv.md §3).
GENAI_VERSIONS: dict[str, str] = {
    "1.41": "https://opentelemetry.io/schemas/1.41.0",
    "0.1": "https://opentelemetry.io/schemas/gen-ai/0.1.0",
}
DEFAULT_GENAI_VERSION = "1.41"
# v0.1.0's usage counters carry the Required ``gen_ai.token.modality`` (text|image|audio|unknown,
# research/genai-semconv.md §1d). Spans report one total per kind, not per modality: ``unknown``,
# the convention's own value for it, never a guessed ``text``.
GENAI_TOKEN_MODALITY = ("gen_ai.token.modality", "unknown")


def genai_client_naming(version: str = DEFAULT_GENAI_VERSION) -> Naming:
    """The GenAI client metrics of semconv ``version`` (``GENAI_VERSIONS``), from client-side records
    only. Switched with the ``gen_ai`` naming. ``time_per_output_chunk`` (v1.41
    ``gen_ai.client.operation.``, v0.1 ``gen_ai.client.inference.``) is not derived: it is one
    observation per chunk, and no instrumentation puts per-chunk times on its span."""
    if version == "0.1":
        return _genai_client_naming_0_1()
    if version != "1.41":
        raise ValueError(f"unknown GenAI conventions version {version!r} (have: {', '.join(GENAI_VERSIONS)})")
    return Naming(
        key="gen_ai",
        label_names=GENAI_LABEL_NAMES,
        labels=_GENAI_LABELS,
        side=Side.CLIENT,
        schema_url=GENAI_VERSIONS["1.41"],
        histograms=(
            HistogramSpec("gen_ai.client.operation.duration", "s", "GenAI operation duration.",
                          GENAI_DURATION_BUCKETS, Field("e2e_s")),
            HistogramSpec("gen_ai.client.operation.time_to_first_chunk", "s",
                          "Time to receive the first chunk, for streaming calls.",
                          GENAI_DURATION_BUCKETS, Field("ttft_s")),
            HistogramSpec("gen_ai.client.token.usage", "{token}", "Number of input and output tokens used.",
                          GENAI_CLIENT_TOKEN_BUCKETS, Field("prompt_tokens"),
                          fixed_label=("gen_ai.token.type", "input")),
            HistogramSpec("gen_ai.client.token.usage", "{token}", "Number of input and output tokens used.",
                          GENAI_CLIENT_TOKEN_BUCKETS, Field("completion_tokens"),
                          fixed_label=("gen_ai.token.type", "output")),
        ),
    )


def _genai_client_naming_0_1() -> Naming:
    """semantic-conventions-genai v0.1.0 ``docs/gen-ai/client-inference.md`` (research/field-2026.md §1.1,
    research/genai-semconv.md §1d): ``gen_ai.client.operation.duration`` becomes
    ``gen_ai.client.inference.duration`` for inference (same buckets), the chunk metric
    ``gen_ai.client.inference.time_to_first_chunk`` (genai PR #521), and the histogram
    ``gen_ai.client.token.usage`` gives way to ``{token}`` Counters (genai PR #374), the cache and
    reasoning ones included (each part of input resp. output tokens, as the span attributes are)."""
    def usage(name: str, description: str, value: Value) -> CounterSpec:
        return CounterSpec(f"gen_ai.client.inference.usage.{name}", "{token}", description, value,
                           fixed_label=GENAI_TOKEN_MODALITY)

    return Naming(
        key="gen_ai",
        label_names=GENAI_LABEL_NAMES,
        labels=_GENAI_LABELS,
        side=Side.CLIENT,
        schema_url=GENAI_VERSIONS["0.1"],
        histograms=(
            HistogramSpec("gen_ai.client.inference.duration", "s", "GenAI inference operation duration.",
                          GENAI_DURATION_BUCKETS, Field("e2e_s")),
            HistogramSpec("gen_ai.client.inference.time_to_first_chunk", "s",
                          "Time to receive the first chunk, for streaming calls.",
                          GENAI_DURATION_BUCKETS, Field("ttft_s")),
        ),
        counters=(
            usage("input_tokens", "Input tokens used (cached ones included).", Field("prompt_tokens")),
            usage("output_tokens", "Output tokens used (reasoning ones included).", Field("completion_tokens")),
            usage("cache_read.input_tokens", "Input tokens read from the provider's cache.",
                  Field("cached_tokens")),
            usage("cache_write.input_tokens", "Input tokens written to the provider's cache.",
                  Field("cache_write_tokens")),
            usage("reasoning.output_tokens", "Output tokens spent on reasoning.", Field("reasoning_tokens")),
        ),
    )


def own_naming() -> Naming:
    """The product's own request metrics, for what neither naming has a name for."""
    return Naming(
        key="otel_llm",
        label_names=("model_name", "engine_kind", "service_name"),
        labels=Fields("model", "engine_kind", "service_name"),
        histograms=(
            HistogramSpec("otel_llm_gateway_overhead_seconds", "s",
                          "Edge gateway span duration minus the engine's e2e latency.",
                          GENAI_DURATION_BUCKETS, Field("gateway_overhead_s")),
            HistogramSpec("otel_llm_client_overhead_seconds", "s",
                          "Joined client span duration minus the engine's e2e latency: what the caller waited "
                          "outside the engine (network, gateways, their queues).",
                          GENAI_DURATION_BUCKETS, Field("client_overhead_s")),
            HistogramSpec("otel_llm_edge_time_to_first_token_seconds", "s",
                          "Time to first token as the edge gateway reports it.",
                          TTFT_BUCKETS, Field("edge_ttft_s"), success_only=True),
        ),
    )


# Every value the ``segment`` label can take, and what the interval is (the reference's table; a
# test finds every segment name the Python and Rust code build among these).
SEGMENT_NAMES: dict[str, str] = {
    "preprocess": "from the request's arrival to its queue: tokenization, the API server's own lag",
    "queue": "waiting for the scheduler",
    "prefill": "the prompt's forward pass, to the first token",
    "decode": "from the first output token to the last",
    "postprocess": "from the last token to the end of the response: detokenization, the API server",
    "kv_transfer": "the KV cache moved from the prefill worker to the decode worker (disaggregated serving: SGLang, "
                   "trtllm-serve, Dynamo, llm-d)",
    "decode_queue": "the decode worker's own queue (disaggregated SGLang and llm-d)",
    "queue_and_prefill": "queue and prefill where the engine does not split them (SGLang without scheduler spans, "
                         "a Dynamo worker without its engine's span)",
    "compute": "Triton's model execution (for the TensorRT-LLM backend: the executor's queue, prefill and decode)",
    "inference": "TGI's inference after its queue, which it does not split at the first token",
    "routing": "llm-d: the gateway's routing, before the prefill pod's work",
    "coordination": "llm-d's P/D sidecar between its prefill and decode calls (without the pods' vLLM spans)",
}

SEGMENT_METRIC = HistogramSpec(
    "otel_llm_request_segment_seconds", "s",
    "Duration of each request segment (preprocess, queue, prefill, decode, postprocess; kv_transfer, decode_queue, "
    "queue_and_prefill, compute, inference, routing, coordination where an engine has them), every engine.",
    TTFT_BUCKETS,  # segments span milliseconds (preprocess) to minutes (queue under overload)
    Constant(None),  # observed per segment, see MetricsRecorder
)


@dataclass(frozen=True, slots=True)
class AccountingSpec:
    """A counter or gauge of the tenant, cost and SLO accounting (metrics/accounting.py): not an
    observation of one record in a naming, so its labels are its own."""

    name: str  # the Prometheus name (a counter's samples add ``_total``)
    kind: str  # "counter" or "gauge"
    unit: str
    description: str
    label_names: tuple[str, ...]


TENANT_TOKENS = AccountingSpec(
    "otel_llm_tenant_tokens", "counter", "{token}",
    "Tokens per model and tenant: token_type input (prompt tokens not read from a cache), cached_input "
    "(prompt tokens the engine or gateway reports read from a cache) and output. Server-side requests, and "
    "client-side calls no engine span served (a gateway calling a provider).",
    ("model_name", "tenant", "token_type"))
REQUEST_COST = AccountingSpec(
    "otel_llm_request_cost", "counter", "{currency}",
    "Cost of the priced tokens per model and tenant, from processors.llm_metrics.cost.prices (per million "
    "tokens) in the configured currency (the currency label: one per configuration).",
    ("model_name", "tenant", "currency"))
UNPRICED_TOKENS = AccountingSpec(
    "otel_llm_unpriced_tokens", "counter", "{token}",
    "Tokens of a model and token_type without a configured price: counted, never priced.",
    ("model_name", "tenant", "token_type"))
SLO_REQUESTS = AccountingSpec(
    "otel_llm_slo_requests", "counter", "{request}",
    "Server-side requests of a model with objectives (processors.llm_metrics.slo) by slo=met (every "
    "objective met: value <= threshold), missed (one exceeded, or the request failed) or unmeasured (no "
    "objective exceeded but a configured quantity was not reported).",
    ("model_name", "engine_kind", "slo"))
SLO_TARGET = AccountingSpec(
    "otel_llm_slo_target_ratio", "gauge", "1",
    "The configured attainment target (slo.*.target) of each model with SLO requests counted: the "
    "alert LLMSloAttainmentBelowTarget compares met / (met + missed) against it.",
    ("model_name",))
ACCOUNTING_METRICS = (TENANT_TOKENS, REQUEST_COST, UNPRICED_TOKENS, SLO_REQUESTS, SLO_TARGET)
# Prefix-cache, speculative-decoding and LoRA accounting per request (issue 26, items 1-3). Every value is
# None (nothing observed) unless the request's spans reported it: no zero is made up for a span that is silent.

# Share of a request's prompt read from a cache: tenths, plus the two ends a prefix cache often lands on
# (nothing shared, a full repeat) kept apart from their neighbours.
CACHE_HIT_RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99, 1.0)
# Mean tokens per verify step including the bonus token: 1 (nothing accepted) to num_spec_tokens + 1;
# num_speculative_tokens above 15 is rare (vLLM's EAGLE/MTP examples use 1-7).
SPEC_ACCEPTANCE_LENGTH_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0)


# Prompt tokens prefilled by the engine, for a request whose cache reads were reported (vLLM's
# ``num_prompt_tokens - num_cached_tokens``, v1/metrics/loggers.py:1312 @ 0.32.0).
_COMPUTED_PROMPT_TOKENS = Difference("prompt_tokens", "cached_tokens")
_CACHE_HIT_RATIO = Ratio("cached_tokens", "prompt_tokens")
# vLLM's per-request ``mean_acceptance_length``: 1 + accepted draft tokens / verify steps
# (RequestSpecDecodeMetrics.to_dict, v1/metrics/stats.py @ 0.32.0); none for a request without steps.
_ACCEPTANCE_LENGTH = Ratio("spec_accepted_tokens", "spec_steps", offset=1.0)


def vllm_cache_naming(max_model_len: int, max_model_len_by_model: dict[str, int] | None = None) -> Naming:
    """vLLM's own names for what spans now carry per request: its cached-prompt-token counter, its
    per-request computed-prefill histogram (v1/metrics/loggers.py:773, 1021 @ 0.32.0) and its
    speculative-decoding counters (v1/spec_decode/metrics.py:229-231). Switched with the ``vllm`` naming."""
    tokens = tokens_buckets(max_model_len)
    per_model = tuple((model, tokens_buckets(length)) for model, length in sorted((max_model_len_by_model or {}).items()))
    return Naming(
        key="vllm",
        label_names=("model_name", "engine_kind", "service_name"),
        labels=Fields("model", "engine_kind", "service_name"),
        histograms=(
            HistogramSpec("vllm:request_prefill_kv_computed_tokens", "{token}",
                          "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
                          tokens, _COMPUTED_PROMPT_TOKENS, buckets_by_model=per_model),
        ),
        counters=(
            CounterSpec("vllm:prompt_tokens_cached", "{token}", "Number of cached prompt tokens (local + external).",
                        Field("cached_tokens")),
            CounterSpec("vllm:spec_decode_num_drafts", "{step}", "Number of spec decoding drafts.",
                        Field("spec_steps")),
            CounterSpec("vllm:spec_decode_num_draft_tokens", "{token}", "Number of draft tokens.",
                        Field("spec_draft_tokens")),
            CounterSpec("vllm:spec_decode_num_accepted_tokens", "{token}", "Number of accepted tokens.",
                        Field("spec_accepted_tokens")),
        ),
    )


def own_cache_naming() -> Naming:
    """The product's per-request cache and speculative-decoding metrics, whatever namings are on: the
    GenAI conventions have no server-side cache or acceptance metric (v1.41.0; the standalone v0.1.0's
    ``gen_ai.client.inference.usage.cache_*`` counters are client-side, with the version switch)."""
    return Naming(
        key="otel_llm",
        label_names=("model_name", "engine_kind", "service_name"),
        labels=Fields("model", "engine_kind", "service_name"),
        histograms=(
            HistogramSpec("otel_llm_request_prefix_cache_hit_ratio", "1",
                          "Per request: prompt tokens read from a cache / prompt tokens, for requests whose spans "
                          "report cache reads.",
                          CACHE_HIT_RATIO_BUCKETS, _CACHE_HIT_RATIO),
            HistogramSpec("otel_llm_request_spec_decode_acceptance_length", "{token}",
                          "Per request: 1 + accepted draft tokens / verify steps (vLLM's mean_acceptance_length, "
                          "bonus token included); one observation per request, whatever its length.",
                          SPEC_ACCEPTANCE_LENGTH_BUCKETS, _ACCEPTANCE_LENGTH),
        ),
        counters=(
            CounterSpec("otel_llm_prompt_tokens_cached", "{token}",
                        "Prompt tokens read from a cache, of requests whose spans report cache reads.",
                        Field("cached_tokens")),
            CounterSpec("otel_llm_prompt_tokens_computed", "{token}",
                        "Prompt tokens prefilled (prompt minus cached), of requests whose spans report cache reads.",
                        _COMPUTED_PROMPT_TOKENS),
            CounterSpec("otel_llm_prompt_tokens_cache_write", "{token}",
                        "Prompt tokens written to a cache (semconv cache_creation / cache_write), where reported.",
                        Field("cache_write_tokens")),
        ),
    )


def adapter_naming() -> Naming:
    """Requests and tokens per LoRA adapter: only requests that name a configured adapter, so the
    existing families keep their labels. ``model_name`` is the adapter's configured base model."""
    return Naming(
        key="otel_llm",
        label_names=("model_name", "adapter", "engine_kind", "service_name"),
        labels=Fields("lora_base_model", "lora_adapter", "engine_kind", "service_name"),
        histograms=(),
        counters=(
            CounterSpec("otel_llm_adapter_requests", "{request}", "Requests that named a LoRA adapter, by finished reason.",
                        IfSet("lora_adapter", Constant(1)), by_outcome=True),
            CounterSpec("otel_llm_adapter_prompt_tokens", "{token}", "Prompt tokens of requests that named a LoRA adapter.",
                        IfSet("lora_adapter", Field("prompt_tokens"))),
            CounterSpec("otel_llm_adapter_generation_tokens", "{token}",
                        "Generated tokens of requests that named a LoRA adapter.",
                        IfSet("lora_adapter", Field("completion_tokens"))),
        ),
    )
