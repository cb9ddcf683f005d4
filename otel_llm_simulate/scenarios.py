"""What the simulator sends: model profiles, scenarios and the pure planning function.

``plan(...)`` turns (scenario, seed, rate, duration, start time, models) into a ``Plan``: every
request with its model, engine, outcome, exact timings, request id and the id-generator seed of
each emitting process. Nothing here touches a clock, a socket or the OTel SDK, so the same inputs
always give the same plan (the runner then produces the same spans with the same ids from it).

The latency model, per model:

- arrivals are a Poisson process at ``rate`` × the scenario's rate multiplier at that moment;
- prompt and output tokens are log-normal around the profile's medians, clipped to
  ``max_tokens`` (output; reaching it is finish reason ``length``) and ``max_model_len``;
- prefill time ∝ prompt tokens (``prefill_tokens_per_s``), decode time ∝ output tokens
  (``tpot_s`` per token), both slowed a little by how busy the engine's batch is;
- queueing is a FIFO c-server queue: the engine has ``slots`` concurrent sequences, provisioned
  so that the *provisioned* rate (default: ``rate``) keeps them ~60 % busy. A burst above that
  builds a real queue that drains at the spare capacity, so TTFT climbs and recovers;
- the window is a slice of an already running fleet (see ``plan``).

Who calls (``_with_caller``, drawn from a per-request generator so the engine side above is the
same with or without it): most requests come from uninstrumented callers through the gateway, as
before; a share comes from an instrumented application tier (openai-v2 CLIENT spans, see
``clients``), which calls vLLM directly, through a LiteLLM proxy, or through the gateway, with the
httpx instrumentation propagating its traceparent; and some SGLang callers have no HTTP
instrumentation, so their CLIENT span sits in a trace of its own (``APP_SHARES``).
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from otel_llm_simulate.clients import ClientCall, ProxyTimes
from otel_llm_simulate.emitters import RequestTiming, SamplingParams, dynamo_end_unix_ns, llmd_end_unix_ns

__all__ = [
    "APP_MEMBER",
    "APP_SHARES",
    "DEFAULT_MODELS",
    "ENGINE_KIND_LABELS",
    "PROVIDER_KINDS",
    "SUB_MEMBERS",
    "PROXY_MEMBER",
    "SCENARIOS",
    "ClientLeg",
    "FleetMember",
    "GatewayLeg",
    "ModelProfile",
    "Plan",
    "PlannedRequest",
    "Scenario",
    "plan",
    "select_models",
]

# Share of an engine's sequence slots busy at the provisioned rate: operators leave headroom.
TARGET_UTILIZATION: Final = 0.6
# A client that waited this long in the queue gives up (a gateway/client timeout): an abort.
# It also bounds every request's length, and with it how far back the warm-up has to start.
QUEUE_TIMEOUT_S: Final = 60.0
# Continuous batching: per-token decode (and chunked prefill) slows as the batch fills up.
DECODE_SLOWDOWN_AT_FULL_BATCH: Final = 0.5
PREFILL_SLOWDOWN_AT_FULL_BATCH: Final = 0.3
# Upper ends of the per-request jitter; ``max_e2e_s`` uses them to size the warm-up.
JITTER_MAX: Final = 1.2
TPOT_JITTER_MAX: Final = 1.15
GATEWAY_PRE_MAX_S: Final = 0.008
GATEWAY_POST_MAX_S: Final = 0.004
POSTPROCESS_MAX_S: Final = 0.002
PREPROCESS_BASE_S: Final = 0.0015  # API server request handling
PREPROCESS_PER_TOKEN_S: Final = 1.5e-6  # tokenizer
GATEWAY_ROUTE: Final = "/v1/chat/completions"
GATEWAY_MEMBER: Final = "gateway"
APP_MEMBER: Final = "app"
PROXY_MEMBER: Final = "litellm-proxy"

# The instrumented application tier, as shares of each kind of request (the rest keep their
# uninstrumented caller). Aborts never come from it: a caller that hangs up is not instrumented here.
APP_SHARES: Final[dict[str, float]] = {
    # vLLM requests the engine answered: app -> LiteLLM proxy -> vLLM (the proxy forwards the app's
    # traceparent), app -> vLLM, app -> gateway -> vLLM; all propagating.
    "vllm_via_litellm": 0.25,
    "vllm_direct": 0.15,
    "vllm_via_gateway": 0.10,
    # any other request through the gateway (SGLang, TGI, the gateway's own 5xx): app -> gateway.
    "other_via_gateway": 0.15,
    # successful direct SGLang requests from an app without HTTP instrumentation: no traceparent.
    "sglang_unpropagated": 0.40,
}

OUTCOMES: Final = ("stop", "length", "abort", "error")


# ---------------------------------------------------------------------------------------------
# Models and scenarios
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelProfile:
    """One served model: its engine, its traffic share and its latency/token profile."""

    name: str
    engine: str  # a key of ``ENGINE_KIND_LABELS``: which engine (and span shape) serves the model
    service_name: str  # OTEL_SERVICE_NAME / --otlp-service-name of the engine process
    process_id: int
    weight: float  # share of the traffic (renormalised over the selected models)
    prompt_median: int
    prompt_sigma: float  # log-normal sigma
    output_median: int
    output_sigma: float
    max_tokens: int  # the client's max_tokens; generating this many is finish reason "length"
    max_model_len: int
    prefill_tokens_per_s: float
    prefill_overhead_s: float
    tpot_s: float  # decode seconds per output token on an idle engine
    gateway_share: float  # fraction of requests that come through the gateway
    stream_share: float

    def mean_service_s(self, prompt_scale: float = 1.0, output_scale: float = 1.0) -> float:
        """Expected prefill + decode seconds at the target utilization (for provisioning)."""
        mean_prompt = min(self.prompt_median * prompt_scale * math.exp(self.prompt_sigma**2 / 2), self.max_model_len)
        mean_output = min(self.output_median * output_scale * math.exp(self.output_sigma**2 / 2), self.max_tokens)
        prefill = self.prefill_overhead_s + mean_prompt / self.prefill_tokens_per_s
        decode = max(mean_output - 1, 0) * self.tpot_s * (1 + DECODE_SLOWDOWN_AT_FULL_BATCH * TARGET_UTILIZATION)
        return prefill + decode


# The engines of the fleet (``ModelProfile.engine``) and the ``engine_kind`` label otel-llm gives their
# requests (a request with no engine span, an abort or an upstream failure only the gateway saw, is "genai").
ENGINE_KIND_LABELS: Final[dict[str, str]] = {
    "vllm-v1": "vllm",  # vLLM 0.33 ``llm_request``
    "vllm-next": "vllm",  # vLLM's coming ``{operation} {model}`` span with token events (vllm#47633, #32573)
    "sglang": "sglang",
    "tgi": "tgi",
    "triton": "triton",  # Triton with the TensorRT-LLM backend
    "triton-ensemble": "triton",  # the same behind a preprocessing/postprocessing ensemble: one request
    "trtllm": "trtllm",  # trtllm-serve
    "dynamo": "dynamo",  # NVIDIA Dynamo, prefill and decode on two workers: one request
    "llm-d": "llm-d",  # llm-d P/D: EPP, sidecar and two vLLM pods: one request
}
# The TracerProvider kind (``emitters.engine_tracer_provider``) of each engine's processes.
PROVIDER_KINDS: Final[dict[str, str]] = {
    "vllm-next": "vllm-v1", "triton-ensemble": "triton",
}
# Processes besides the model's own member (named "<model>/<role>"): (role, provider kind, service name).
SUB_MEMBERS: Final[dict[str, tuple[tuple[str, str, str], ...]]] = {
    "dynamo": (("prefill", "dynamo", "dynamo-prefill-worker"), ("decode", "dynamo", "dynamo-decode-worker")),
    "llm-d": (("sidecar", "llm-d", "llm-d-disagg-sidecar"), ("prefill", "vllm-v1", "vllm-pd-prefill"),
              ("decode", "vllm-v1", "vllm-pd-decode")),
}
DISAGGREGATED: Final = frozenset({"dynamo", "llm-d"})
KV_TRANSFER_S: Final = (0.002, 0.012)  # a disaggregated request's KV cache transfer (s)

# vLLM 0.33, TGI and trtllm-serve spans carry no model name, so those processes run with their service
# name set to the model they serve (docs/engines/vllm.md: the model label, as their own /metrics name it)
# and are reached through the gateway (its gen_ai.request.model is the request model), as in a real
# fleet; SGLang, vLLM's coming span, Triton (triton.model_name), Dynamo (model) and llm-d (target_model)
# name their model themselves. Those without traceparent handling in their emitter (Triton, Dynamo, llm-d:
# the EPP is the edge) are called directly.
DEFAULT_MODELS: Final[tuple[ModelProfile, ...]] = (
    ModelProfile(
        name="llama-3.1-8b-instruct", engine="vllm-v1", service_name="llama-3.1-8b-instruct", process_id=101,
        weight=0.4,
        prompt_median=700, prompt_sigma=0.9, output_median=220, output_sigma=0.8, max_tokens=1024,
        max_model_len=32768, prefill_tokens_per_s=14000.0, prefill_overhead_s=0.008, tpot_s=0.011,
        gateway_share=1.0, stream_share=0.8,
    ),
    ModelProfile(
        name="llama-3.1-70b-instruct", engine="vllm-v1", service_name="llama-3.1-70b-instruct", process_id=102,
        weight=0.2,
        prompt_median=900, prompt_sigma=0.9, output_median=260, output_sigma=0.8, max_tokens=1024,
        max_model_len=32768, prefill_tokens_per_s=3500.0, prefill_overhead_s=0.02, tpot_s=0.032,
        gateway_share=1.0, stream_share=0.8,
    ),
    ModelProfile(
        name="qwen2.5-7b-instruct", engine="sglang", service_name="sglang-qwen-7b", process_id=103, weight=0.25,
        prompt_median=500, prompt_sigma=1.0, output_median=150, output_sigma=0.9, max_tokens=512,
        max_model_len=32768, prefill_tokens_per_s=16000.0, prefill_overhead_s=0.006, tpot_s=0.009,
        gateway_share=0.5, stream_share=0.5,
    ),
    ModelProfile(
        name="mistral-7b-instruct", engine="tgi", service_name="mistral-7b-instruct", process_id=104, weight=0.15,
        prompt_median=400, prompt_sigma=0.8, output_median=120, output_sigma=0.8, max_tokens=512,
        max_model_len=8192, prefill_tokens_per_s=10000.0, prefill_overhead_s=0.01, tpot_s=0.014,
        gateway_share=1.0, stream_share=0.6,
    ),
    # Issue 14's engines: about a quarter of the traffic together.
    ModelProfile(
        name="qwen3-8b", engine="vllm-next", service_name="vllm-qwen3-8b", process_id=105, weight=0.08,
        prompt_median=600, prompt_sigma=0.9, output_median=60, output_sigma=0.6, max_tokens=512,
        max_model_len=32768, prefill_tokens_per_s=14000.0, prefill_overhead_s=0.008, tpot_s=0.010,
        gateway_share=0.5, stream_share=0.8,
    ),
    ModelProfile(  # Triton's model repository names: the TensorRT-LLM model itself ...
        name="tensorrt_llm", engine="triton", service_name="triton-trtllm", process_id=106, weight=0.06,
        prompt_median=600, prompt_sigma=0.8, output_median=180, output_sigma=0.8, max_tokens=1024,
        max_model_len=16384, prefill_tokens_per_s=20000.0, prefill_overhead_s=0.006, tpot_s=0.008,
        gateway_share=0.0, stream_share=1.0,  # decoupled (streaming) mode: TTFT from the first response
    ),
    ModelProfile(  # ... and the ensemble in front of it (preprocessing -> tensorrt_llm -> postprocessing)
        name="ensemble", engine="triton-ensemble", service_name="triton-ensemble", process_id=107, weight=0.04,
        prompt_median=600, prompt_sigma=0.8, output_median=180, output_sigma=0.8, max_tokens=1024,
        max_model_len=16384, prefill_tokens_per_s=20000.0, prefill_overhead_s=0.006, tpot_s=0.008,
        gateway_share=0.0, stream_share=1.0,
    ),
    ModelProfile(
        name="llama-3.1-8b-trtllm", engine="trtllm", service_name="llama-3.1-8b-trtllm", process_id=108, weight=0.06,
        prompt_median=700, prompt_sigma=0.9, output_median=200, output_sigma=0.8, max_tokens=1024,
        max_model_len=32768, prefill_tokens_per_s=18000.0, prefill_overhead_s=0.006, tpot_s=0.009,
        gateway_share=1.0, stream_share=0.8,
    ),
    ModelProfile(
        name="qwen3-32b", engine="dynamo", service_name="dynamo-frontend", process_id=109, weight=0.06,
        prompt_median=1200, prompt_sigma=0.9, output_median=240, output_sigma=0.8, max_tokens=1024,
        max_model_len=32768, prefill_tokens_per_s=6000.0, prefill_overhead_s=0.012, tpot_s=0.020,
        gateway_share=0.0, stream_share=0.8,
    ),
    ModelProfile(
        name="llama-3.3-70b-instruct", engine="llm-d", service_name="llm-d-epp", process_id=110, weight=0.05,
        prompt_median=1500, prompt_sigma=0.9, output_median=260, output_sigma=0.8, max_tokens=1024,
        max_model_len=32768, prefill_tokens_per_s=4000.0, prefill_overhead_s=0.02, tpot_s=0.030,
        gateway_share=0.0, stream_share=0.8,
    ),
)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    burst_window: tuple[float, float] | None = None  # fractions of the duration
    burst_multiplier: float = 1.0
    prompt_scale: float = 1.0
    output_scale: float = 1.0
    abort_share: float = 0.01  # clients that disconnect mid-request
    error_share: float = 0.005  # requests the engine (or the path to it) fails

    def rate_multiplier(self, fraction: float) -> float:
        if self.burst_window is not None and self.burst_window[0] <= fraction < self.burst_window[1]:
            return self.burst_multiplier
        return 1.0

    def boundaries(self) -> tuple[float, ...]:
        """Fractions of the duration where the rate changes (the Poisson process restarts there)."""
        return self.burst_window or ()


SCENARIOS: Final[dict[str, Scenario]] = {
    s.name: s
    for s in (
        Scenario("steady", "the provisioned rate all along; a few aborts and errors"),
        Scenario(
            "burst",
            "3x the rate from 30 % to 60 % of the window: queues build, TTFT climbs, then drains",
            burst_window=(0.3, 0.6),
            burst_multiplier=3.0,
        ),
        Scenario(
            "long-prompts",
            "RAG/summarisation traffic: 10x longer prompts, shorter answers; prefill and TTFT grow",
            prompt_scale=10.0,
            output_scale=0.6,
        ),
        Scenario("aborts", "25 % of clients disconnect mid-request: gateway spans with no engine span",
                 abort_share=0.25),
        Scenario("errors", "15 % of requests fail: engine/gateway spans with status ERROR", error_share=0.15),
    )
}


def select_models(
    names: Iterable[str] | None, available: Sequence[ModelProfile] = DEFAULT_MODELS
) -> tuple[ModelProfile, ...]:
    """The profiles named (in the fleet's order), or all of them; unknown names are an error."""
    if not names:
        return tuple(available)
    wanted = list(dict.fromkeys(names))
    by_name = {m.name: m for m in available}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
    return tuple(m for m in available if m.name in wanted)


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetMember:
    """One emitting process: the gateway or a model's engine, with its id-generator seed."""

    name: str  # model name (its engine's first process), "<model>/<role>" for its others, or "gateway"
    kind: str  # engine_tracer_provider kind
    service_name: str
    process_id: int
    id_seed: int
    engine: str = ""  # the model's ``ModelProfile.engine`` (empty for the callers)
    role: str = ""  # a model's further process: "prefill", "decode" (disaggregated workers), "sidecar"


@dataclass(frozen=True)
class GatewayLeg:
    """The gateway's SERVER span of a request."""

    start_ns: int
    end_ns: int
    ttft_s: float | None  # reported for successful streaming responses only
    status_error: bool


@dataclass(frozen=True)
class ClientLeg:
    """The application's call: what its openai-v2 CLIENT span records."""

    via: str  # "direct" (the engine), "litellm" (the LiteLLM proxy) or "gateway"
    propagates: bool  # httpx instrumented: the upstream receives the POST span's traceparent
    joined: bool  # one trace holds the client span and the engine span (propagated and the engine reported)
    call: ClientCall

    @property
    def duration_s(self) -> float:
        return self.call.duration_s


@dataclass(frozen=True)
class PlannedRequest:
    index: int  # arrival number in the simulated stream (warm-up included): a stable id
    model: str
    engine: str
    outcome: str  # ground truth: "stop" | "length" | "abort" | "error"
    request_id: str  # gen_ai.request.id (vLLM "chatcmpl-…", SGLang rid); "" for TGI, which has none
    stream: bool
    params: SamplingParams
    timing: RequestTiming | None  # the engine span's timing; None when the engine emits no span
    gateway: GatewayLeg | None  # None when the client called the engine directly
    queue_s: float  # time spent queued (also for requests that gave up while queued)
    send_at_ns: int  # when the request's last span ends: the runner sends it then
    client: ClientLeg | None = None  # the instrumented application's call, if it came from one
    proxy: ProxyTimes | None = None  # the LiteLLM proxy's spans (client.via == "litellm")
    kv_transfer_s: float = 0.0  # disaggregated engines (Dynamo, llm-d): the KV transfer between the workers

    @property
    def emits_engine_span(self) -> bool:
        return self.timing is not None

    @property
    def engine_kind(self) -> str:
        """The ``engine_kind`` otel-llm gives the request: its engine's, or "genai" when only the gateway saw it."""
        return ENGINE_KIND_LABELS[self.engine] if self.timing is not None else "genai"


@dataclass(frozen=True)
class Plan:
    scenario: str
    seed: int
    rate: float
    duration_s: float
    start_ns: int
    provisioned_rate: float
    slots: dict[str, int]  # model -> concurrent sequence slots
    members: tuple[FleetMember, ...]
    requests: tuple[PlannedRequest, ...]

    @property
    def end_ns(self) -> int:
        """When the last span ends (the run is over once it is sent)."""
        return max((r.send_at_ns for r in self.requests), default=self.start_ns)

    @property
    def window_end_ns(self) -> int:
        return self.start_ns + _ns(self.duration_s)

    def member(self, name: str) -> FleetMember:
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(name)

    def send_order(self) -> list[PlannedRequest]:
        return sorted(self.requests, key=lambda r: (r.send_at_ns, r.index))

    def counts(self) -> Counter[tuple[str, str, str]]:
        """Requests by (engine, model, outcome)."""
        return Counter((r.engine, r.model, r.outcome) for r in self.requests)

    def engine_kind_counts(self) -> Counter[str]:
        """Server-side requests by the ``engine_kind`` label otel-llm gives them (one per request)."""
        return Counter(r.engine_kind for r in self.requests)

    def client_legs(self) -> list[ClientLeg]:
        """Every application call (one CLIENT request each), in send order."""
        return [r.client for r in self.send_order() if r.client is not None]

    def traces(self) -> int:
        """Traces the run sends: one per request, plus one per client call that did not propagate."""
        return len(self.requests) + sum(1 for c in self.client_legs() if not c.propagates)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _member_seed(seed: int, scenario: str, name: str) -> int:
    # A stable function of its inputs (Python's hash() is salted per process, sha256 is not). The
    # scenario is part of it so that two scenarios run with one seed don't share trace ids.
    return int.from_bytes(hashlib.sha256(f"otel-llm-simulate/{seed}/{scenario}/{name}".encode()).digest()[:8], "big")


def _lognormal_int(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(rng.lognormvariate(math.log(median), sigma))))


def _arrivals(
    rng: random.Random, scenario: Scenario, rate: float, warmup_s: float, duration_s: float
) -> list[float]:
    """Poisson arrival offsets (s, from the window start; negative during the warm-up) with a
    piecewise-constant rate. Memorylessness lets the exponential draw restart at each rate change
    instead of thinning."""
    edges = sorted({-warmup_s, 0.0, duration_s, *(f * duration_s for f in scenario.boundaries())})
    out: list[float] = []
    for lo, hi in zip(edges, edges[1:], strict=False):
        segment_rate = rate * (scenario.rate_multiplier(lo / duration_s) if lo >= 0 else 1.0)
        t = lo
        while True:
            t += rng.expovariate(segment_rate)
            if t >= hi:
                break
            out.append(t)
    return out


def _truncate(t: RequestTiming, at_s: float) -> RequestTiming:
    """The engine's view of a request stopped ``at_s`` after its arrival (abort or failure).

    Each segment keeps only what ran before the cut; output tokens are those decoded by then.
    """
    left = max(at_s, 0.0)
    segments = []
    for length in (t.preprocess_s, t.queue_s, t.prefill_s, t.decode_s):
        done = min(length, left)
        segments.append(done)
        left -= done
    pre, queue, prefill, decode = segments
    if prefill < t.prefill_s:
        tokens = 0  # no first token yet
    elif t.decode_s > 0:
        tokens = 1 + math.floor((t.completion_tokens - 1) * decode / t.decode_s)
    else:
        tokens = t.completion_tokens
    return replace(t, preprocess_s=pre, queue_s=queue, prefill_s=prefill, decode_s=decode, postprocess_s=0.0,
                   completion_tokens=tokens)


@dataclass
class _Engine:
    """Queue state of one model's engine during planning."""

    profile: ModelProfile
    slots: int
    free_at: list[float] = field(default_factory=list)  # heap of slot-free times (s)

    def __post_init__(self) -> None:
        self.free_at = [-math.inf] * self.slots  # idle since forever: the warm-up starts empty


def _gen_id(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


def max_e2e_s(p: ModelProfile, sc: Scenario) -> float:
    """Upper bound of a request's gateway-to-last-span time under the formulas of ``_plan_request``."""
    pre = (PREPROCESS_BASE_S + p.max_model_len * PREPROCESS_PER_TOKEN_S) * JITTER_MAX
    prefill = (p.prefill_overhead_s + p.max_model_len / p.prefill_tokens_per_s) * (
        1 + PREFILL_SLOWDOWN_AT_FULL_BATCH) * JITTER_MAX
    decode = p.max_tokens * p.tpot_s * (1 + DECODE_SLOWDOWN_AT_FULL_BATCH) * TPOT_JITTER_MAX
    disaggregation = KV_TRANSFER_S[1] + 0.005 if p.engine in DISAGGREGATED else 0.0  # + llm-d's proxy hops
    return (GATEWAY_PRE_MAX_S + pre + QUEUE_TIMEOUT_S + prefill + decode + POSTPROCESS_MAX_S + GATEWAY_POST_MAX_S
            + disaggregation)


def plan(
    scenario: str | Scenario,
    *,
    seed: int,
    rate: float,
    duration_s: float,
    start_ns: int,
    models: Sequence[ModelProfile] = DEFAULT_MODELS,
    provisioned_rate: float | None = None,
    max_requests: int | None = None,
) -> Plan:
    """The run as data. Pure: equal arguments give equal plans; ``start_ns`` only shifts timestamps.

    The window ``[start, start + duration)`` is a slice of a fleet that was already running: arrivals
    start a warm-up before it (long enough that a request arriving earlier has surely finished), the
    queues evolve from then on, and the plan keeps exactly the requests whose last span ends inside
    the window. So a run lasts ``duration`` and not a second more, the queues are in their steady
    state when it starts, and a request is never cut off by the window's edge while being sent.
    ``max_requests`` keeps only the first that many, by send time.
    """
    sc = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    if not (rate > 0 and duration_s > 0):
        raise ValueError("rate and duration must be positive")
    if not models:
        raise ValueError("no models selected")
    provisioned = rate if provisioned_rate is None else provisioned_rate
    if not provisioned > 0:
        raise ValueError("the provisioned rate must be positive")
    total_weight = sum(m.weight for m in models)
    shares = [m.weight / total_weight for m in models]

    # Capacity is sized for steady traffic at the provisioned rate; the scenario's own load
    # (bursts, longer prompts) then pushes against it.
    engines = {
        m.name: _Engine(m, max(1, math.ceil(provisioned * share * m.mean_service_s() / TARGET_UTILIZATION)))
        for m, share in zip(models, shares, strict=True)
    }
    members = [FleetMember(GATEWAY_MEMBER, "gateway", "llm-gateway", 100, _member_seed(seed, sc.name, GATEWAY_MEMBER)),
               FleetMember(APP_MEMBER, "app", "chat-app", 200, _member_seed(seed, sc.name, APP_MEMBER)),
               FleetMember(PROXY_MEMBER, "litellm-proxy", "litellm-proxy", 300,
                           _member_seed(seed, sc.name, PROXY_MEMBER))]
    for m in models:
        members.append(FleetMember(m.name, PROVIDER_KINDS.get(m.engine, m.engine), m.service_name, m.process_id,
                                   _member_seed(seed, sc.name, m.name), engine=m.engine))
        for number, (role, kind, service) in enumerate(SUB_MEMBERS.get(m.engine, ()), start=1):
            name = f"{m.name}/{role}"
            members.append(FleetMember(name, kind, service, m.process_id * 10 + number,
                                       _member_seed(seed, sc.name, name), engine=m.engine, role=role))

    warmup_s = max(max_e2e_s(m, sc) for m in models)
    window_end_ns = start_ns + _ns(duration_s)
    rng = random.Random(f"otel-llm-simulate/{seed}/{sc.name}")
    kept: list[PlannedRequest] = []
    for index, arrival in enumerate(_arrivals(rng, sc, rate, warmup_s, duration_s)):
        profile = rng.choices(models, weights=shares)[0]
        request = _plan_request(rng, sc, engines[profile.name], index, arrival, start_ns)
        # Its own generator: who calls never shifts the draws of the engine side.
        request = _with_caller(random.Random(f"otel-llm-simulate/{seed}/{sc.name}/caller/{index}"), request, profile)
        if start_ns <= request.send_at_ns < window_end_ns:
            kept.append(request)
    kept.sort(key=lambda r: (r.send_at_ns, r.index))
    if max_requests is not None:
        kept = kept[:max_requests]
    return Plan(
        scenario=sc.name,
        seed=seed,
        rate=rate,
        duration_s=duration_s,
        start_ns=start_ns,
        provisioned_rate=provisioned,
        slots={name: e.slots for name, e in engines.items()},
        members=tuple(members),
        requests=tuple(kept),
    )


def _plan_request(
    rng: random.Random, sc: Scenario, engine: _Engine, index: int, arrival_s: float, start_ns: int
) -> PlannedRequest:
    p = engine.profile
    # --- what the client asks for -----------------------------------------------------------
    completion_cap = p.max_tokens
    prompt = _lognormal_int(rng, p.prompt_median * sc.prompt_scale, p.prompt_sigma, 1, p.max_model_len - completion_cap)
    wanted = _lognormal_int(rng, p.output_median * sc.output_scale, p.output_sigma, 1, 10 * completion_cap)
    completion = min(wanted, completion_cap)
    finish = "length" if wanted >= completion_cap else "stop"
    via_gateway = rng.random() < p.gateway_share
    stream = rng.random() < p.stream_share
    params = SamplingParams(
        max_tokens=p.max_tokens,
        temperature=rng.choice((0.0, 0.2, 0.7, 1.0)),  # 0.0 is common, and vLLM/SGLang then omit it
        top_p=rng.choice((1.0, 0.95, 0.9)),
        n=1,
    )
    fate = rng.random()
    patience = rng.uniform(0.05, 1.0)  # where in the request an abort/failure strikes
    if p.engine == "sglang":
        request_id = _gen_id(rng)  # SGLang's rid is uuid4().hex
    elif p.engine.startswith("vllm") or p.engine == "trtllm":
        request_id = f"chatcmpl-{_gen_id(rng)}"  # vLLM's (and trtllm-serve's) OpenAI server: the client-visible id
    else:
        request_id = ""  # TGI, Triton, Dynamo and llm-d put none on the spans otel-llm reads
    # A disaggregated request's KV transfer (its own draw: the other engines' draws stay as they were).
    kv_transfer_s = rng.uniform(*KV_TRANSFER_S) if p.engine in DISAGGREGATED else 0.0

    # --- the engine's timeline (seconds from the window start) --------------------------------
    gateway_pre = rng.uniform(0.002, GATEWAY_PRE_MAX_S) if via_gateway else 0.0  # auth, routing, connect
    gateway_post = rng.uniform(0.001, GATEWAY_POST_MAX_S)
    engine_arrival = arrival_s + gateway_pre
    preprocess = (PREPROCESS_BASE_S + prompt * PREPROCESS_PER_TOKEN_S) * rng.uniform(0.8, JITTER_MAX)
    queued_at = engine_arrival + preprocess
    free = heapq.heappop(engine.free_at)
    start = max(queued_at, free)
    queue = start - queued_at
    busy = sum(1 for f in engine.free_at if f > start) / engine.slots  # the other sequences in the batch
    prefill = (p.prefill_overhead_s + prompt / p.prefill_tokens_per_s) * (
        1 + PREFILL_SLOWDOWN_AT_FULL_BATCH * busy) * rng.uniform(0.9, JITTER_MAX)
    tpot = p.tpot_s * (1 + DECODE_SLOWDOWN_AT_FULL_BATCH * busy) * rng.uniform(0.9, TPOT_JITTER_MAX)
    decode = (completion - 1) * tpot  # the first token comes out of prefill
    postprocess = rng.uniform(0.0003, POSTPROCESS_MAX_S)
    full = RequestTiming(
        arrival_unix_ns=start_ns + _ns(engine_arrival),
        preprocess_s=preprocess,
        queue_s=queue,
        prefill_s=prefill,
        decode_s=decode,
        postprocess_s=postprocess,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )

    # --- how it ends ------------------------------------------------------------------------
    if queue > QUEUE_TIMEOUT_S:
        outcome, cut_s = "abort", preprocess + QUEUE_TIMEOUT_S  # the client timed out in the queue
    elif fate < sc.abort_share:
        outcome, cut_s = "abort", patience * full.e2e_s
    elif fate < sc.abort_share + sc.error_share:
        outcome, cut_s = "error", patience * full.e2e_s
    else:
        outcome, cut_s = finish, full.e2e_s

    timing: RequestTiming | None = full
    if outcome in ("abort", "error"):
        # The slot is busy until the engine stops working on the request (not at all if it was
        # still queued), so aborts and failures relieve the queue as they do in reality.
        stopped_at = engine_arrival + cut_s
        heapq.heappush(engine.free_at, stopped_at if stopped_at > start else free)
        cut = _truncate(full, cut_s)
        if outcome == "abort":
            # vLLM's abort path emits no span, nor does TGI for a dropped request: only the gateway
            # saw it. SGLang ends an aborted request's trace with finish reason "abort".
            timing = cut if p.engine == "sglang" else None
        else:
            # TGI records the failure on its handler span (status ERROR); vLLM/SGLang behind a
            # failing upstream leave only the gateway's 5xx span.
            timing = cut if p.engine == "tgi" else None
        if timing is None:
            via_gateway = True  # nobody else could report it: the gateway is the witness
        queue = cut.queue_s
    else:
        heapq.heappush(engine.free_at, start + prefill + decode)

    gateway: GatewayLeg | None = None
    if via_gateway:
        gw_start = start_ns + _ns(arrival_s)
        if timing is not None:
            gw_end = timing.end_unix_ns + _ns(gateway_post)
        elif outcome == "abort":  # the client hung up: the gateway span ends then
            gw_end = gw_start + _ns(gateway_pre + cut_s)
        else:  # an upstream failure: the gateway answers 5xx when it notices
            gw_end = gw_start + _ns(gateway_pre + cut_s + gateway_post)
        ttft = None
        if stream and outcome in ("stop", "length"):
            ttft = gateway_pre + full.ttft_s + rng.uniform(0.0005, 0.002)  # first chunk back through the proxy
        gateway = GatewayLeg(gw_start, gw_end, ttft, status_error=outcome == "error")
    if gateway is not None:
        send_at = gateway.end_ns
    else:
        assert timing is not None  # a request with neither span is impossible by construction
        send_at = engine_end_ns(p.engine, timing, kv_transfer_s)
    return PlannedRequest(
        index=index,
        model=p.name,
        engine=p.engine,
        outcome=outcome,
        request_id=request_id,
        stream=stream,
        params=params,
        timing=timing,
        gateway=gateway,
        queue_s=queue,
        send_at_ns=send_at,
        kv_transfer_s=kv_transfer_s,
    )


def engine_end_ns(engine: str, timing: RequestTiming, kv_transfer_s: float) -> int:
    """When the engine's last span ends: the disaggregated engines add the KV transfer to ``timing``."""
    if engine == "dynamo":
        return dynamo_end_unix_ns(timing, kv_transfer_s)
    if engine == "llm-d":
        return llmd_end_unix_ns(timing, kv_transfer_s)
    return timing.end_unix_ns


# ---------------------------------------------------------------------------------------------
# Who calls
# ---------------------------------------------------------------------------------------------

_NET_S: Final = (0.0003, 0.002)  # one way between two hosts of the fleet


def _uniform_ns(rng: random.Random, bounds: tuple[float, float]) -> int:
    return _ns(rng.uniform(*bounds))


def _proxy_times(rng: random.Random, t: RequestTiming, stream: bool) -> ProxyTimes:
    """The LiteLLM proxy's spans around the engine's interval, in the order ``litellm_proxy_v1`` shows:
    FastAPI's SERVER span outermost, then "Received Proxy Server Request", auth, proxy_pre_call, the
    router, litellm_request, and "self" around the upstream HTTP call."""
    engine_start, engine_end = t.arrival_unix_ns, t.end_unix_ns
    self_start = engine_start - _uniform_ns(rng, _NET_S)
    request_start = self_start - _uniform_ns(rng, (0.002, 0.02))  # param mapping, callbacks
    deployment_start = request_start - _uniform_ns(rng, (0.0015, 0.004))
    deployment = (deployment_start, deployment_start + _uniform_ns(rng, (0.0003, 0.0012)))
    router_start = deployment_start - _uniform_ns(rng, (0.0003, 0.001))
    pre_call_start = router_start - _uniform_ns(rng, (0.001, 0.003))
    auth_end = pre_call_start - _uniform_ns(rng, (0.0005, 0.02))
    received_start = auth_end - _uniform_ns(rng, (0.0008, 0.01))
    server_start = received_start - _uniform_ns(rng, (0.0002, 0.004))
    back = _uniform_ns(rng, _NET_S)
    # "self" is the HTTP call: until the body for a plain response, until the headers for a stream.
    self_end = engine_start + _ns(t.preprocess_s) + back if stream else engine_end + back
    request_end = max(self_end, engine_end + back) + _uniform_ns(rng, (0.0003, 0.003))
    router_end = request_end + _uniform_ns(rng, (0.0002, 0.003))
    server_end = router_end + _uniform_ns(rng, (0.0005, 0.004))
    return ProxyTimes(
        server=(server_start, server_end), received=(received_start, request_end), auth=(received_start, auth_end),
        pre_call=(pre_call_start, pre_call_start + 60_000), router=(router_start, router_end), deployment=deployment,
        request=(request_start, request_end), self_call=(self_start, self_end))


def _with_caller(rng: random.Random, r: PlannedRequest, profile: ModelProfile) -> PlannedRequest:
    """``r`` as called by the application tier (``APP_SHARES``), or unchanged."""
    if r.outcome == "abort":
        return r
    t = r.timing
    draw = rng.random()
    propagates = True
    if r.engine.startswith("vllm") and t is not None:
        edges = (APP_SHARES["vllm_via_litellm"], APP_SHARES["vllm_via_litellm"] + APP_SHARES["vllm_direct"],
                 APP_SHARES["vllm_via_litellm"] + APP_SHARES["vllm_direct"] + APP_SHARES["vllm_via_gateway"])
        if draw < edges[0]:
            via = "litellm"
        elif draw < edges[1]:
            via = "direct"
        elif draw < edges[2] and r.gateway is not None:
            via = "gateway"
        else:
            return r
    elif r.gateway is not None:
        if draw >= APP_SHARES["other_via_gateway"]:
            return r
        via = "gateway"
    elif (r.engine == "sglang" and t is not None and r.outcome in ("stop", "length")
          and draw < APP_SHARES["sglang_unpropagated"]):
        via, propagates = "direct", False
    else:
        return r

    ok = r.outcome in ("stop", "length")
    proxy: ProxyTimes | None = None
    gateway = r.gateway
    headers_at: int | None = None  # when the upstream's response headers leave it (streams)
    if via == "litellm":
        assert t is not None
        proxy = _proxy_times(rng, t, r.stream)
        gateway = None
        up_start, up_end = proxy.server
        headers_at = proxy.self_call[1] + _uniform_ns(rng, (0.0002, 0.001))
        url = "http://litellm-proxy:4000/v1/chat/completions"
    elif via == "gateway":
        assert gateway is not None
        up_start, up_end = gateway.start_ns, gateway.end_ns
        if t is not None:
            headers_at = t.arrival_unix_ns + _ns(t.preprocess_s) + _uniform_ns(rng, (0.0002, 0.001))
        url = "http://llm-gateway:4000/v1/chat/completions"
    else:
        assert t is not None
        gateway = None
        up_start, up_end = t.arrival_unix_ns, t.end_unix_ns
        headers_at = t.arrival_unix_ns + _ns(t.preprocess_s)
        url = f"http://{profile.service_name}:8000/v1/chat/completions"

    http_start = up_start - _uniform_ns(rng, _NET_S)
    start = http_start - _uniform_ns(rng, (0.0005, 0.004))  # the SDK builds the request
    back = _uniform_ns(rng, _NET_S)
    end_of_body = up_end + back
    http_end = min(headers_at, up_end) + back if (r.stream and ok and headers_at is not None) else end_of_body
    end = end_of_body + _uniform_ns(rng, (0.0003, 0.003))  # the SDK parses / the stream is consumed
    call = ClientCall(
        start_ns=start, end_ns=end, http_start_ns=http_start, http_end_ns=http_end, request_model=profile.name,
        stream=r.stream, params=r.params, url=url, http_status=200 if ok else 500,
        response_model=profile.name if ok else None,
        response_id=(r.request_id or None) if ok else None,
        input_tokens=t.prompt_tokens if ok and t is not None else None,
        output_tokens=t.completion_tokens if ok and t is not None else None,
        finish_reason=r.outcome if ok else None,
    )
    client = ClientLeg(via=via, propagates=propagates, joined=propagates and t is not None, call=call)
    # The application's span ends last: its end is the request's send time.
    return replace(r, gateway=gateway, client=client, proxy=proxy, send_at_ns=end)
