"""Span emitters that reproduce what real inference engines send, through the real OpenTelemetry SDK.

Every emitter takes explicit wall-clock timestamps (spans are synthesized after the fact, nothing
sleeps) and is deterministic given its inputs plus the provider's id generator seed. The shapes
follow ``shared/research/engine-spans.md`` (sections noted per emitter) and DESIGN.md §3-§4:

- ``emit_vllm_v1``  vLLM 0.33 ``OutputProcessor.do_tracing`` (research 1.1, 1.2)
- ``emit_vllm_v0``  vLLM <= 0.10 ``LLMEngine.create_trace_span`` (research 1.3)
- ``emit_sglang``   SGLang 0.5.23 ``TraceReqContext`` root/thread/stage spans (research 3.1)
- ``emit_tgi``      TGI router ``tracing`` spans via tracing-opentelemetry (research 4.1, 4.2)
- ``emit_gateway``  an OTel-instrumented HTTP gateway (Envoy AI Gateway style)

The callers in front of them (an openai-v2 instrumented application, a LiteLLM proxy) are in
``clients``; ``engine_tracer_provider`` builds their providers too (kinds ``app``, ``litellm-proxy``).

Use ``engine_tracer_provider`` to get a ``TracerProvider`` whose resource and id generator match
the engine; the emitters then pick the engine's instrumentation scope themselves.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.version import __version__ as _SDK_VERSION
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

__all__ = [
    "ENGINE_KINDS",
    "GATEWAY_SCOPE",
    "SGLANG_SCOPE",
    "TGI_SCOPE",
    "TGI_SCOPE_VERSION",
    "VLLM_DEFAULT_SERVICE_NAME",
    "VLLM_V0_SCOPE",
    "VLLM_V1_SCOPE",
    "RequestTiming",
    "SamplingParams",
    "SGLangIdGenerator",
    "SeededIdGenerator",
    "emit_gateway",
    "emit_sglang",
    "emit_tgi",
    "emit_vllm_v0",
    "emit_vllm_v1",
    "emit_vllm_next",
    "emit_triton",
    "emit_trtllm_serve",
    "emit_dynamo",
    "emit_llmd",
    "dynamo_end_unix_ns",
    "llmd_end_unix_ns",
    "engine_tracer_provider",
    "rust_duration_debug",
    "rust_duration_debug_ns",
]

# ---------------------------------------------------------------------------------------------
# Names the engines use (research doc section in brackets).
# ---------------------------------------------------------------------------------------------

ENGINE_KINDS: Final = frozenset({"vllm-v1", "vllm-v0", "sglang", "tgi", "gateway", "app", "litellm-proxy",
                                 "triton", "trtllm", "dynamo", "llm-d"})

VLLM_SPAN_NAME: Final = "llm_request"
VLLM_V1_SCOPE: Final = "vllm.tracing.otel"  # [1.2] trace.get_tracer(__name__) in v0.33
VLLM_V0_SCOPE: Final = "vllm.llm_engine"  # [1.2] init_tracer("vllm.llm_engine", ...) in <= 0.11
# sglang/srt/observability/trace.py: tracer = trace.get_tracer("sglang server")
SGLANG_SCOPE: Final = "sglang server"
# TGI's opentelemetry-otlp 0.13 `install_batch` names its tracer after the crate. UNVERIFIED: read
# from the crate's conventions, not from a captured TGI export.
TGI_SCOPE: Final = "opentelemetry-otlp"
TGI_SCOPE_VERSION: Final = "0.13.0"
GATEWAY_SCOPE: Final = "llm-gateway"

# The Python SDK's Resource.create() fallback is "unknown_service:<basename(sys.executable)>"
# (SDK 1.45, see opentelemetry/sdk/resources Resource.create); DESIGN/research call it
# "unknown_service". We pin the interpreter part to "python" so output does not depend on the
# machine running the simulation.
VLLM_DEFAULT_SERVICE_NAME: Final = "unknown_service:python"
_DEFAULT_SERVICE_NAMES: Final[dict[str, str]] = {
    "vllm-v1": VLLM_DEFAULT_SERVICE_NAME,
    "vllm-v0": VLLM_DEFAULT_SERVICE_NAME,
    "sglang": "sglang",
    "tgi": "text-generation-inference.router",
    "gateway": "llm-gateway",
    "app": "chat-app",  # an application using the openai client (``clients.emit_app_client``)
    "litellm-proxy": "litellm-proxy",  # ``clients.emit_litellm_proxy``
    # Issue 14 (tests/testdata/engines/FACTS.md): Triton's default (tracer.cc:506), the rest per component.
    "triton": "triton-inference-server",
    "trtllm": "trtllm-serve",
    "dynamo": "dynamo-frontend",
    "llm-d": "llm-d-epp",
}
TRITON_SCOPE: Final = "triton-server"  # server tracer.h:83
TRTLLM_SCOPE: Final = "trt.llm"  # [PR NVIDIA/TensorRT-LLM#5897]
DYNAMO_SCOPE: Final = "dynamo"
LLMD_EPP_SCOPE: Final = "llm-d-router/pkg/epp/handlers"
LLMD_SIDECAR_SCOPE: Final = "llm-d-router/pkg/sidecar/proxy"

# SGLang's host_id is /etc/machine-id (32 hex chars); a fixed value keeps simulations reproducible.
SGLANG_DEFAULT_HOST_ID: Final = "5e1f0c0ffee04b1d9a7c3d2e1f0a9b8c"

_TRACE_HEADERS: Final = ("traceparent", "tracestate")
_PROPAGATOR: Final = TraceContextTextMapPropagator()

# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def _ns(seconds: float) -> int:
    """Seconds -> integer nanoseconds, the unit every OTel timestamp uses."""
    return round(seconds * 1e9)


@dataclass(frozen=True)
class RequestTiming:
    """One request's life on an engine, in the segment model of DESIGN §4.

    ``preprocess -> queue -> prefill (first token) -> decode -> postprocess``. No validation here on
    purpose: end-to-end tests feed negative/NaN values to exercise the malformed-span path.
    """

    arrival_unix_ns: int  # wall-clock arrival = engine span start
    preprocess_s: float  # API server / tokenization before the engine queue (>= 0)
    queue_s: float
    prefill_s: float
    decode_s: float
    postprocess_s: float = 0.0
    prompt_tokens: int = 100
    completion_tokens: int = 50

    @property
    def ttft_s(self) -> float:
        return self.preprocess_s + self.queue_s + self.prefill_s

    @property
    def e2e_s(self) -> float:
        return self.ttft_s + self.decode_s + self.postprocess_s

    @property
    def inference_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def end_unix_ns(self) -> int:
        return self.arrival_unix_ns + _ns(self.e2e_s)


@dataclass(frozen=True)
class SamplingParams:
    """Request parameters. vLLM V1 and SGLang set each ``gen_ai.request.*`` only when truthy."""

    max_tokens: int | None = 256
    top_p: float | None = 1.0
    temperature: float | None = 0.7
    n: int | None = 1
    top_k: int | None = None  # only SGLang reports it


# ---------------------------------------------------------------------------------------------
# Providers, resources, id generators
# ---------------------------------------------------------------------------------------------


def _nonzero_bits(rng: random.Random, bits: int) -> int:
    # 0 is the "invalid" id in OTel; the SDK would emit an invalid span context for it.
    while True:
        value = rng.getrandbits(bits)
        if value:
            return value


class SGLangIdGenerator(IdGenerator):
    """SGLang's ``TraceCustomIdGenerator``: 64-bit random trace *and* span ids.

    New SGLang traces therefore have the upper 64 bits of the trace id zero. Seedable so a
    simulation replays with identical ids (SGLang itself seeds from ``time.time()``).
    """

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def generate_trace_id(self) -> int:
        return _nonzero_bits(self._rng, 64)

    def generate_span_id(self) -> int:
        return _nonzero_bits(self._rng, 64)


class SeededIdGenerator(IdGenerator):
    """The SDK's id shape (128-bit trace, 64-bit span ids) from a seedable PRNG, for replayable runs."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def generate_trace_id(self) -> int:
        return _nonzero_bits(self._rng, 128)

    def generate_span_id(self) -> int:
        return _nonzero_bits(self._rng, 64)


def _python_sdk_resource(kind: str, service_name: str, process_id: int, extra: Mapping[str, AttributeValue]) -> Resource:
    """What ``Resource.create(extra)`` yields in a Python engine, minus the environment.

    Resource.create merges the SDK's telemetry.sdk.* attributes and a per-process random
    ``service.instance.id`` (SDK 1.45). We build that shape directly instead of calling it so
    OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES on the test machine cannot leak in, and derive the
    instance id from (kind, pid) so it is stable across runs.
    """
    attributes: dict[str, AttributeValue] = {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": _SDK_VERSION,
        "service.instance.id": str(uuid.uuid5(uuid.NAMESPACE_OID, f"otel-llm-sim/{kind}/{process_id}")),
        "service.name": service_name,
    }
    attributes.update(extra)
    return Resource(attributes)


def engine_tracer_provider(
    kind: str,
    exporter: SpanExporter,
    *,
    service_name: str | None = None,
    process_id: int = 4242,
    simple: bool = True,
    seed: int | None = None,
) -> TracerProvider:
    """A TracerProvider configured like engine ``kind``'s own (resource, id generator), exporting to ``exporter``.

    ``simple=True`` uses SimpleSpanProcessor (each span exported as it ends: what unit tests want);
    ``False`` uses BatchSpanProcessor like every real engine. ``seed`` makes the ids reproducible;
    without it ids are random (the SDK's RandomIdGenerator, or SGLang's 64-bit generator).
    """
    if kind not in ENGINE_KINDS:
        raise ValueError(f"unknown engine kind {kind!r}; expected one of {sorted(ENGINE_KINDS)}")
    name = service_name or _DEFAULT_SERVICE_NAMES[kind]

    resource: Resource
    if kind == "vllm-v1":
        # vLLM 0.33 tracing/otel.py: Resource.create({vllm.instrumenting_module_name, vllm.process_id}).
        resource = _python_sdk_resource(
            kind, name, process_id, {"vllm.instrumenting_module_name": "vllm.llm_engine", "vllm.process_id": process_id}
        )
    elif kind == "vllm-v0":
        # vLLM <= 0.11 init_tracer: a bare TracerProvider(), i.e. the SDK default resource only.
        resource = _python_sdk_resource(kind, name, process_id, {})
    elif kind == "sglang":
        # process_tracing_init: Resource.create({SERVICE_NAME: server_name}).
        resource = _python_sdk_resource(kind, name, process_id, {})
    elif kind == "triton":
        # A C++ SDK resource: service.name (default triton-inference-server) and the SDK's own keys.
        resource = Resource({"service.name": name, "telemetry.sdk.language": "cpp",
                             "telemetry.sdk.name": "opentelemetry"})
    elif kind in ("dynamo", "llm-d"):
        # Rust (Dynamo) and Go (llm-d) SDKs: service.name from OTEL_SERVICE_NAME per component.
        resource = Resource({"service.name": name})
    elif kind == "tgi":
        # router/src/logging.rs: Resource::new([KeyValue::new("service.name", ...)]) and nothing else.
        resource = Resource({"service.name": name})
    elif kind == "litellm-proxy":
        # LiteLLM's OpenTelemetry logger adds these two (capture litellm_proxy_v1, litellm 1.110.2).
        resource = _python_sdk_resource(
            kind, name, process_id, {"deployment.environment": "production", "model_id": name})
    else:  # gateway, app: the SDK default resource (capture openai_v2_httpx for the app)
        resource = _python_sdk_resource(kind, name, process_id, {})

    id_generator: IdGenerator
    if kind == "sglang":
        id_generator = SGLangIdGenerator(seed)
    elif seed is not None:
        id_generator = SeededIdGenerator(seed)
    else:
        id_generator = RandomIdGenerator()

    provider = TracerProvider(resource=resource, id_generator=id_generator)
    processor = SimpleSpanProcessor(exporter) if simple else BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return provider


def _parent_context(headers: Mapping[str, str] | None, keep: tuple[str, ...] = _TRACE_HEADERS) -> Context:
    """The engine's parent context from incoming HTTP headers, or an empty one for a new root.

    Always an explicit ``Context()``: with ``None`` the SDK would fall back to the *current*
    context, and in a simulation that is the gateway span that is calling us, a parent the real
    engine process could never see.
    """
    if not headers:
        return Context()
    carrier = {key.lower(): value for key, value in headers.items() if key.lower() in keep}
    return _PROPAGATOR.extract(carrier, context=Context())


def _truthy_params(params: SamplingParams, *, include_top_k: bool) -> dict[str, AttributeValue]:
    """``gen_ai.request.*`` as vLLM V1 / SGLang set them: only when the value is truthy."""
    out: dict[str, AttributeValue] = {}
    if params.max_tokens:
        out["gen_ai.request.max_tokens"] = params.max_tokens
    if params.top_p:
        out["gen_ai.request.top_p"] = params.top_p
    if params.temperature:
        out["gen_ai.request.temperature"] = params.temperature
    if include_top_k and params.top_k:
        out["gen_ai.request.top_k"] = params.top_k
    if params.n:
        out["gen_ai.request.n"] = params.n
    return out


# ---------------------------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------------------------


def emit_vllm_v1(
    provider: TracerProvider,
    timing: RequestTiming,
    *,
    request_id: str,
    params: SamplingParams = SamplingParams(),
    traceparent_headers: dict[str, str] | None = None,
) -> SpanContext:
    """vLLM 0.33 ``OutputProcessor.do_tracing``: one childless SERVER span ``llm_request`` per finished request.

    No model name, no finish reason, no events (research 1.1/1.2).
    """
    tracer = provider.get_tracer(VLLM_V1_SCOPE)
    attributes: dict[str, AttributeValue] = {
        "gen_ai.latency.time_to_first_token": float(timing.ttft_s),
        "gen_ai.latency.e2e": float(timing.e2e_s),
        "gen_ai.latency.time_in_queue": float(timing.queue_s),
        "gen_ai.usage.prompt_tokens": int(timing.prompt_tokens),
        "gen_ai.usage.completion_tokens": int(timing.completion_tokens),
        "gen_ai.latency.time_in_model_prefill": float(timing.prefill_s),
        "gen_ai.latency.time_in_model_decode": float(timing.decode_s),
        "gen_ai.latency.time_in_model_inference": float(timing.inference_s),
        "gen_ai.request.id": request_id,
    }
    attributes.update(_truthy_params(params, include_top_k=False))
    span = tracer.start_span(
        VLLM_SPAN_NAME,
        context=_parent_context(traceparent_headers),
        kind=SpanKind.SERVER,
        attributes=attributes,
        start_time=timing.arrival_unix_ns,
    )
    # vLLM ends the span "now", when the last output is processed: arrival + e2e.
    span.end(end_time=timing.end_unix_ns)
    return span.get_span_context()


def emit_vllm_v0(
    provider: TracerProvider,
    timing: RequestTiming,
    *,
    request_id: str,
    model: str,
    params: SamplingParams = SamplingParams(),
    traceparent_headers: dict[str, str] | None = None,
    model_forward_s: float | None = None,
    model_execute_s: float | None = None,
) -> SpanContext:
    """vLLM <= 0.10 ``LLMEngine.create_trace_span`` (research 1.3).

    Request params are set unconditionally (a real V0 SamplingParams never holds None; we skip
    None only because the SDK would drop it with a warning anyway). ``model_forward_s`` /
    ``model_execute_s`` model ``--collect-detailed-traces``.
    """
    tracer = provider.get_tracer(VLLM_V0_SCOPE)
    attributes: dict[str, AttributeValue] = {
        "gen_ai.response.model": model,
        "gen_ai.request.id": request_id,
    }
    for key, value in (
        ("gen_ai.request.temperature", params.temperature),
        ("gen_ai.request.top_p", params.top_p),
        ("gen_ai.request.max_tokens", params.max_tokens),
        ("gen_ai.request.n", params.n),
    ):
        if value is not None:
            attributes[key] = value
    attributes.update(
        {
            # seq_group.num_seqs(): one sequence per requested completion.
            "gen_ai.usage.num_sequences": int(params.n or 1),
            "gen_ai.usage.prompt_tokens": int(timing.prompt_tokens),
            "gen_ai.usage.completion_tokens": int(timing.completion_tokens),
            "gen_ai.latency.time_in_queue": float(timing.queue_s),
            "gen_ai.latency.time_to_first_token": float(timing.ttft_s),
            "gen_ai.latency.e2e": float(timing.e2e_s),
            "gen_ai.latency.time_in_scheduler": float(timing.queue_s),
        }
    )
    if model_forward_s is not None:
        attributes["gen_ai.latency.time_in_model_forward"] = float(model_forward_s)
    if model_execute_s is not None:
        attributes["gen_ai.latency.time_in_model_execute"] = float(model_execute_s)
    span = tracer.start_span(
        VLLM_SPAN_NAME,
        context=_parent_context(traceparent_headers),
        kind=SpanKind.SERVER,
        attributes=attributes,
        start_time=timing.arrival_unix_ns,
    )
    span.end(end_time=timing.end_unix_ns)
    return span.get_span_context()


# ---------------------------------------------------------------------------------------------
# SGLang
# ---------------------------------------------------------------------------------------------


def _sglang_thread_name(label: str, pid: int, host_id: str, tp_rank: int | None = None) -> str:
    # TraceReqContext.__create_thread_context: label, then " [TP n] " only when the rank is set,
    # then "(host:<8 hex> | pid:N)". The Tokenizer has no ranks, hence "Tokenizer(host:...".
    name = label
    if tp_rank is not None:
        name += f" [TP {tp_rank}] "
    return name + f"(host:{host_id[:8]} | pid:{pid})"


def emit_sglang(
    provider: TracerProvider,
    timing: RequestTiming,
    *,
    rid: str,
    model: str,
    finish_reason: str = "stop",
    role: str = "",
    params: SamplingParams = SamplingParams(),
    traceparent_headers: dict[str, str] | None = None,
    aborted: bool = False,
    cached_tokens: int = 0,
    host_id: str = SGLANG_DEFAULT_HOST_ID,
    tokenizer_pid: int = 4242,
    scheduler_pid: int = 4243,
    tp_rank: int = 0,
    abort_message: str = "Abort requested by client",
) -> SpanContext:
    """SGLang 0.5.23 request trace (research 3.1): root -> thread spans -> stage spans, all INTERNAL.

    Timeline (wall clock): created=arrival; tokenize ends at +preprocess (dispatch to scheduler);
    prefill_waiting until dispatch_finish (+queue); prefill_forward until the first token
    (+prefill); decode_loop for decode_s; the root ends at finished = arrival + e2e. So the root's
    latencies are ttft=ttft_s, e2e=e2e_s, decode=decode_s+postprocess_s, and, as SGLang measures them
    from the hand-off to the scheduler (the end of tokenize), prefill=queue_s+prefill_s and
    inference=queue_s+prefill_s+decode_s+postprocess_s: otel-llm reads queue and prefill from the stages.

    ``aborted=True``: finish reason "abort" on the root; the Scheduler thread span gets status ERROR
    plus ``FINISH_ABORT.to_json()`` fields (``type``, ``message``), as ``TraceReqContext.abort`` does.
    ``role`` "" (unified), "prefill" or "decode" becomes the root name's prefix.
    """
    tracer = provider.get_tracer(SGLANG_SCOPE)
    created = timing.arrival_unix_ns
    dispatch_start = created + _ns(timing.preprocess_s)
    dispatch_finish = created + _ns(timing.preprocess_s + timing.queue_s)
    first_token = created + _ns(timing.ttft_s)
    decode_end = first_token + _ns(timing.decode_s)
    finished = timing.end_unix_ns

    # trace_req_start: MultiTokenizer prefixes "<worker>_"; SGLang drops it for name and rid attr.
    orig_rid = rid.split("_")[-1]
    root = tracer.start_span(
        f"{role} Req {orig_rid[:8]}",
        context=_parent_context(traceparent_headers),
        kind=SpanKind.INTERNAL,
        attributes={"rid": orig_rid, "module": "sglang::request"},
        start_time=created,
    )
    root_ctx = trace.set_span_in_context(root, Context())

    def thread_span(label: str, pid: int, start: int, rank: int | None) -> trace.Span:
        attrs: dict[str, AttributeValue] = {}
        if rank is not None:
            attrs["tp_rank"] = rank
        attrs.update({"host_id": host_id, "pid": pid, "thread_label": label})
        return tracer.start_span(
            _sglang_thread_name(label, pid, host_id, rank), context=root_ctx, start_time=start, attributes=attrs
        )

    def stage(name: str, parent: trace.Span, start: int, end: int, prev: SpanContext | None) -> SpanContext:
        # Top-level stages are chained: each links to the previous one (trace_slice_start).
        links = [Link(prev)] if prev is not None else None
        span = tracer.start_span(
            name, context=trace.set_span_in_context(parent, Context()), start_time=start, links=links
        )
        span.end(end_time=end)
        return span.get_span_context()

    tokenizer = thread_span("Tokenizer", tokenizer_pid, created, None)
    last = stage("tokenize", tokenizer, created, dispatch_start, None)

    # The scheduler's copy of the request context carries last_span_context across processes,
    # so its first stage still links to the tokenizer's "tokenize".
    scheduler = thread_span("Scheduler", scheduler_pid, dispatch_start, tp_rank)
    last = stage("prefill_waiting", scheduler, dispatch_start, dispatch_finish, last)
    last = stage("prefill_forward", scheduler, dispatch_finish, first_token, last)
    stage("decode_loop", scheduler, first_token, decode_end, last)
    if aborted:
        scheduler.set_status(Status(StatusCode.ERROR))
        scheduler.set_attributes({"type": "abort", "message": abort_message})
    scheduler.end(end_time=decode_end)

    # trace_req_finish: abort() closes the tokenizer thread span, then the root gets its attrs.
    tokenizer.end(end_time=finished)

    reason = "abort" if aborted else finish_reason
    finish_attrs: dict[str, AttributeValue] = {
        "gen_ai.usage.completion_tokens": int(timing.completion_tokens),
        "gen_ai.usage.prompt_tokens": int(timing.prompt_tokens),
        "gen_ai.usage.cached_tokens": int(cached_tokens),
        "gen_ai.request.id": rid,
    }
    finish_attrs.update(_truthy_params(params, include_top_k=True))
    finish_attrs["gen_ai.response.model"] = model
    if reason:
        finish_attrs["gen_ai.response.finish_reasons"] = json.dumps([reason])
    # RequestTimeStats.convert_to_gen_ai_span_attrs (no time_in_queue although it is declared).
    finish_attrs.update(
        {
            "gen_ai.latency.time_to_first_token": float(timing.ttft_s),
            "gen_ai.latency.e2e": float(timing.e2e_s),
            "gen_ai.latency.time_in_model_decode": float(timing.decode_s + timing.postprocess_s),
            # Measured from the hand-off to the scheduler (the end of tokenization), so both hold the
            # scheduler queue (req_time_stats.py:535-562; tests/testdata/engines/sglang/README.md).
            "gen_ai.latency.time_in_model_inference": float(
                timing.queue_s + timing.prefill_s + timing.decode_s + timing.postprocess_s
            ),
            "gen_ai.latency.time_in_model_prefill": float(timing.queue_s + timing.prefill_s),
        }
    )
    root.set_attributes(finish_attrs)
    root.end(end_time=finished)
    return root.get_span_context()


# ---------------------------------------------------------------------------------------------
# TGI
# ---------------------------------------------------------------------------------------------

_NANOS_PER_SEC: Final = 1_000_000_000
_NANOS_PER_MILLI: Final = 1_000_000
_NANOS_PER_MICRO: Final = 1_000


def rust_duration_debug_ns(nanos: int) -> str:
    """``format!("{:?}", Duration::from_nanos(nanos))``.

    Rust's ``Duration`` Debug picks the largest unit that keeps the integer part non-zero (s, ms,
    µs, else ns) and prints the remainder as decimal digits with trailing zeros dropped. Without an
    explicit precision nothing is rounded: the remainder has at most 9 digits and all are exact.
    """
    if nanos < 0:
        raise ValueError(f"a Rust Duration cannot be negative: {nanos}ns")
    secs, sub = divmod(nanos, _NANOS_PER_SEC)
    if secs > 0:
        integer, frac, width, unit = secs, sub, 9, "s"
    elif sub >= _NANOS_PER_MILLI:
        integer, frac, width, unit = sub // _NANOS_PER_MILLI, sub % _NANOS_PER_MILLI, 6, "ms"
    elif sub >= _NANOS_PER_MICRO:
        integer, frac, width, unit = sub // _NANOS_PER_MICRO, sub % _NANOS_PER_MICRO, 3, "µs"
    else:
        return f"{sub}ns"
    digits = f"{frac:0{width}d}".rstrip("0")
    return f"{integer}.{digits}{unit}" if digits else f"{integer}{unit}"


def rust_duration_debug(seconds: float) -> str:
    """``format!("{:?}", Duration)`` for a duration given in float seconds (rounded to whole ns)."""
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError(f"a Rust Duration must be finite: {seconds}")
    return rust_duration_debug_ns(_ns(seconds))


def _rust_duration_div(nanos: int, rhs: int) -> int:
    """``Duration / u32``: current core::time ``checked_div`` carries both the seconds and the
    nanosecond remainders into the quotient, which makes it exactly ``floor(total_ns / rhs)``."""
    return nanos // rhs


def _rust_f32_debug(value: float) -> str:
    # Rust's float Debug always shows a fractional part ("1.0"), like Python's repr.
    return repr(float(value))


def _opt(value: Any, render: Callable[[Any], str] = str) -> str:
    return "None" if value is None else f"Some({render(value)})"


def _tgi_parameters_debug(params: SamplingParams, max_new_tokens: int | None, seed: int | None) -> str:
    """``format!("{:?}", GenerateParameters)`` in router/src/lib.rs field order.

    TGI has no ``n``; ``top_p`` must be < 1.0 there, so the OpenAI-style 1.0 default maps to None.
    """
    top_p = params.top_p if params.top_p is not None and params.top_p < 1.0 else None
    fields = [
        ("adapter_id", "None"),
        ("best_of", "None"),
        ("temperature", _opt(params.temperature, _rust_f32_debug)),
        ("repetition_penalty", "None"),
        ("frequency_penalty", "None"),
        ("top_k", _opt(params.top_k)),
        ("top_p", _opt(top_p, _rust_f32_debug)),
        ("typical_p", "None"),
        ("do_sample", "true" if params.temperature else "false"),
        ("max_new_tokens", _opt(max_new_tokens)),
        ("return_full_text", "None"),
        ("stop", "[]"),
        ("truncate", "None"),
        ("watermark", "false"),
        ("details", "false"),
        ("decoder_input_details", "false"),
        ("seed", _opt(seed)),
        ("top_n_tokens", "None"),
        ("grammar", "None"),
    ]
    return "GenerateParameters { " + ", ".join(f"{k}: {v}" for k, v in fields) + " }"


TGI_HANDLERS: Final = frozenset({"generate", "generate_stream", "chat_completions", "completions"})


def emit_tgi(
    provider: TracerProvider,
    timing: RequestTiming,
    *,
    handler: str = "generate",
    traceparent_headers: dict[str, str] | None = None,
    success: bool = True,
    params: SamplingParams = SamplingParams(),
    seed: int | None = None,
    stream: bool | None = None,
    decode_steps: int = 3,
    error_message: str = "Request failed during generation: Server error: CUDA out of memory",
) -> SpanContext:
    """TGI router request spans (research 4.1/4.2), all INTERNAL, fields as Strings.

    Tree (non-streaming)::

        <handler> [arrival, arrival+e2e]      fields total_time.. only on success
          generate (infer/mod.rs)             no fields; same name as the handler on /generate!
            generate_stream (infer/mod.rs)
              validate      [arrival, queued]            queued = arrival + preprocess
              schedule      [queued, inference end]
                queued      [queued, batch start]        batch start = queued + queue
                infer       prefill step, then ``decode_steps`` decode steps splitting decode_s

    Streaming (``handler == "generate_stream"`` or ``stream=True``) drops the inner ``generate``.
    Only ``traceparent`` is honoured (TGI's middleware parses nothing else). Batch spans
    (``batch``/``prefill``/``decode`` and the shard's gRPC spans) live in other traces and are not
    emitted. No token counts anywhere, as in TGI.
    """
    if handler not in TGI_HANDLERS:
        raise ValueError(f"unknown TGI handler {handler!r}; expected one of {sorted(TGI_HANDLERS)}")
    streaming = handler == "generate_stream" if stream is None else stream
    tracer = provider.get_tracer(TGI_SCOPE, TGI_SCOPE_VERSION)

    start = timing.arrival_unix_ns
    validation_ns = _ns(timing.preprocess_s)
    queue_ns = _ns(timing.queue_s)
    prefill_ns = _ns(timing.prefill_s)
    decode_ns = _ns(timing.decode_s)
    queued = start + validation_ns
    batch_start = queued + queue_ns
    inference_end = batch_start + prefill_ns + decode_ns
    end = max(timing.end_unix_ns, inference_end)  # rounding must never end the handler first

    attrs: dict[str, AttributeValue] = {}
    if handler != "completions":
        # `fields(parameters = ?req.parameters)` is recorded when the span is created.
        attrs["parameters"] = _tgi_parameters_debug(params, params.max_tokens, seed)
    root = tracer.start_span(
        handler,
        context=_parent_context(traceparent_headers, keep=("traceparent",)),
        kind=SpanKind.INTERNAL,
        attributes=attrs,
        start_time=start,
    )

    def child(name: str, parent: trace.Span, s: int, e: int | None = None) -> trace.Span:
        span = tracer.start_span(name, context=trace.set_span_in_context(parent, Context()), start_time=s)
        if e is not None:
            span.end(end_time=e)
        return span

    outer = root
    if not streaming:
        outer = child("generate", root, start)
    gen_stream = child("generate_stream", outer, start)
    child("validate", gen_stream, start, queued)
    schedule = child("schedule", gen_stream, queued)
    child("queued", schedule, queued, batch_start)
    child("infer", schedule, batch_start, batch_start + prefill_ns)
    steps = max(0, min(decode_steps, timing.completion_tokens - 1)) if decode_ns > 0 else 0
    step_start = batch_start + prefill_ns
    for i in range(steps):
        # Even split of the decode interval; the last step absorbs the integer remainder.
        step_end = step_start + decode_ns // steps if i < steps - 1 else inference_end
        child("infer", schedule, step_start, step_end)
        step_start = step_end
    # tracing-subscriber keeps a parent open until its children close: schedule, then its parents.
    schedule.end(end_time=inference_end)
    gen_stream.end(end_time=inference_end)
    if outer is not root:
        outer.end(end_time=inference_end)

    if success:
        inference_ns = prefill_ns + decode_ns
        # generated_tokens is >= 1 on any successful TGI response; guard the Rust panic path anyway.
        tokens = max(1, int(timing.completion_tokens))
        root.set_attributes(
            {
                "total_time": rust_duration_debug_ns(end - start),
                "validation_time": rust_duration_debug_ns(validation_ns),
                "queue_time": rust_duration_debug_ns(queue_ns),
                "inference_time": rust_duration_debug_ns(inference_ns),
                "time_per_token": rust_duration_debug_ns(_rust_duration_div(inference_ns, tokens)),
                "seed": _opt(seed),
            }
        )
    else:
        # tracing-opentelemetry turns the handler's `tracing::error!` into an event and ERROR status.
        root.add_event(error_message, attributes={"level": "ERROR", "target": "text_generation_router::server"}, timestamp=end)
        root.set_status(Status(StatusCode.ERROR, error_message))
    root.end(end_time=end)
    return root.get_span_context()


# ---------------------------------------------------------------------------------------------
# Gateway
# ---------------------------------------------------------------------------------------------


def _operation_for_route(route: str) -> str:
    if route.endswith("/chat/completions"):
        return "chat"
    if route.endswith("/completions"):
        return "text_completion"
    if route.endswith("/embeddings"):
        return "embeddings"
    return "chat"


def emit_gateway(
    provider: TracerProvider,
    *,
    start_unix_ns: int,
    end_unix_ns: int,
    model: str,
    route: str = "/v1/chat/completions",
    engine_call: Callable[[dict[str, str]], object] | None = None,
    status_error: bool = False,
    ttft_s: float | None = None,
    server_address: str = "llm-gateway",
    server_port: int = 4000,
    traceparent_headers: dict[str, str] | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> SpanContext:
    """A generic gateway's SERVER span ``POST <route>`` (Envoy AI Gateway style; LiteLLM's real proxy
    shape is ``clients.emit_litellm_proxy``). ``attributes`` are added to the span's own (e.g. a
    request header the gateway records, ``http.request.header.x_tenant_id``).

    ``engine_call(headers)`` runs while the gateway span is current and before it ends, with the
    W3C ``traceparent`` (and ``tracestate`` if any) injected for the gateway span: that is how the
    engine learns its parent. The span ends at ``end_unix_ns`` after ``engine_call`` returns, so the
    engine span is exported first, as behind a real proxy; the caller picks ``end_unix_ns`` >= the
    engine's end. No ``gen_ai.provider.name``: a gateway in front of vLLM usually doesn't know it.
    """
    tracer = provider.get_tracer(GATEWAY_SCOPE)
    status_code = 500 if status_error else 200
    span_attributes: dict[str, AttributeValue] = {
        "http.request.method": "POST",
        "http.route": route,
        "url.path": route,
        "url.scheme": "http",
        "http.response.status_code": status_code,
        "server.address": server_address,
        "server.port": server_port,
        "gen_ai.operation.name": _operation_for_route(route),
        "gen_ai.request.model": model,
    }
    if ttft_s is not None:
        span_attributes["gen_ai.server.time_to_first_token"] = float(ttft_s)
    if status_error:
        span_attributes["error.type"] = str(status_code)  # HTTP semconv: the status code for 5xx
    span = tracer.start_span(
        f"POST {route}",
        context=_parent_context(traceparent_headers),
        kind=SpanKind.SERVER,
        attributes={**span_attributes, **(attributes or {})},
        start_time=start_unix_ns,
    )
    try:
        if engine_call is not None:
            headers: dict[str, str] = {}
            _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span, Context()))
            with trace.use_span(span, end_on_exit=False):
                engine_call(headers)
        if status_error:
            span.set_status(Status(StatusCode.ERROR))
    finally:
        # Even if engine_call raises (use_span then marks the span ERROR), never leak an open span.
        span.end(end_time=end_unix_ns)
    return span.get_span_context()


# ---------------------------------------------------------------------------------------------
# Issue 14: the shapes of tests/support/engine_fixtures.py (each fact cited there and in FACTS.md)
# ---------------------------------------------------------------------------------------------

VLLM_EVENT_LIMIT: Final = 128  # the SDK's default span event limit


def emit_vllm_next(
    provider: TracerProvider,
    timing: RequestTiming,
    *,
    model: str,
    request_id: str,
    operation: str = "chat",
    cached_tokens: int = 0,
    finish_reason: str = "stop",
    traceparent_headers: dict[str, str] | None = None,
) -> SpanContext:
    """vLLM with its coming span shape: ``"{operation} {model}"`` (vllm#47633), ``input/output_tokens``
    and ``cache_read.input_tokens`` (vllm#40799, #54476), finish reasons as a JSON string, and a
    ``token_scheduled``/``token_generated`` event pair per engine step (vllm#32573): one step per
    output token here, evenly over the decode, the first at the first token; at most 128 events."""
    tracer = provider.get_tracer(VLLM_V1_SCOPE)
    attributes: dict[str, AttributeValue] = {
        "gen_ai.latency.time_to_first_token": float(timing.ttft_s),
        "gen_ai.latency.e2e": float(timing.e2e_s),
        "gen_ai.latency.time_in_queue": float(timing.queue_s),
        "gen_ai.usage.input_tokens": int(timing.prompt_tokens),
        "gen_ai.usage.output_tokens": int(timing.completion_tokens),
        "gen_ai.usage.cache_read.input_tokens": int(cached_tokens),
        "gen_ai.latency.time_in_model_prefill": float(timing.prefill_s),
        "gen_ai.latency.time_in_model_decode": float(timing.decode_s),
        "gen_ai.latency.time_in_model_inference": float(timing.inference_s),
        "gen_ai.request.id": request_id,
        "gen_ai.response.finish_reasons": json.dumps([finish_reason]),
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model,
    }
    span = tracer.start_span(f"{operation} {model}", context=_parent_context(traceparent_headers),
                             kind=SpanKind.SERVER, attributes=attributes, start_time=timing.arrival_unix_ns)
    first = timing.arrival_unix_ns + _ns(timing.ttft_s)
    steps = max(int(timing.completion_tokens) - 1, 0)
    scheduled = timing.arrival_unix_ns + _ns(timing.preprocess_s + timing.queue_s)
    outputs = [first] + [first + _ns(timing.decode_s * (i + 1) / steps) for i in range(steps)]
    total = int(timing.prompt_tokens)
    previous = scheduled
    for number, output in enumerate(outputs):
        if 2 * number + 2 > VLLM_EVENT_LIMIT:
            break  # the SDK drops events past its limit
        total += 1
        span.add_event("token_scheduled", {"iter_batch_size": 4, "iter_waiting_size": 0}, timestamp=previous)
        span.add_event("token_generated", {"new_token_ids": [1000 + number], "iter_waiting_size": 0,
                                           "iter_total_tokens_count": total}, timestamp=output)
        previous = output
    span.end(end_time=timing.end_unix_ns)
    return span.get_span_context()


def emit_triton(
    provider: TracerProvider,
    timing: RequestTiming,
    *,
    model: str = "tensorrt_llm",
    ensemble: str | None = None,
    streaming: bool = True,
) -> SpanContext:
    """Triton in OpenTelemetry mode with a TensorRT-LLM model (server src/tracer.cc @ e1db8a60): a
    SERVER ``InferRequest`` root with gRPC events, a model span with REQUEST_START/QUEUE_START/
    REQUEST_END and its ``compute`` child with COMPUTE_*. The backend reports once, after the final
    response, so compute = executor queue + prefill + decode. ``ensemble``: the model runs as the
    composing step of that ensemble (its span has no compute child), between a ``preprocessing`` and a
    ``postprocessing`` step. Streaming: INFER_RESPONSE_COMPLETE at the first token (gRPC stream)."""
    tracer = provider.get_tracer(TRITON_SCOPE)
    start = timing.arrival_unix_ns
    received = start + _ns(timing.preprocess_s / 2)  # GRPC_WAITREAD_END: the root starts there
    root = tracer.start_span("InferRequest", context=Context(), kind=SpanKind.SERVER, start_time=received)
    root.add_event("GRPC_WAITREAD_START", timestamp=start)
    root.add_event("GRPC_WAITREAD_END", timestamp=received)
    # REQUEST_START and QUEUE_START together (the fixtures' triton_request: the scheduler enqueues the
    # request as it starts, core dynamic_batch_scheduler.cc:194-202); the pre-queue time is the network read.
    request_start = queue_start = start + _ns(timing.preprocess_s)
    compute_start = queue_start + _ns(timing.queue_s)
    compute_end = compute_start + _ns(timing.prefill_s + timing.decode_s)
    end = timing.end_unix_ns
    # Releasing the request, the ensemble's last step and the response's send share the postprocess
    # time, so every span ends by the root's end (a real server never sends before it released them).
    gap = max((end - compute_end) // 4, 1)

    def model_span(name: str, parent: Any, trace_id: int, parent_id: int, begin: int, queued: int) -> Any:
        span = tracer.start_span(name, context=trace.set_span_in_context(parent, Context()), kind=SpanKind.SERVER,
                                 start_time=begin, attributes={"triton.model_name": name, "triton.model_version": 1,
                                                               "triton.trace_id": trace_id,
                                                               "triton.trace_parent_id": parent_id})
        span.add_event("REQUEST_START", timestamp=begin)
        span.add_event("QUEUE_START", timestamp=queued)
        return span

    def compute(parent: Any, begin: int, done: int) -> None:
        span = tracer.start_span("compute", context=trace.set_span_in_context(parent, Context()),
                                 kind=SpanKind.SERVER, start_time=begin)
        edge = min(100_000, max((done - begin) // 4, 0))
        span.add_event("COMPUTE_START", timestamp=begin)
        span.add_event("COMPUTE_INPUT_END", timestamp=begin + edge)
        span.add_event("COMPUTE_OUTPUT_START", timestamp=done - edge)
        span.add_event("COMPUTE_END", timestamp=done)
        span.end(end_time=done)

    def finish(span: Any, done: int) -> None:
        span.add_event("REQUEST_END", timestamp=done)
        span.end(end_time=done)

    if ensemble is None:
        llm = model_span(model, root, 1, 0, request_start, queue_start)
        compute(llm, compute_start, compute_end)
        finish(llm, compute_end + gap)
    else:
        # preprocessing runs inside the network-read-to-queue time, postprocessing after the LLM step.
        top = model_span(ensemble, root, 1, 0, received, received)
        pre_start = received + (request_start - received) // 4
        pre = model_span("preprocessing", top, 2, 1, pre_start, pre_start)
        pre_end = request_start - max((request_start - pre_start) // 4, 1)
        compute(pre, pre_start + (pre_end - pre_start) // 4, pre_end)
        finish(pre, pre_end)
        llm = model_span(model, top, 3, 1, request_start, queue_start)
        compute(llm, compute_start, compute_end)
        finish(llm, compute_end + gap)
        post_end = compute_end + 2 * gap
        post = model_span("postprocessing", top, 4, 1, compute_end + gap, compute_end + gap)
        compute(post, compute_end + gap, post_end)
        finish(post, post_end)
        finish(top, compute_end + 3 * gap)
    first_response = start + _ns(timing.ttft_s) if streaming else compute_end + gap
    root.add_event("INFER_RESPONSE_COMPLETE", timestamp=first_response)
    root.add_event("GRPC_SEND_START", timestamp=end - gap)
    root.add_event("GRPC_SEND_END", timestamp=end)
    root.end(end_time=end)
    return root.get_span_context()


def emit_trtllm_serve(
    provider: TracerProvider,
    timing: RequestTiming,
    *,
    request_id: str,
    finish_reason: str = "stop",
    traceparent_headers: dict[str, str] | None = None,
) -> SpanContext:
    """``trtllm-serve --otlp_traces_endpoint`` (tensorrt_llm/llmapi/tracing.py @ 0fb7f758): vLLM's
    latency keys without its phases; its span name is UNVERIFIED (``llm_request``, as the fixtures).
    Times from the executor's arrival: ttft and e2e hold no API-server time here."""
    tracer = provider.get_tracer(TRTLLM_SCOPE)
    engine_ttft = timing.queue_s + timing.prefill_s
    engine_e2e = engine_ttft + timing.decode_s
    attributes: dict[str, AttributeValue] = {
        "gen_ai.usage.completion_tokens": int(timing.completion_tokens),
        "gen_ai.usage.prompt_tokens": int(timing.prompt_tokens),
        "gen_ai.request.id": request_id,
        "gen_ai.latency.time_to_first_token": float(engine_ttft),
        "gen_ai.latency.e2e": float(engine_e2e),
        "gen_ai.latency.time_in_queue": float(timing.queue_s),
        "gen_ai.response.finish_reasons": [finish_reason],
    }
    begin = timing.arrival_unix_ns + _ns(timing.preprocess_s)
    span = tracer.start_span(VLLM_SPAN_NAME, context=_parent_context(traceparent_headers), kind=SpanKind.SERVER,
                             attributes=attributes, start_time=begin)
    span.end(end_time=begin + _ns(engine_e2e))
    return span.get_span_context()


def dynamo_end_unix_ns(timing: RequestTiming, kv_transfer_s: float) -> int:
    """When ``emit_dynamo``'s ``http-request`` ends: the KV transfer delays the first token and all after it."""
    return timing.arrival_unix_ns + _ns(timing.ttft_s + kv_transfer_s + timing.decode_s + timing.postprocess_s)


def emit_dynamo(
    frontend: TracerProvider,
    prefill_worker: TracerProvider,
    decode_worker: TracerProvider,
    timing: RequestTiming,
    *,
    model: str,
    kv_transfer_s: float = 0.005,
    finish_reason: str = "stop",
) -> SpanContext:
    """A disaggregated Dynamo request (lib/runtime/src/logging.rs @ b4d7ad45): ``http-request`` →
    a ``router.route_request`` per hop → each worker's ``handle_payload`` → ``engine.generate``; the
    decode worker's links to the prefill worker's. ``ttft_ms``/``avg_itl_ms`` in milliseconds."""
    tracer = frontend.get_tracer(DYNAMO_SCOPE)
    start = timing.arrival_unix_ns
    ttft = timing.ttft_s + kv_transfer_s
    end = dynamo_end_unix_ns(timing, kv_transfer_s)
    steps = max(int(timing.completion_tokens) - 1, 1)
    root = tracer.start_span("http-request", context=Context(), kind=SpanKind.INTERNAL, start_time=start, attributes={
        "method": "POST", "uri": "/v1/chat/completions", "version": "HTTP/1.1", "model": model,
        "request.outcome": "success", "input_tokens": int(timing.prompt_tokens),
        "output_tokens": int(timing.completion_tokens), "ttft_ms": ttft * 1000.0,
        "avg_itl_ms": timing.decode_s / steps * 1000.0, "prefill_worker_id": 7001, "decode_worker_id": 7002})
    p_start = start + _ns(timing.preprocess_s)
    p_end = p_start + _ns(timing.queue_s + timing.prefill_s)
    d_start = p_end

    def hop(provider: TracerProvider, begin: int, done: int, role: str, worker_ttft: float, component: str,
            links: list[Link]) -> Any:
        route = tracer.start_span("router.route_request", context=trace.set_span_in_context(root, Context()),
                                  kind=SpanKind.CLIENT, start_time=begin, attributes={
                                      "request.attempt": "0", "migration.is_retry": "false",
                                      "request.outcome": "success"})
        worker = provider.get_tracer(DYNAMO_SCOPE)
        payload = worker.start_span("handle_payload", context=trace.set_span_in_context(route, Context()),
                                    kind=SpanKind.SERVER, start_time=begin, attributes={
                                        "component": component, "endpoint": "generate", "namespace": "dynamo"})
        generate = worker.start_span("engine.generate", context=trace.set_span_in_context(payload, Context()),
                                     kind=SpanKind.INTERNAL, start_time=begin, links=links, attributes={
                                         "disagg_role": role, "model": model,
                                         "input_tokens": int(timing.prompt_tokens),
                                         "output_tokens": int(timing.completion_tokens) if role == "decode" else 1,
                                         "ttft_ms": worker_ttft * 1000.0,
                                         "finish_reason": finish_reason if role == "decode" else "length"})
        for span in (generate, payload, route):
            span.end(end_time=done)
        return generate

    prefill = hop(prefill_worker, p_start, p_end, "prefill", timing.queue_s + timing.prefill_s, "prefill", [])
    hop(decode_worker, d_start, end, "decode", kv_transfer_s, "decode", [Link(prefill.get_span_context())])
    root.end(end_time=end)
    return root.get_span_context()


def _llmd_times(timing: RequestTiming, kv_load_s: float) -> tuple[int, int, int, int, int]:
    """(prefill start, prefill end, decode start, decode end, end) of ``emit_llmd``'s sidecar spans."""
    p_start = timing.arrival_unix_ns + _ns(timing.preprocess_s)
    p_end = p_start + _ns(timing.queue_s + timing.prefill_s + 0.002)
    d_start = p_end + 1_000_000
    d_end = d_start + _ns(kv_load_s + timing.decode_s + 0.002)
    return p_start, p_end, d_start, d_end, d_end + _ns(timing.postprocess_s)


def llmd_end_unix_ns(timing: RequestTiming, kv_load_s: float) -> int:
    """When ``emit_llmd``'s ``gateway.request`` ends."""
    return _llmd_times(timing, kv_load_s)[4]


def emit_llmd(
    epp: TracerProvider,
    sidecar: TracerProvider,
    prefill_pod: TracerProvider,
    decode_pod: TracerProvider,
    timing: RequestTiming,
    *,
    model: str,
    kv_load_s: float = 0.004,
    finish_reason: str = "stop",
) -> SpanContext:
    """A P/D-disaggregated llm-d request (llm-d-router @ ebab6879, nixlv2 sequential): ``gateway.request``
    → ``gateway.request_orchestration`` (``target_model``); the sidecar's otelhttp span →
    ``forward_request`` → ``prefill`` → ``decode`` (a child of prefill) with ``*_ms`` in whole ms; the
    vLLM ``llm_request`` of each pod under an ``HTTP POST`` CLIENT span."""
    gw_tracer, side = epp.get_tracer(LLMD_EPP_SCOPE), sidecar.get_tracer(LLMD_SIDECAR_SCOPE)
    start = timing.arrival_unix_ns
    p_start, p_end, d_start, d_end, end = _llmd_times(timing, kv_load_s)

    def child(tracer: Any, name: str, parent: Any, kind: SpanKind, begin: int, attrs: dict[str, AttributeValue]
              ) -> Any:
        return tracer.start_span(name, context=trace.set_span_in_context(parent, Context()), kind=kind,
                                 start_time=begin, attributes=attrs)

    gateway = gw_tracer.start_span("gateway.request", context=Context(), kind=SpanKind.SERVER, start_time=start)
    orchestration = child(gw_tracer, "gateway.request_orchestration", gateway, SpanKind.SERVER, start,
                          {"target_model": model, "request_prio": 0})
    orchestration.end(end_time=p_start - 100_000)
    handler = child(side, "llm_d.pd_proxy.POST /v1/chat/completions", gateway, SpanKind.SERVER, p_start - 50_000, {})
    forward = child(side, "forward_request", handler, SpanKind.SERVER, p_start - 40_000, {
        "llm_d.pd_proxy.connector": "nixlv2", "llm_d.pd_proxy.disaggregation_used": True,
        "llm_d.pd_proxy.request_path": "/v1/chat/completions"})
    ms = lambda nanos: float(nanos // 1_000_000)  # noqa: E731  (Go's Duration.Milliseconds())
    prefill = child(side, "prefill", forward, SpanKind.INTERNAL, p_start, {
        "llm_d.pd_proxy.connector": "nixlv2", "llm_d.pd_proxy.prefill.status_code": 200,
        "llm_d.pd_proxy.prefill.duration_ms": ms(p_end - p_start)})
    decode = child(side, "decode", prefill, SpanKind.INTERNAL, d_start, {
        "llm_d.pd_proxy.connector": "nixlv2", "llm_d.pd_proxy.decode.duration_ms": ms(d_end - d_start),
        "llm_d.pd_proxy.prefill_duration_ms": ms(p_end - p_start),
        "llm_d.pd_proxy.decode_duration_ms": ms(d_end - d_start),
        "llm_d.pd_proxy.coordinator_overhead_ms": ms(d_start - p_end)})

    def pod(provider: TracerProvider, parent: Any, begin: int, queue_s: float, pod_prefill_s: float,
            pod_decode_s: float, completion: int, reason: str) -> None:
        client = child(side, "HTTP POST", parent, SpanKind.CLIENT, begin, {})
        headers: dict[str, str] = {}
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(client, Context()))
        pod_timing = RequestTiming(arrival_unix_ns=begin + 100_000, preprocess_s=0.001, queue_s=queue_s,
                                   prefill_s=pod_prefill_s, decode_s=pod_decode_s, postprocess_s=0.0005,
                                   prompt_tokens=timing.prompt_tokens, completion_tokens=completion)
        tracer = provider.get_tracer(VLLM_V1_SCOPE)
        span = tracer.start_span(VLLM_SPAN_NAME, context=_parent_context(headers), kind=SpanKind.SERVER,
                                 start_time=pod_timing.arrival_unix_ns, attributes={
                                     "gen_ai.latency.time_to_first_token": float(pod_timing.ttft_s),
                                     "gen_ai.latency.e2e": float(pod_timing.e2e_s),
                                     "gen_ai.latency.time_in_queue": float(queue_s),
                                     "gen_ai.latency.time_in_model_prefill": float(pod_prefill_s),
                                     "gen_ai.latency.time_in_model_decode": float(pod_decode_s),
                                     "gen_ai.latency.time_in_model_inference": float(pod_prefill_s + pod_decode_s),
                                     "gen_ai.usage.prompt_tokens": int(timing.prompt_tokens),
                                     "gen_ai.usage.completion_tokens": int(completion),
                                     "gen_ai.response.finish_reasons": json.dumps([reason])})
        span.end(end_time=pod_timing.end_unix_ns)
        client.end(end_time=pod_timing.end_unix_ns + 100_000)

    pod(prefill_pod, prefill, p_start, timing.queue_s, timing.prefill_s, 0.0, 1, "length")
    pod(decode_pod, decode, d_start, 0.0, kv_load_s, timing.decode_s, int(timing.completion_tokens), finish_reason)
    for span, done in ((decode, d_end), (prefill, p_end), (forward, end - 40_000), (handler, end - 20_000),
                       (gateway, end)):
        span.end(end_time=done)
    return gateway.get_span_context()
